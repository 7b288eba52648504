"""Landlock TCP port rules and IPC scopes (signals, abstract unix sockets)."""

import json
import os
import socket
import subprocess
import threading
import time

from conftest import CONNECT, PY, connect_in, free_port, run_py, sandbox

def test_tcp_connect_only_to_granted_port(tcp_server):
    allowed, other = tcp_server(), tcp_server()
    sb = sandbox(net_allow=[f":{allowed.port}"])
    res = connect_in(sb, f"127.0.0.1:{allowed.port}", f"127.0.0.1:{other.port}")
    assert res == ["ok\n", 13]
    assert allowed.accepted == 1 and other.accepted == 0


def test_no_network_rules_means_no_tcp(tcp_server):
    srv = tcp_server()
    assert connect_in(sandbox(), f"127.0.0.1:{srv.port}") == [13]
    time.sleep(0.05)
    assert srv.accepted == 0
    # Control: unconfined, the same connect reaches the server.
    assert json.loads(subprocess.run([PY, "-c", CONNECT, f"127.0.0.1:{srv.port}"],
                                     capture_output=True).stdout) == ["ok\n"]


def test_ipv6_loopback_on_other_port_refused(tcp_server):
    allowed = tcp_server()
    v6 = tcp_server("::1")
    sb = sandbox(net_allow=[f"tcp://:{allowed.port}"])
    assert connect_in(sb, f"[::1]:{v6.port}") == [13]
    assert v6.accepted == 0


def test_port_list_and_range(tcp_server):
    a, b = tcp_server(), tcp_server()
    sb = sandbox(net_allow=[f"*:{a.port},{b.port}"])
    assert connect_in(sb, f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}") == ["ok\n", "ok\n"]


def test_bind_rule_holds():
    good, bad = free_port(), free_port()
    code = """
import json, socket, sys
res = []
for port in sys.argv[1:]:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", int(port))); res.append("ok")
    except OSError as e:
        res.append(e.errno)
    s.close()
print(json.dumps(res))
"""
    sb = sandbox(net_allow_bind=[good])
    r = run_py(sb, code, str(good), str(bad))
    assert json.loads(r.stdout) == ["ok", 13]


def _udp_receiver():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.3)
    return rx


def _received(rx):
    try:
        return rx.recv(100)
    except socket.timeout:
        return None
    finally:
        rx.close()


def test_udp_without_udp_rule_cannot_even_create_a_socket():
    rx = _udp_receiver()
    code = ("import socket, sys\ntry:\n s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            " s.sendto(b'leak', ('127.0.0.1', int(sys.argv[1]))); print('sent')\n"
            "except OSError as e: print(e.errno)")
    r = run_py(sandbox(net_allow=["tcp://:53"]), code, str(rx.getsockname()[1]))
    assert r.stdout.strip() == b"1"  # EPERM from the socket() filter
    assert _received(rx) is None


def test_udp_rule_allows_only_its_destination():
    allowed, other = _udp_receiver(), _udp_receiver()
    code = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for port in sys.argv[1:]:
    try:
        s.sendto(b"hello", ("127.0.0.1", int(port))); print("sent")
    except OSError as e:
        print(e.errno)
"""
    ap, op = allowed.getsockname()[1], other.getsockname()[1]
    r = run_py(sandbox(net_allow=[f"udp://127.0.0.1:{ap}"]), code, str(ap), str(op))
    assert r.stdout.split() == [b"sent", b"13"], r.stderr
    assert _received(allowed) == b"hello" and _received(other) is None


def test_signal_to_outside_process_fails():
    victim = subprocess.Popen(["sleep", "30"])
    try:
        code = """
import os, signal, subprocess, sys
try:
    os.kill(int(sys.argv[1]), signal.SIGTERM); print("sent")
except OSError as e:
    print(e.errno)
inner = subprocess.Popen(["sleep", "30"])
os.kill(inner.pid, signal.SIGTERM)
print(inner.wait())
"""
        r = run_py(sandbox(), code, str(victim.pid))
        assert r.stdout.split() == [b"1", b"-15"]  # EPERM outside; own child killable
        time.sleep(0.05)
        assert victim.poll() is None  # still alive
    finally:
        victim.kill()
        victim.wait()


def test_abstract_unix_socket_outside_fails():
    name = f"\0sandlock-test-{os.getpid()}-{time.monotonic_ns()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen(4)
    srv.settimeout(0.3)
    accepted = []

    def accept():
        try:
            accepted.append(srv.accept())
        except OSError:
            pass
    t = threading.Thread(target=accept)
    t.start()
    code = """
import socket, sys
name = "\\0" + sys.argv[1]
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(name); print("connected")
except OSError as e:
    print(e.errno)
own = "\\0" + sys.argv[1] + "-inner"
a = socket.socket(socket.AF_UNIX); a.bind(own); a.listen(1)
b = socket.socket(socket.AF_UNIX); b.connect(own); print("inner-ok")
"""
    # Supervised (the default): abstract names are reachable only when granted by name.
    inner = "@" + name[1:] + "-inner"
    r = run_py(sandbox(net_allow_unix=[inner]), code, name[1:])
    assert r.stdout.split() == [b"1", b"inner-ok"], r.stderr
    # Unsupervised (unix sockets waived, TCP by Landlock): the kernel's scope still holds.
    r = run_py(sandbox(net_allow_unix=["*"], net_allow=["tcp://:1"]), code, name[1:])
    assert r.stdout.split() == [b"1", b"inner-ok"], r.stderr
    t.join()
    srv.close()
    assert accepted == []
