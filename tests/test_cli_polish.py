"""The command line as a person meets it: --version, errors that name what they typed,
the closest valid option, every error of a policy file at once, pipe --pipefail, shell
completion in bash, zsh and fish, --help with examples, and a demo that cleans up."""

import os
import shutil
import subprocess
import sys

import pytest

import sandlock
from conftest import CLI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SANDLOCK = CLI  # in-process, or through the CLI service (conftest)


def cli(*args, **kw):
    return subprocess.run(SANDLOCK + list(args), capture_output=True, text=True, timeout=60,
                          **kw)


def test_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout == f"sandlock {sandlock.__version__}\n"


def test_errors_name_the_flag_the_user_typed(tmp_path):
    marker = tmp_path / "ran"
    r = cli("run", "-r", "/no/such/dir", "--", "touch", str(marker))
    assert r.returncode == 125 and not marker.exists()
    assert r.stderr == "sandlock: error: -r/--fs-read /no/such/dir: does not exist\n"
    r = cli("run", "--allow", "bad::spec", "--", "touch", str(marker))
    assert r.returncode == 125 and r.stderr.startswith("sandlock: error: --allow 'bad::spec'")
    assert "net_allow" not in r.stderr and not marker.exists()
    r = cli("run", "--net-allow-bind", "99999", "--", "touch", str(marker))
    assert "--net-allow-bind '99999': port 99999 is outside 1-65535" in r.stderr
    r = cli("run", "-w", str(tmp_path), "--", "touch", str(marker))  # the control
    assert r.returncode == 0 and marker.exists()


def test_a_nonexistent_fs_deny_is_an_error_that_says_what_to_do(tmp_path):
    r = cli("run", "--fs-deny", str(tmp_path / "typo"), "--", "true")
    assert r.returncode == 125
    assert f"--fs-deny {tmp_path}/typo: does not exist" in r.stderr
    assert "check the spelling" in r.stderr
    (tmp_path / "typo").write_text("x")
    assert cli("run", "--fs-deny", str(tmp_path / "typo"), "--", "true").returncode == 0


@pytest.mark.parametrize("command,typo,closest", [("run", "--fs-raed", "--fs-read"),
                                                  ("net-run", "--alow", "--allow"),
                                                  ("run", "--workdri", "--workdir")])
def test_an_unknown_flag_prints_the_subcommands_usage_and_the_closest_flag(
        tmp_path, command, typo, closest):
    marker = tmp_path / "ran"
    r = cli(command, typo, "/x", "--", "touch", str(marker))
    assert r.returncode == 125 and not marker.exists()
    assert r.stderr.startswith(f"usage: sandlock {command} ")
    assert f"unrecognized arguments: {typo}" in r.stderr
    assert f"{typo}: did you mean {closest}?" in r.stderr


def test_a_policy_file_reports_every_error_at_once(tmp_path):
    pol = tmp_path / "bad.yaml"
    pol.write_text("version: 1\n"
                   "filesystem:\n"
                   "  read: [/no/such/a, /usr]\n"
                   "  deny: [/no/such/b]\n"
                   "  bogus: 1\n"
                   "network:\n"
                   "  bind: [8080, 70000, x]\n"
                   "  allow: ['::::bad']\n"
                   "process:\n"
                   "  timeout: -1\n")
    r = cli("policy", "check", str(pol))
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    expected = [f"{pol}:3: filesystem.read: /no/such/a does not exist",
                f"{pol}:4: filesystem.deny: /no/such/b does not exist",
                f"{pol}:5: filesystem.bogus: unknown key",
                f"{pol}:7: network.bind: port 70000 is outside 1-65535",
                f"{pol}:7: network.bind: 'x' is not a port number",
                f"{pol}:8: network.allow: '::::bad'",
                f"{pol}:10: process.timeout: must be positive"]
    assert len(lines) == len(expected), r.stderr
    for line, want in zip(lines, expected):
        assert line.startswith(f"sandlock: error: {want}"), (line, want)
    r = cli("run", "--policy", str(pol), "--", "true")  # the same through run
    assert r.returncode == 125 and len(r.stderr.splitlines()) == len(expected)


def test_pipe_pipefail():
    r = cli("pipe", "--", "sh", "-c", "exit 3", ":::", "--", "cat")
    assert r.returncode == 0  # the last stage's status
    r = cli("pipe", "--pipefail", "--", "sh", "-c", "exit 3", ":::", "--", "cat")
    assert r.returncode == 3
    r = cli("pipe", "--pipefail", "--", "sh", "-c", "exit 3", ":::", "--", "sh", "-c",
            "cat >/dev/null; exit 4")
    assert r.returncode == 4  # the last non-zero, as bash's pipefail
    r = cli("pipe", "--pipefail", "--", "echo", "hi", ":::", "--", "cat")
    assert r.returncode == 0 and r.stdout == "hi\n"


def test_help_has_examples():
    for command in ("run", "net-run", "pipe", "policy", "audit", "completion"):
        r = cli(command, "--help")
        assert r.returncode == 0 and "examples:\n  sandlock " in r.stdout, command


def test_bash_completion(tmp_path):
    script = tmp_path / "sandlock.bash"
    script.write_text(cli("completion", "bash").stdout)

    def complete(*words):
        line = " ".join(f"'{w}'" for w in words)
        r = subprocess.run(["bash", "-c", f"source {script}; COMP_WORDS=({line}); "
                                          f"COMP_CWORD={len(words) - 1}; _sandlock; "
                                          f"printf '%s\\n' \"${{COMPREPLY[@]}}\""],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()
    assert complete("sandlock", "net-") == ["net-run"]
    assert complete("sandlock", "run", "--fs-r") == ["--fs-read"]
    assert complete("sandlock", "run", "--on-exit", "") == ["commit", "abort", "keep"]
    assert complete("sandlock", "workspace", "co") == ["commit"]
    assert "--pipefail" in complete("sandlock", "pipe", "--pipe")
    assert "sh" in complete("sandlock", "run", "--", "sh")  # a command after --


@pytest.mark.skipif(not shutil.which("fish"), reason="fish is not installed")
def test_fish_completion(tmp_path):
    script = tmp_path / "sandlock.fish"
    script.write_text(cli("completion", "fish").stdout)

    def complete(line):
        r = subprocess.run(["fish", "-c", f"source {script}; complete -C'{line}'"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return [x.split("\t")[0] for x in r.stdout.splitlines()]
    assert "net-run" in complete("sandlock ne")
    assert complete("sandlock run --fs-r") == ["--fs-read"]
    assert sorted(complete("sandlock run --on-exit ")) == ["abort", "commit", "keep"]


@pytest.mark.skipif(not shutil.which("zsh"), reason="zsh is not installed")
def test_zsh_completion(tmp_path):
    script = tmp_path / "_sandlock"
    script.write_text(cli("completion", "zsh").stdout)
    r = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["zsh", "-f", "-c", f"autoload -U compinit; compinit -u -D; "
                                           f"source {script}; print -r -- $_comps[sandlock]"],
                       capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, HOME=str(tmp_path)))
    assert r.stdout.strip() == "_sandlock", r.stderr
    text = script.read_text()
    assert "--fs-read[grant read" in text and ":value:(commit abort keep)" in text


def test_the_demo_removes_what_it_created(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    # From a directory of its own: net-run's working directory is a writable grant whose
    # repositories are scanned, and the suite's may hold another test's (the unprivileged
    # rerun's shards share theirs: a planted 1 MB git config refused the grant).
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py")],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "removed everything it created" in r.stdout
    assert os.listdir(tmp) == []


def test_a_removed_working_directory_runs_as_outside(tmp_path):
    """A command started from a directory that has since been removed runs (as it would
    outside the sandbox), for run and net-run alike, instead of a traceback."""
    for sub in ("run", "net-run"):
        gone = tmp_path / sub
        gone.mkdir()
        r = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh",
                            str(gone), *SANDLOCK, sub, "--", "sh", "-c", "echo ran; exit 3"],
                           capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        assert (r.returncode, r.stdout) == (3, "ran\n"), r.stderr
        assert "Traceback" not in r.stderr
    # The control: the same from an existing directory.
    r = cli("run", "--", "sh", "-c", "echo ran; exit 3")
    assert (r.returncode, r.stdout) == (3, "ran\n")
