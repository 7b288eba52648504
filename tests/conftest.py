"""Shared fixtures: real sandboxes, real processes, real sockets on loopback."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import struct
import sys
import threading

import pytest

from sandlock import Sandbox, system_devices, system_readable

PY = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
IS_ROOT = os.geteuid() == 0


def fake_private_key(kind: str = "") -> str:
    """Something shaped like a PEM private key, made at run time (random body, nothing
    usable as a key; no key material is kept in the repository)."""
    import base64
    label = f"{kind} PRIVATE KEY".strip()
    body = base64.b64encode(os.urandom(48)).decode()
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----\n"


def sandbox(**kw) -> Sandbox:
    """A Sandbox that can run system programs: system directories readable, the standard
    devices (/dev/null ...) writable, as `sandlock run` grants by default."""
    kw["fs_readable"] = system_readable() + list(kw.get("fs_readable") or [])
    kw["fs_writable"] = system_devices() + list(kw.get("fs_writable") or [])
    return Sandbox(**kw)


def run_py(sb: Sandbox, code: str, *args: str, timeout: float = 30):
    """Run a Python snippet (system python3) in `sb`."""
    return sb.run([PY, "-c", code, *args], timeout=timeout)


def open_fds() -> dict[str, str]:
    """This process's open fds and what each names (to compare by identity, not count)."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


# The system's programs the tests run, hard-link or place in fake homes: the suite leaves
# them as they were (a test once chmod'ed /usr/bin/python3.11 to 0777 through a hard link).
_SYSTEM_PROGRAMS = [os.path.realpath(p) for p in
                    ("/usr/bin/python3", "/usr/bin/node", "/bin/sh", "/usr/bin/env",
                     "/bin/true", "/bin/echo") if os.path.exists(p)]


def _program_states() -> dict:
    out = {}
    for path in _SYSTEM_PROGRAMS:
        st = os.stat(path)
        out[path] = (oct(st.st_mode), st.st_uid, st.st_gid, st.st_nlink)
    return out


def pytest_collection_finish(session):
    """The unprivileged rerun starts now, beside the root suite (test_unprivileged.py)."""
    for item in session.items:
        if item.nodeid.endswith("test_unprivileged.py::test_suite_passes_unprivileged"):
            item.module.start_early()


def pytest_sessionfinish(session):
    module = sys.modules.get("test_unprivileged")
    if module is not None:
        module.stop_early()


@pytest.fixture(scope="session", autouse=True)
def _system_programs_left_as_they_were():
    before = _program_states()
    yield
    assert _program_states() == before, "the suite changed the system's programs"


@pytest.fixture(autouse=True)
def _close_dns_servers():
    """Test DNS servers end with their test (their sockets and threads)."""
    yield
    import sys
    module = sys.modules.get("dnsserver")
    if module is not None:
        while module.TestDnsServer.live:
            module.TestDnsServer.live.pop().close()


@pytest.fixture
def secret_tree(tmp_path):
    """A tree with a public file and a secret; world-accessible so that an unprivileged
    run of the suite exercises Landlock rather than Unix permissions."""
    root = tmp_path / "tree"
    (root / "pub").mkdir(parents=True)
    (root / "pub" / "hello.txt").write_text("hello\n")
    (root / "secret").mkdir()
    (root / "secret" / "key").write_text("TOPSECRET\n")
    (root / "work").mkdir()
    for p in [tmp_path, *root.rglob("*"), root]:
        os.chmod(p, 0o777 if p.is_dir() else 0o666)
    return root


class TcpServer:
    """A loopback TCP server that records every accepted connection."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self._accepted = 0
        self._lock = threading.Lock()  # an accept and its count, as one step
        self.sock.setblocking(False)  # accept() under the lock never waits
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop:
            try:
                # Bounded: close() joins this thread before it closes the socket (a
                # select on a closed fd number, reused meanwhile, would never return).
                if not select.select([self.sock], [], [], 0.1)[0]:
                    continue
                with self._lock:
                    conn, _ = self.sock.accept()
                    self._accepted += 1
            except BlockingIOError:
                continue
            except (OSError, ValueError):  # shut down, closed
                return
            try:
                conn.setblocking(True)
                conn.sendall(b"ok\n")
            except OSError:
                pass
            conn.close()

    @property
    def accepted(self) -> int:
        """Connections made so far: those accepted, and those in the accept queue (a
        client that connects and closes without reading may end before this server's
        thread takes its connection)."""
        with self._lock:
            return self._accepted + self._queued()

    def _queued(self) -> int:
        """The accept queue's length: tcp_info's tcpi_unacked, on a listening socket."""
        try:
            info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        except OSError:  # closed
            return 0
        return struct.unpack_from("I", info, 24)[0]

    def close(self):
        self._stop = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def tcp_server():
    servers = []

    def make(host="127.0.0.1", port=0):
        s = TcpServer(host, port)
        servers.append(s)
        return s
    yield make
    for s in servers:
        s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Connect to each "host:port" (IPv6 in brackets) and print what happened: the server's
# greeting or the errno.
CONNECT = """
import json, socket, sys
res = []
for spec in sys.argv[1:]:
    host, port = spec.rsplit(":", 1)
    host = host.strip("[]")
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, int(port))); res.append(s.recv(3).decode())
    except OSError as e:
        res.append(e.errno)
    s.close()
print(json.dumps(res))
"""


def connect_in(sb, *targets):
    r = run_py(sb, CONNECT, *targets)
    assert r.success, r.stderr
    return json.loads(r.stdout)


class WebRecorder:
    """A plain HTTP server on 127.0.0.1 answering GET and POST with `reply`, recording
    (method, path) of each request it received in full in `hits`."""

    def __init__(self, reply: bytes = b"ok"):
        import http.server
        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hits.append((self.command, self.path))
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
            do_GET = do_POST = _answer
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket.setblocking(False)  # never stuck in accept() at shutdown
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def paths(self) -> list[str]:
        return [p for _, p in self.hits]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def web_recorder():
    servers = []

    def make(reply: bytes = b"ok"):
        servers.append(WebRecorder(reply))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


CLIENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "sandlock", "_libexec", "sandlock-client")
# The CLI as the test files about it run it: in-process (`python -m sandlock`), or, with
# SANDLOCK_TEST_CLI=service, through the C client and the CLI service
# (tests/test_service.py runs those files that way).
CLI = [CLIENT] if os.environ.get("SANDLOCK_TEST_CLI") == "service" else \
    [__import__("sys").executable, "-m", "sandlock"]


def sandlock_cli(*args, cwd=None, timeout: float = 120):
    """`python -m sandlock ARGS` with this checkout first on the path (text output)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "sandlock", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
