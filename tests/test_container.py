"""Inside a container: Docker's default seccomp profile (containerd's RuntimeDefault has the
same rules) refuses pidfd_getfd, kcmp and process_madvise without CAP_SYS_PTRACE, and
unshare, mount and fsopen without CAP_SYS_ADMIN. Every test here runs the real CLI under
that profile (tests/helpers/container_profile.py loads it, then execs): `sandlock check`
names what is missing and what it costs; filesystem policies, Landlock port rules, the
user-file protection and workspaces run; what needs the supervisor to act on sockets is
refused with that message, never silently allowed.
"""

import os
import socket
import subprocess
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE = [sys.executable, os.path.join(HERE, "helpers", "container_profile.py"), "--"]
SANDLOCK = [sys.executable, "-m", "sandlock"]


def contained(*args, env=None, cwd=None):
    return subprocess.run(PROFILE + SANDLOCK + list(args), capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)


def test_the_profile_is_in_force():
    """The control: under the launcher, what the profile refuses is refused."""
    code = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
            "print(libc.syscall(438, 0, 0, 0), ctypes.get_errno(), "  # pidfd_getfd
            "libc.unshare(0x10000000), ctypes.get_errno())")          # CLONE_NEWUSER
    r = subprocess.run(PROFILE + [sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.split() == ["-1", "1", "-1", "1"], r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.split()[1] != "1"  # outside: pidfd_getfd exists (EBADF on fd 0)


def test_check_names_what_is_missing_and_what_it_costs():
    r = contained("check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[--] pidfd_getfd" in r.stdout and "[--] mount namespaces" in r.stdout
    assert "refused here: pidfd_getfd is refused here (a seccomp profile)" in r.stdout
    assert "CAP_SYS_PTRACE" in r.stdout and "Landlock port rules" in r.stdout
    assert "secrets are Landlock-denied paths" in r.stdout
    assert "all protections available" in r.stdout


def test_filesystem_policies_run(tmp_path):
    os.chmod(tmp_path, 0o777)
    r = contained("run", "-w", str(tmp_path), "--", "sh", "-c",
                  f"echo x > {tmp_path}/f && chmod 640 {tmp_path}/f && stat -c %a "
                  f"{tmp_path}/f; cat /etc/shadow; echo y > /etc/sandlock-test")
    assert r.stdout == "640\n", r.stderr
    assert (tmp_path / "f").read_text() == "x\n"
    assert "Permission denied" in r.stderr and not os.path.exists("/etc/sandlock-test")


def _server(host="127.0.0.1"):
    srv = socket.socket()
    srv.bind((host, 0))
    srv.listen(8)
    seen = []

    def accept():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            seen.append(c.recv(16))
            c.close()
    threading.Thread(target=accept, daemon=True).start()
    return srv, srv.getsockname()[1], seen


CONNECT = ("import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])),"
           " timeout=5); s.sendall(b'hello'); print('sent')")


def test_landlock_port_rules_run():
    srv, port, seen = _server()
    try:
        r = contained("run", "--allow", f":{port}", "--", "python3", "-c", CONNECT, str(port))
        assert r.returncode == 0 and r.stdout == "sent\n", r.stderr
        other = port + 1 if port < 65535 else port - 1
        r = contained("run", "--allow", f":{other}", "--", "python3", "-c", CONNECT, str(port))
        assert r.returncode != 0 and "Permission denied" in r.stderr
    finally:
        srv.close()
    assert seen == [b"hello"]  # one connection: the allowed one


def test_rules_that_need_the_supervisor_on_sockets_are_refused(tmp_path):
    srv, port, seen = _server("127.0.0.2")
    marker = tmp_path / "ran"
    try:
        for flags in (["--allow", f"127.0.0.2:{port}"], ["--allow", "localhost:80"],
                      ["--http-allow", f"GET 127.0.0.2:{port}/*"],
                      ["--net-allow-unix", "/run"], ["--net-allow-bind", "8080"]):
            r = contained("run", *flags, "--", "touch", str(marker))
            assert r.returncode == 125, (flags, r.stderr)
            assert "pidfd_getfd" in r.stderr and "CAP_SYS_PTRACE" in r.stderr, r.stderr
            assert not marker.exists()  # nothing ran
    finally:
        srv.close()
    assert seen == []


def test_unix_sockets_other_than_pairs_are_refused(tmp_path):
    os.chmod(tmp_path, 0o777)
    path = str(tmp_path / "s")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    os.chmod(path, 0o777)
    srv.listen(1)
    srv.settimeout(0.5)
    code = ("import socket, sys\n"
            "a, b = socket.socketpair(); a.sendall(b'pair'); print(b.recv(4).decode())\n"
            "try:\n"
            "    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print('connected')\n"
            "except OSError as e:\n"
            "    print('refused', e.errno)\n")
    try:
        r = contained("run", "-r", str(tmp_path), "--", "python3", "-c", code, path)
        assert r.stdout == "pair\nrefused 1\n", r.stderr  # EPERM at socket()
        with pytest.raises(socket.timeout):
            srv.accept()  # nothing reached the socket
    finally:
        srv.close()


def test_user_files_are_protected_without_a_namespace(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh/id_test").write_text("KEY\n")
    (home / ".bashrc").write_text("rc\n")
    (home / "proj").mkdir()
    for p in (tmp_path, home, home / ".ssh", home / "proj"):
        os.chmod(p, 0o777)
    for p in (home / ".ssh/id_test", home / ".bashrc"):
        os.chmod(p, 0o666)
    env = dict(os.environ, HOME=str(home))
    r = contained("run", "-v", "-r", str(home), "-w", str(home / "proj"), "-w",
                  str(home / ".bashrc"), "--", "sh", "-c",
                  f"cat {home}/.ssh/id_test; echo ok > {home}/proj/new && cat {home}/proj/new",
                  env=env)
    assert r.stdout == "ok\n" and "Permission denied" in r.stderr, r.stderr
    assert "Landlock rules and the supervisor (no namespace here)" in r.stderr
    r = contained("run", "-w", str(home), "--", "sh", "-c",
                  f"echo evil >> {home}/.bashrc; echo $? ; echo n > {home}/proj/n2", env=env)
    assert r.stdout.strip() != "0" and (home / ".bashrc").read_text() == "rc\n", r.stderr
    assert (home / "proj/n2").read_text() == "n\n"


def test_a_workspace_runs_on_the_seccomp_backend(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    (work / "a.txt").write_text("old\n")
    os.chmod(tmp_path, 0o777)
    os.chmod(work, 0o777)
    os.chmod(work / "a.txt", 0o666)
    r = contained("run", "--workdir", str(work), "--fs-storage", str(tmp_path / "store"),
                  "--cwd", str(work), "--", "sh", "-c", "echo new > a.txt; echo b > b.txt")
    assert r.returncode == 0, r.stderr
    assert (work / "a.txt").read_text() == "new\n" and (work / "b.txt").read_text() == "b\n"
    r = contained("run", "--workdir", str(work), "--workspace-backend", "overlay",
                  "--fs-storage", str(tmp_path / "store"), "--", "true")
    assert r.returncode == 125 and "overlay" in r.stderr, r.stderr
