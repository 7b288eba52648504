"""The CLI's start: `sandlock run -- /bin/true` through the C client and a warm CLI
service, cold (no service yet), and in-process (`python -P -m sandlock`), beside bare
execution, `python3 -c pass`, bubblewrap and upstream's Python one-shot; `net-run` warm;
and warm with another command each call (echo, printf, ls in turn), as an agent's calls
mostly come.

Every peer is a fresh process started by this script with subprocess.run (stdin from
/dev/null, output captured: as an agent runs a command), timed from start to exit; peers
are interleaved round by round, the first rotating. "cold" stops the service (untimed)
before each of its samples, so each one falls back to the in-process CLI and starts a
service in the background; the peers after it find the service warm again (_warm: its
spares warmed up and building the last call's sandbox ahead, as an agent's repeated calls
find it). The service runs from a private $XDG_RUNTIME_DIR, the calls from this
script's working directory. Each sample starts PAUSE after the last one ended, for every
peer: after a call the service replaces the child that served it, which warms up and
builds the next sandbox ahead (~20-40 ms of CPU on this 2-core VM in a slow hour), which
an agent's calls, seconds apart, never wait for; back to back, a warm call waits for it
(~10 ms instead of ~6), and with 50 ms pauses (before 2026-12-06) a slow hour's net-run
met the other service's replacement at work (15 ms against 8.5 alone).
Ours run with the CLI's default policy (system directories read-only, the user's files
protected); upstream's one-shot with its API's (the same paths readable).

    python bench/cli.py [--quick]
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

from harness import ROOT, UPSTREAM_PY, WORKER, rotations, stats

NAME = "cli"
CLIENT = str(ROOT / ".venv" / "bin" / "sandlock")
PYTHON = str(ROOT / ".venv" / "bin" / "python")
SYSTEM = ["/usr", "/lib", "/lib64", "/bin", "/etc"]


def _peers(env):
    up = [str(UPSTREAM_PY), "-I", str(WORKER), "run", "--no-system"]
    for p in SYSTEM:
        up += ["-r", p]
    peers = {
        "bare": (["/bin/true"], None),
        "python3 -c pass": ([sys.executable if not os.path.exists("/usr/bin/python3")
                             else "/usr/bin/python3", "-c", "pass"], None),
        "bwrap": (["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent",
                   "/bin/true"], None) if shutil.which("bwrap") else None,
        "ours: service warm": ([CLIENT, "run", "--", "/bin/true"], None),
        "ours: net-run, service warm": ([CLIENT, "net-run", "--", "/bin/true"], "net"),
        # As an agent's calls mostly are: each another command than the one before (its
        # own service: the sandbox built ahead is always the previous command's).
        "ours: service warm, another command each call": (None, "another"),
        "ours: in-process CLI": ([PYTHON, "-P", "-m", "sandlock", "run", "--", "/bin/true"],
                                 None),
        "ours: cold (no service yet)": ([CLIENT, "run", "--", "/bin/true"], "cold"),
        "upstream: Python one-shot": ([*up, "--", "/bin/true"], None)
        if os.path.exists(str(UPSTREAM_PY)) else None,
    }
    return {k: v for k, v in peers.items() if v is not None}


def _stop(env):
    subprocess.run([PYTHON, "-P", "-m", "sandlock", "service", "stop"], env=env,
                   capture_output=True, timeout=30)
    sock = os.path.join(env["XDG_RUNTIME_DIR"], "sandlock", "service.sock")
    deadline = time.monotonic() + 10
    while os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.01)


def _warm(env, sub="run"):
    """Until the service is in its steady state, as an agent's repeated calls find it:
    it serves, its spares have warmed up, and they build the last call's sandbox ahead
    (a call got one). A service just started is "cold" (its own peer), not "warm"."""
    for _ in range(100):
        r = subprocess.run([CLIENT, sub, "--", "/bin/true"], capture_output=True,
                           text=True, stdin=subprocess.DEVNULL,
                           env=dict(env, SANDLOCK_SERVICE_DEBUG="1"))
        if "prepared sandbox used" in r.stderr:
            time.sleep(0.2)  # the spare that served is replaced, and prepares too
            return
        time.sleep(0.1)
    raise RuntimeError("cli: the service never answered with a sandbox built ahead")


PAUSE = 0.15  # s before each sample: an agent's calls are seconds apart (see the docstring)


ANOTHER = [["/bin/echo", "-n"], ["/usr/bin/printf", ""], ["/bin/ls", "/dev/null"]]


def _once(argv, env):
    time.sleep(PAUSE)
    t0 = time.perf_counter_ns()
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env)
    ns = time.perf_counter_ns() - t0
    if r.returncode != 0:
        raise RuntimeError(f"cli: {argv[:3]} failed: {r.stderr[-300:]!r}")
    return ns


def run(rounds=100, quick=False, log=lambda s: print(s, file=sys.stderr)):
    if quick:
        rounds = 20
    xdg = tempfile.mkdtemp(prefix="sandlock-bench-cli-")
    env = dict(os.environ, XDG_RUNTIME_DIR=xdg)
    env.pop("SANDLOCK_SERVICE", None)
    # net-run's calls go to a service of their own: a service builds the last call's
    # sandbox ahead, and the run and net-run peers alternate (as two agents would).
    xdg_net = tempfile.mkdtemp(prefix="sandlock-bench-cli-net-")
    env_net = dict(env, XDG_RUNTIME_DIR=xdg_net)
    xdg_other = tempfile.mkdtemp(prefix="sandlock-bench-cli-other-")
    env_other = dict(env, XDG_RUNTIME_DIR=xdg_other)
    turn = 0

    def another():
        nonlocal turn
        turn += 1
        return [CLIENT, "run", "--", *ANOTHER[turn % len(ANOTHER)]]
    peers = _peers(env)
    samples = {name: [] for name in peers}
    try:
        _warm(env)
        _warm(env_net, "net-run")
        _warm(env_other)
        for name, (argv, kind) in peers.items():  # each works before timing
            if kind == "another":
                for _ in ANOTHER:
                    _once(another(), env_other)
            else:
                _once(argv, env_net if kind == "net" else env)
        _warm(env)
        _warm(env_net, "net-run")
        for i, order in enumerate(rotations(list(peers), rounds)):
            for name in order:
                argv, kind = peers[name]
                if kind == "net":
                    samples[name].append(_once(argv, env_net))
                elif kind == "another":
                    samples[name].append(_once(another(), env_other))
                elif kind == "cold":
                    _stop(env)
                    samples[name].append(_once(argv, env))
                    _warm(env)  # the next peers find a warm service again
                else:
                    samples[name].append(_once(argv, env))
            if (i + 1) % 10 == 0:
                log(f"  cli: {i + 1}/{rounds} rounds")
    finally:
        _stop(env)
        _stop(env_net)
        _stop(env_other)
        for d in (xdg, xdg_net, xdg_other):
            shutil.rmtree(d, ignore_errors=True)
    return {"name": NAME, "rounds": rounds,
            "stats": {n: stats(v) for n, v in samples.items()}}


def markdown(result):
    st = result["stats"]
    bare = st["bare"]["median"]
    out = ["## CLI start", "",
           f"`sandlock run -- /bin/true` as an agent runs it (a fresh process per call, "
           f"stdin from /dev/null, output captured), {result['rounds']} interleaved rounds.",
           "", "| peer | median ms | p99 ms | vs bare | vs `python3 -c pass` |",
           "|---|---:|---:|---:|---:|"]
    py = st.get("python3 -c pass", {}).get("median")
    for name, s in st.items():
        vs_py = f"{s['median'] / py:.2f}x" if py else ""
        out.append(f"| {name} | {s['median']:.2f} | {s['p99']:.2f} | "
                   f"{s['median'] / bare:.1f}x | {vs_py} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    from harness import main
    main(__doc__, run, markdown)
