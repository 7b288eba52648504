"""The suite again, started by an unprivileged user (uid 65534): no root is needed.

What runs again is every test whose mechanism behaves differently without root (UNPRIVILEGED
below: Landlock and seccomp without CAP_SYS_ADMIN, user and mount namespaces for the overlay
workspace and the user-file protection, ptrace and pidfds on one's own processes, the root's
signals and /proc reads, the terminal, the demo and the examples as a user runs them, the
workspace through test_workflows' runs on both backends: without root the supervisor has no
capability past the modes a sandbox sets on its own files), minus a few long trials of
mechanisms that do not (DESELECTED: the supervisor deciding alone, a commit run outside any
sandbox, races and packaging runs that exercise nothing privilege changes, the service's
decisions that no uid changes) and the files whose mechanisms do not (test_cow's general
guarantees, COW fork, the C connect fast path, the container profile: they run as root).
CI's 10 minutes hold this subset, started as soon as the suite is collected so that it runs
beside the root suite (conftest.py; tests that look at what the host shares, such as
/dev/shm or the process list, look at their own uid's or tag's only);
SANDLOCK_UNPRIVILEGED_TESTS="tests" reruns everything (as long as the root suite again).

Runs only when the suite itself runs as root. The package, the tests and the pure-Python
dependencies are copied to a world-readable directory (the checkout may live under a
directory such as /root that the unprivileged user cannot enter), and the suite runs with
the system python3 under `setpriv` with every capability dropped.
"""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import dns.resolver  # noqa: F401  (loaded so that the nested run gets a copy)
import dns.rrset  # noqa: F401
import h11  # noqa: F401  (the HTTP filter imports it lazily)
import hypothesis  # noqa: F401
import pyseccomp  # noqa: F401
import trustme  # noqa: F401
import yaml  # noqa: F401
import pytest

from conftest import IS_ROOT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _site_packages_in_use() -> set[str]:
    """Top-level modules this very pytest process loaded from site-packages: exactly what
    the nested run needs (pytest and its plugins, pyseccomp, ...)."""
    names = set()
    for name, mod in list(sys.modules.items()):
        origin = getattr(mod, "__file__", None) or ""
        if "site-packages" in origin and "." not in name and name not in ("sandlock",):
            names.add(name)
    return names

# Two shards, run at once (each waits more than it computes: the run was ~57% of one core
# alone); each has its own HOME, XDG_RUNTIME_DIR and basetemp. The CLI's and the service's
# tests share one shard: a service is per user and runtime directory.
SHARDS = [" ".join(f"tests/{name}" for name in files) for files in (
    ("test_caps.py", "test_errors.py", "test_examples.py", "test_fs.py", "test_hardening.py",
     "test_metadata.py", "test_net_scopes.py", "test_net_supervisor.py", "test_policy_fn.py",
     "test_setid.py", "test_syscalls.py", "test_terminal.py",
     "test_explain.py::test_refused_reads_and_writes_are_explained_and_the_suggestion_works",
     "test_cli_polish.py::test_the_demo_removes_what_it_created", "test_service.py"),
    ("test_limits.py", "test_process.py", "test_upstream_api.py", "test_user_files.py",
     "test_user_files_attacks.py", "test_workflows.py"))]
UNPRIVILEGED = " ".join(SHARDS)
DESELECTED = " and ".join(f"not {name}" for name in (
    "test_commit_killed_at_random_points", "test_many_spread_out_exits",
    "test_no_hang_under_denied_execs", "test_short_lived_children_are_charged",
    "test_max_cpu_holds", "test_a_fork_tree_racing", "test_the_cli_test_files_pass",
    "(test_workflow and npm)", "test_no_open_outlives_its_killed_caller",
    "(test_a_symlink_swapped_in_under_a_waiting_open and landlock)",
    # the service's decisions that no uid changes (~45 s): when a build ahead is stale or
    # may serve another command, parked starts and spares, clients and supervisors that
    # die or stall, fallbacks. What the uid changes stays: who may use the socket, the
    # caller's attributes and limits, the toolchains and TMPDIR of a user's own HOME
    "test_a_sandbox_built_ahead_outlives_changes_beside_what_it_read",
    "test_a_spare_builds_again_what_changed_while_it_waited",
    "test_a_killed_supervisor_ends_the_sandbox", "test_a_sandbox_cannot_tie_up_the_service",
    "test_the_spare_a_call_used_is_replaced", "test_a_client_whose_go_never_comes",
    "test_a_net_run_whose_go_never_comes",
    "test_a_service_killed_outright", "test_a_prepared_sandbox_is_used_only_while",
    "test_a_prepared_sandbox_follows_the_command_s_toolchain",
    "test_another_command_takes_a_sandbox_built_ahead",
    "test_a_sandbox_built_ahead_sees_what_a_path_through_dotdot",
    "test_pipe_stages_skip_a_parked_start", "test_a_caller_that_ignores_sigchld",
    "test_a_padded_git_config", "test_one_directory_reached_by_another_path",
    "test_a_fifo_where_the_build_reads",
    # signals ending a run: the CLI's and the relay's handling, the same for every uid
    "test_a_hangup_ends_a_net_run", "test_sigterm_then_sighup_end_the_run_once",
    "test_a_signal_during_the_workspace_commit",
    # own unix sockets' socket states and the look's bounds: the same for every uid (who
    # may read the fds of whom stays: test_a_sandbox_connects_to_its_own_unix_socket...)
    "test_a_connection_accepted_from_a_host_socket", "test_looking_for_an_own_socket"))

pytestmark = pytest.mark.skipif(not IS_ROOT or os.environ.get("SANDLOCK_NESTED_UNPRIVILEGED"),
                                reason="runs the suite as uid 65534; needs to start as root")


def _copy_module(name: str, dest: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return
    if spec.submodule_search_locations:
        src = list(spec.submodule_search_locations)[0]
        shutil.copytree(src, os.path.join(dest, name), ignore=shutil.ignore_patterns(
            "__pycache__"), dirs_exist_ok=True)
    else:
        shutil.copy(spec.origin, dest)


_started: dict = {}  # the run begun at collection (start_early), until the test collects it


def start_early() -> None:
    """Starts the unprivileged run as soon as the suite is collected (conftest.py), so that
    it overlaps the root suite, which leaves most of the second core idle; the test below
    then only collects its result (~100 s it no longer adds). Nothing if this test would
    be skipped."""
    if IS_ROOT and not os.environ.get("SANDLOCK_NESTED_UNPRIVILEGED") and not _started:
        try:
            _started.update(_start())
        except Exception as e:  # the test's failure to report, not the session's
            _started["error"] = e


def stop_early() -> None:
    """At the session's end: a run the test never collected (the suite stopped first)."""
    if "runs" in _started:
        _finish(_started["runs"], _started["dir"])
    _started.clear()


def _finish(runs: list, public: pathlib.Path) -> None:
    for run in runs:
        if run.poll() is None:
            run.kill()
            run.wait()
    shutil.rmtree(public, ignore_errors=True)


def _start() -> dict:
    python = shutil.which("python3", path="/usr/bin:/bin")
    setpriv = shutil.which("setpriv")
    assert python and setpriv, "needs /usr/bin/python3 and setpriv (util-linux)"
    public = pathlib.Path(tempfile.mkdtemp(prefix="sandlock-unpriv-"))
    os.chmod(public, 0o755)
    work = public / "unpriv"
    site = work / "site"
    site.mkdir(parents=True)
    for package in ("sandlock", "netpolicy", "policies", "examples"):
        shutil.copytree(os.path.join(ROOT, package), work / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(ROOT, "tests"), work / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in _site_packages_in_use():
        _copy_module(name, str(site))
    for dirpath, dirnames, filenames in os.walk(public):
        os.chmod(dirpath, 0o755)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": f"{work}:{site}",
           "SANDLOCK_NESTED_UNPRIVILEGED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    chosen = os.environ.get("SANDLOCK_UNPRIVILEGED_TESTS")
    runs = []
    for i, tests in enumerate([chosen] if chosen else SHARDS):
        # Beside the shards' working directory, not in it: a run or net-run there with
        # its cwd writable scans the grant's repositories, and found the other shard's
        # (a planted 1 MB git config refused the grant).
        for own in ("tmp", "home", "run"):
            (public / f"{own}{i}").mkdir(mode=0o700)
            os.chown(public / f"{own}{i}", 65534, 65534)
        # niced: where both runs want both cores, the root suite's timed trials go first
        cmd = ["nice", "-n", "10", setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
               "--inh-caps=-all", "--bounding-set=-all", "--",
               python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
               f"--basetemp={public}/tmp{i}/t"]
        cmd += tests.split() if chosen else ["-k", DESELECTED, *tests.split()]
        with open(work / f"out{i}", "w") as out:  # files: a full pipe would stall a shard
            runs.append(subprocess.Popen(cmd, cwd=work, stdout=out, stderr=subprocess.STDOUT,
                                         env=dict(env, HOME=str(public / f"home{i}"),
                                                  XDG_RUNTIME_DIR=str(public / f"run{i}"))))
    return {"runs": runs, "dir": public, "work": work, "started": time.monotonic()}


def test_suite_passes_unprivileged():
    start_early()  # a no-op when it started at collection
    run_state = dict(_started)
    _started.clear()
    if "error" in run_state:
        raise run_state["error"]
    runs, public, work = run_state["runs"], run_state["dir"], run_state["work"]
    try:
        deadline = run_state["started"] + 600
        for run in runs:
            run.wait(timeout=max(deadline - time.monotonic(), 0.1))
        outs = [(work / f"out{i}").read_text() for i in range(len(runs))]
    finally:
        _finish(runs, public)
    for i, run in enumerate(runs):
        out = outs[i]
        sys.stdout.write(out[-3000:])
        assert run.returncode == 0, out[-7000:]
        assert " passed" in out and " failed" not in out
