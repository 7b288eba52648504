"""The network supervisor: address rules, every send path, unix sockets, DNS, SSRF, audit.

Real servers on loopback (127.0.0.2, 127.0.0.3 ... as distinct hosts), a real DNS server,
and each denial checked on the server side too: it never saw the connection or datagram.
"""

import errno
import json
import os
import socket
import threading
import time

import dns.message  # noqa: F401  (loaded so that the unprivileged run copies dnspython)
import pytest

from conftest import PY, connect_in, run_py, sandbox
from dnsserver import TestDnsServer

DNSPY_PATH = os.path.dirname(os.path.dirname(dns.message.__file__))

def test_ip_rule_allows_only_that_address_and_port(tcp_server):
    ok, other_ip, other_port_srv = tcp_server("127.0.0.2"), tcp_server("127.0.0.3"), tcp_server("127.0.0.2")
    sb = sandbox(net_allow=[f"127.0.0.2:{ok.port}"])
    res = connect_in(sb, f"127.0.0.2:{ok.port}", f"127.0.0.3:{other_ip.port}",
                     f"127.0.0.2:{other_port_srv.port}")
    assert res == ["ok\n", 13, 13]
    time.sleep(0.05)
    assert (ok.accepted, other_ip.accepted, other_port_srv.accepted) == (1, 0, 0)


def test_address_forms_cannot_dodge_the_rule(tcp_server):
    s1 = tcp_server("127.0.0.1")
    s3 = tcp_server("127.0.0.3")
    v6 = tcp_server("::1")
    sb = sandbox(net_allow=[f"127.0.0.2:{s1.port}", f"127.0.0.2:{s3.port}", f"127.0.0.2:{v6.port}"])
    res = connect_in(sb, f"[::1]:{v6.port}", f"[::ffff:127.0.0.3]:{s3.port}",
                     f"127.1:{s1.port}", f"2130706433:{s1.port}")
    assert res == [13, 13, 13, 13]
    assert s1.accepted == s3.accepted == v6.accepted == 0
    # IPv6 loopback is another address than 127.0.0.1, even with 127.0.0.1 allowed.
    assert connect_in(sandbox(net_allow=[f"127.0.0.1:{v6.port}"]), f"[::1]:{v6.port}") == [13]
    assert v6.accepted == 0
    # Control: a rule in the short form admits exactly 127.0.0.1.
    assert connect_in(sandbox(net_allow=[f"127.1:{s1.port}"]), f"127.0.0.1:{s1.port}") == ["ok\n"]


def test_cidr_rule_and_deny_wins(tcp_server):
    a, b = tcp_server("127.0.0.2"), tcp_server("127.0.0.3")
    sb = sandbox(net_allow=["127.0.0.0/24"], net_deny=["127.0.0.3"])
    assert connect_in(sb, f"127.0.0.2:{a.port}", f"127.0.0.3:{b.port}") == ["ok\n", 13]
    assert (a.accepted, b.accepted) == (1, 0)


UDP_PATHS = """
import socket, sys, json
host, port = sys.argv[1], int(sys.argv[2])
res = {}
def attempt(name, fn):
    try:
        fn(); res[name] = "sent"
    except OSError as e:
        res[name] = e.errno
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("sendto", lambda: u.sendto(b"sendto", (host, port)))
attempt("sendmsg", lambda: u.sendmsg([b"send", b"msg"], [], 0, (host, port)))
def connect_send():
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.connect((host, port)); c.send(b"cs")
attempt("connect_send", connect_send)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure): _fields_ = [("b", ctypes.c_void_p), ("l", ctypes.c_size_t)]
class msghdr(ctypes.Structure): _fields_ = [("n", ctypes.c_void_p), ("nl", ctypes.c_uint32),
    ("iov", ctypes.POINTER(iovec)), ("iovl", ctypes.c_size_t), ("c", ctypes.c_void_p),
    ("cl", ctypes.c_size_t), ("f", ctypes.c_int)]
class mmsghdr(ctypes.Structure): _fields_ = [("h", msghdr), ("len", ctypes.c_uint)]
addr = socket.inet_aton(host)
sa = ctypes.create_string_buffer(b"\\x02\\x00" + port.to_bytes(2, "big") + addr + b"\\0" * 8, 16)
data = ctypes.create_string_buffer(b"mmsg")
iov = iovec(ctypes.cast(data, ctypes.c_void_p), 4)
msgs = (mmsghdr * 2)()
for m in msgs:
    m.h.n, m.h.nl, m.h.iov, m.h.iovl = ctypes.cast(sa, ctypes.c_void_p), 16, ctypes.pointer(iov), 1
n = libc.sendmmsg(u.fileno(), msgs, 2, 0)
res["sendmmsg"] = "sent %d %d" % (n, msgs[0].len) if n >= 0 else ctypes.get_errno()
print(json.dumps(res))
"""


def _udp_rx(host):
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind((host, 0))
    rx.settimeout(0.3)
    return rx


def _drain(rx):
    got = []
    while True:
        try:
            got.append(rx.recv(100))
        except socket.timeout:
            return got


def test_every_udp_send_path_is_checked():
    allowed, denied = _udp_rx("127.0.0.2"), _udp_rx("127.0.0.3")
    ap, dp = allowed.getsockname()[1], denied.getsockname()[1]
    sb = sandbox(net_allow=[f"udp://127.0.0.2:{ap}"])
    res = json.loads(run_py(sb, UDP_PATHS, "127.0.0.3", str(dp)).stdout)
    assert res == {"sendto": 13, "sendmsg": 13, "connect_send": 13, "sendmmsg": 13}
    assert _drain(denied) == []
    res = json.loads(run_py(sb, UDP_PATHS, "127.0.0.2", str(ap)).stdout)  # control
    assert res == {"sendto": "sent", "sendmsg": "sent", "connect_send": "sent",
                   "sendmmsg": "sent 2 4"}
    assert sorted(_drain(allowed)) == sorted([b"sendto", b"sendmsg", b"cs", b"mmsg", b"mmsg"])
    allowed.close()
    denied.close()


def test_tcp_fast_open_is_a_checked_connect(tcp_server):
    srv = tcp_server("127.0.0.3")
    code = ("import socket, sys\ns = socket.socket()\ntry:\n"
            " s.sendto(b'GET /', 0x20000000, ('127.0.0.3', int(sys.argv[1]))); print('sent')\n"
            "except OSError as e: print(e.errno)")
    r = run_py(sandbox(net_allow=["127.0.0.2"]), code, str(srv.port))
    assert r.stdout.strip() == b"13"
    time.sleep(0.05)
    assert srv.accepted == 0


def test_pathname_unix_socket_needs_a_grant(tmp_path):
    path = tmp_path / "svc.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(4)
    os.chmod(tmp_path, 0o755)
    os.chmod(path, 0o777)
    accepted = []

    def accept():
        srv.settimeout(3)
        try:
            while True:
                c, _ = srv.accept()
                accepted.append(c)
        except OSError:
            pass
    t = threading.Thread(target=accept)
    t.start()
    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
            " s.connect(sys.argv[1]); print('connected')\nexcept OSError as e: print(e.errno)")
    r = run_py(sandbox(fs_readable=[tmp_path]), code, str(path))
    assert r.stdout.strip() == b"13"
    time.sleep(0.1)
    assert accepted == []
    r = run_py(sandbox(net_allow_unix=[str(tmp_path)]), code, str(path))  # control
    assert r.stdout.strip() == b"connected"
    t.join()
    srv.close()
    assert len(accepted) == 1


OWN_SERVER = """
import os, socket, sys, time
d = sys.argv[1]
own, host = os.path.join(d, "own.sock"), os.path.join(d, "host.sock")
srv = socket.socket(socket.AF_UNIX); srv.bind(own); srv.listen(1)
if os.fork() == 0:  # a client in another process of the sandbox, as a manager's is
    c = socket.socket(socket.AF_UNIX); c.connect(own); c.send(b"ping"); os._exit(0)
c, _ = srv.accept(); print("stream", c.recv(4).decode())
os.wait()
rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); rx.bind(os.path.join(d, "own.dgram"))
socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"dgram", os.path.join(d, "own.dgram"))
print("dgram", rx.recv(5).decode())
for target in (host, os.path.join(d, "swapped.sock")):  # the host's, by name or swapped in
    if target != host:
        os.link(host, target)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(target); print("host connected")
    except OSError as e:
        print("host", e.errno)
"""


def test_a_sandbox_connects_to_its_own_unix_socket_servers_only(tmp_path):
    """multiprocessing's managers and forkservers, a test's server in its TMPDIR: a unix
    socket the sandbox serves itself needs no grant. Decided on the socket reached, so the
    host's socket in the same writable directory (by its name, or hard-linked over a name
    the sandbox chose) stays refused."""
    host = socket.socket(socket.AF_UNIX)
    host.bind(str(tmp_path / "host.sock"))
    host.listen(4)
    host.settimeout(0.5)
    os.chmod(tmp_path, 0o777)
    os.chmod(tmp_path / "host.sock", 0o777)
    r = run_py(sandbox(fs_writable=[tmp_path]), OWN_SERVER, str(tmp_path))
    assert r.stdout.decode().split("\n")[:4] == ["stream ping", "dgram dgram", "host 13",
                                                 "host 13"], r.stderr
    with pytest.raises(TimeoutError):  # nothing of the sandbox's reached the host's server
        host.accept()
    reasons = [d.get("reason", "") for d in r.denials]
    assert sum("host.sock" in x or "swapped.sock" in x for x in reasons) == 2, reasons
    for name in ("own.sock", "own.dgram", "swapped.sock"):
        os.unlink(tmp_path / name)
    # control: granted, the host's server is reached
    r = run_py(sandbox(fs_writable=[tmp_path], net_allow_unix=[str(tmp_path)]), OWN_SERVER,
               str(tmp_path))
    assert r.stdout.decode().split("\n")[2:4] == ["host connected", "host connected"]
    host.accept()[0].close()
    host.close()


CONNECT_BACK = """
import os, socket, sys, time
if len(sys.argv) > 2:  # many processes holding many fds: a look at all of them is long
    for _ in range(int(sys.argv[2])):
        if os.fork() == 0:
            try:
                for _ in range(int(sys.argv[3])):
                    os.dup(0)
                time.sleep(30)
            finally:
                os._exit(0)
    time.sleep(0.7)
s = socket.socket(socket.AF_UNIX)
t = time.monotonic()
try:
    s.connect(sys.argv[1]); print("connected", s.recv(4).decode())
except OSError as e:
    print("refused", e.errno)
print(round(time.monotonic() - t, 3), flush=True)
os.killpg(0, 9) if len(sys.argv) > 2 else None
"""


def _host_listener(tmp_path):
    """A host service's listening unix socket, which anyone may reach: (path, socket)."""
    path = str(tmp_path / "svc.sock")
    host = socket.socket(socket.AF_UNIX)
    host.bind(path)
    host.listen(4)
    os.chmod(tmp_path, 0o777)
    os.chmod(path, 0o777)
    return path, host


def test_a_connection_accepted_from_a_host_socket_is_not_the_sandbox_s_own(tmp_path):
    """inetd-style: a host service hands the sandbox one accepted connection (its stdin).
    The kernel gives that socket the listener's address, so it looked like a listener
    the sandbox held: its program connected to the host's service again (review). Only
    listening (or bound, unconnected datagram) sockets count."""
    path, host = _host_listener(tmp_path)
    client = socket.socket(socket.AF_UNIX)
    client.connect(path)
    handed, _ = host.accept()
    host.settimeout(0.5)
    from sandlock import StdioMode
    proc = sandbox(fs_readable=[tmp_path]).popen([PY, "-c", CONNECT_BACK, path],
                                                  stdin=handed.fileno(),
                                                  stdout=StdioMode.PIPED,
                                                  stderr=StdioMode.PIPED)
    with proc:
        r = proc.communicate(timeout=30)
    assert r.stdout.split()[:2] == [b"refused", b"13"], r.stderr
    with pytest.raises(TimeoutError):  # the host's service saw nothing
        host.accept()
    # control: granted, the same program reaches it
    r = run_py(sandbox(fs_readable=[tmp_path], net_allow_unix=[str(tmp_path)]),
               CONNECT_BACK.replace("s.recv(4).decode()", "''"), path)
    assert r.stdout.split()[:1] == [b"connected"], r.stderr
    host.accept()[0].close()
    for s_ in (handed, client, host):
        s_.close()


def test_looking_for_an_own_socket_is_bounded(tmp_path):
    """Whether a socket is the sandbox's own is read from its processes' fds, on the
    supervisor's thread: 40 processes holding 3,000 fds each took ~0.6 s per connect here
    (100 x 10,000: 6-8 s, every sandbox of the process waiting; review). The look now
    stops at OWN_SCAN_FDS fds (OWN_SCAN_SECONDS as a backstop), and then refuses."""
    path, host = _host_listener(tmp_path)
    r = run_py(sandbox(fs_readable=[tmp_path]), CONNECT_BACK, path, "40", "3000", timeout=60)
    out = r.stdout.split()
    assert out[:2] == [b"refused", b"13"], (r.exit_code, r.error, r.stderr[-500:])
    assert float(out[2]) < 0.25, out  # not the whole look
    host.close()


def test_python_multiprocessing_managers_work_in_a_private_tmpdir(tmp_path):
    """The first user of own sockets: multiprocessing.Manager() serves on an AF_UNIX
    socket in a directory of TMPDIR, and each proxy connects to it. Also from a process
    holding 600 fds, with a thread busy beside (re-review: a 10 ms bound on the look,
    spent waiting for the GIL, refused 100 of 100 proxies)."""
    # The busy thread takes a core; a short switch interval keeps the main thread's GIL
    # waits (5 ms each by default, ~10 s in all here even bare) out of the test's time.
    code = ("import multiprocessing as mp, os, sys, threading\n"
            "sys.setswitchinterval(0.0002)\n"
            "held = [os.dup(0) for _ in range(600)]\n"
            "threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
            "m = mp.Manager(); d = m.dict(); d['k'] = 7\n"
            "proxies = [m.list() for _ in range(40)]\n"
            "print(dict(d), len(proxies)); m.shutdown()")
    r = run_py(sandbox(private_tmp=True), code, timeout=60)
    assert (r.exit_code, r.stdout.strip()) == (0, b"{'k': 7} 40"), r.stderr[-600:]


@pytest.fixture
def dns_server():
    srv = TestDnsServer({"api.sandlock.test": ["127.0.0.2"],
                         "secret-data.exfil.test": ["127.0.0.9"],
                         "internal.sandlock.test": ["127.0.0.4"],
                         "public.sandlock.test": ["203.0.113.7"]})
    yield srv
    srv.close()


RESOLVE = """
import socket, sys, json
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = sorted({ai[4][0] for ai in socket.getaddrinfo(name, 80, socket.AF_INET)})
    except OSError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def test_glibc_lookups_resolve_allowed_names_and_leak_nothing(dns_server, tcp_server):
    srv = tcp_server("127.0.0.2")
    sb = sandbox(net_allow=[f"api.sandlock.test:{srv.port}"], dns_servers=[dns_server.address],
                 net_allow_private=True)
    r = run_py(sb, RESOLVE, "api.sandlock.test", "secret-data.exfil.test")
    out = json.loads(r.stdout)
    assert out["api.sandlock.test"] == ["127.0.0.2"]
    assert isinstance(out["secret-data.exfil.test"], str)  # a resolution error
    assert not dns_server.saw("secret-data.exfil.test")
    # ... and the name's address is then reachable by name.
    code = (f"import socket; s = socket.create_connection(('api.sandlock.test', {srv.port}));"
            f"print(s.recv(3).decode())")
    assert run_py(sb, code).stdout == b"ok\n\n"


def test_curl_resolves_through_the_sandbox(dns_server, tcp_server):
    srv = tcp_server("127.0.0.2")
    sb = sandbox(net_allow=[f"api.sandlock.test:{srv.port}"], dns_servers=[dns_server.address],
                 net_allow_private=True)
    r = sb.run(["curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{remote_ip}",
                f"http://api.sandlock.test:{srv.port}/"])
    assert r.stdout == b"127.0.0.2"
    r = sb.run(["curl", "-s", "-m", "5", "http://secret-data.exfil.test/"])
    assert r.exit_code == 6  # couldn't resolve host
    assert not dns_server.saw("secret-data.exfil.test")


def test_dnspython_in_the_sandbox(dns_server):
    code = f"""
import sys, json
sys.path.insert(0, {DNSPY_PATH!r})
import dns.resolver
r = dns.resolver.Resolver(configure=False)
r.nameservers = ["{dns_server.address.split(':')[0]}"]
r.port = {dns_server.port}
r.lifetime = 3
out = {{}}
for name in sys.argv[1:]:
    try:
        out[name] = [a.address for a in r.resolve(name, "A")]
    except Exception as e:
        out[name] = type(e).__name__
print(json.dumps(out))
"""
    sb = sandbox(fs_readable=[DNSPY_PATH], net_allow=["api.sandlock.test:443"],
                 dns_servers=[dns_server.address], net_allow_private=True)
    out = json.loads(run_py(sb, code, "api.sandlock.test", "secret-data.exfil.test").stdout)
    assert out["api.sandlock.test"] == ["127.0.0.2"]
    assert out["secret-data.exfil.test"] != ["127.0.0.9"]
    assert not dns_server.saw("secret-data.exfil.test")


def test_hostname_resolving_to_private_address_needs_opt_in(dns_server, tcp_server):
    srv = tcp_server("127.0.0.4")
    rule = [f"internal.sandlock.test:{srv.port}"]
    sb = sandbox(net_allow=rule, dns_servers=[dns_server.address])
    assert connect_in(sb, f"127.0.0.4:{srv.port}") == [13]
    assert srv.accepted == 0
    sb = sandbox(net_allow=rule, dns_servers=[dns_server.address], net_allow_private=True)
    assert connect_in(sb, f"127.0.0.4:{srv.port}") == ["ok\n"]
    assert srv.accepted == 1


def test_unresolvable_host_is_a_clear_error(dns_server):
    from sandlock import SandlockError
    sb = sandbox(net_allow=["nowhere.sandlock.test:443"], dns_servers=[dns_server.address])
    with pytest.raises(SandlockError, match="nowhere.sandlock.test does not resolve"):
        sb.run(["true"])


def test_audit_records_each_denial(tmp_path, tcp_server):
    ok, bad = tcp_server("127.0.0.2"), tcp_server("127.0.0.3")
    log = tmp_path / "audit.jsonl"
    sb = sandbox(net_allow=[f"127.0.0.2:{ok.port}"], audit_log=str(log), name="audited")
    res = connect_in(sb, f"127.0.0.3:{bad.port}", f"127.0.0.2:{ok.port}",
                     f"127.0.0.3:{bad.port}")
    assert res == [13, "ok\n", 13]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2
    for rec in records:
        assert rec["decision"] == "deny" and rec["sandbox"] == "audited"
        assert rec["syscall"] == "connect" and rec["protocol"] == "tcp"
        assert rec["address"] == "127.0.0.3" and rec["port"] == bad.port
        assert rec["rule"] == "default:deny" and rec["errno"] == "EACCES"
        assert rec["argv"][0].endswith("python3") and isinstance(rec["pid"], int)
        assert "no rule allows tcp 127.0.0.3" in rec["reason"]


def test_many_sandboxes_many_connects(tcp_server):
    ok, bad = tcp_server("127.0.0.2"), tcp_server("127.0.0.3")
    code = """
import socket, sys
ok = bad = 0
for i in range(500):
    target = ("127.0.0.2", int(sys.argv[1])) if i % 2 == 0 else ("127.0.0.3", int(sys.argv[2]))
    s = socket.socket()
    try:
        s.connect(target); ok += 1
    except PermissionError:
        bad += 1
    s.close()
print(ok, bad)
"""
    sb = sandbox(net_allow=[f"127.0.0.2:{ok.port}"])
    results = [None] * 20

    def work(i):
        results[i] = run_py(sb, code, str(ok.port), str(bad.port), timeout=300)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(not t.is_alive() for t in threads)
    for r in results:
        assert r.stdout.split() == [b"250", b"250"], (r.stdout, r.stderr[-500:])
    time.sleep(0.2)
    assert ok.accepted == 20 * 250 and bad.accepted == 0


def test_address_change_is_followed_as_ttl_expires(tcp_server):
    first, second = tcp_server("127.0.0.2"), tcp_server("127.0.0.4")
    dns_srv = TestDnsServer({"moving.sandlock.test": ["127.0.0.2"]}, ttl=1)
    try:
        sb = sandbox(net_allow=["moving.sandlock.test"], dns_servers=[dns_srv.address],
                     net_allow_private=True)
        assert connect_in(sb, f"127.0.0.2:{first.port}", f"127.0.0.4:{second.port}") == \
            ["ok\n", 13]
        dns_srv.zone["moving.sandlock.test"] = ["127.0.0.4"]
        time.sleep(2.5)  # the supervisor re-resolves as the 1 s TTL runs out
        assert connect_in(sb, f"127.0.0.4:{second.port}", f"127.0.0.2:{first.port}") == \
            ["ok\n", 13]
        assert second.accepted == 1 and first.accepted == 1
    finally:
        dns_srv.close()


def test_concurrent_sandboxes_share_one_audit_log_without_interleaving(tmp_path, tcp_server):
    bad = tcp_server("127.0.0.3")
    log = tmp_path / "shared.jsonl"
    code = ("import socket, sys\nfor i in range(40):\n s = socket.socket()\n"
            " try: s.connect(('127.0.0.3', int(sys.argv[1])))\n except OSError: pass\n"
            " s.close()")
    results = []

    def work(i):
        sb = sandbox(net_allow=["127.0.0.2:1"], audit_log=str(log), name=f"sb{i}")
        results.append(run_py(sb, code, str(bad.port), timeout=120))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 8 and all(r.success for r in results)
    lines = log.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 8 * 40 + 1
    names = {json.loads(line)["sandbox"] for line in lines[:-1]}  # each line whole JSON
    assert names == {f"sb{i}" for i in range(8)} and bad.accepted == 0


def test_killed_sandbox_leaves_no_blocked_on_behalf_call():
    from sandlock.supervisor.loop import supervisor
    jam = socket.socket()
    jam.bind(("127.0.0.2", 0))
    jam.listen(0)  # never accepted: further connects block in SYN retries for minutes
    port = jam.getsockname()[1]
    code = ("import socket, sys, threading\nsocks = []\n"
            "def c():\n s = socket.socket(); socks.append(s)\n"
            " s.connect(('127.0.0.2', int(sys.argv[1])))\n"
            "ts = [threading.Thread(target=c) for _ in range(4)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]")
    t0 = time.monotonic()
    r = run_py(sandbox(net_allow=[f"127.0.0.2:{port}"]), code, str(port), timeout=1.5)
    assert r.reason.name == "TIMEOUT" and time.monotonic() - t0 < 5
    deadline = time.monotonic() + 3
    while supervisor()._pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not supervisor()._pending  # the blocked connects were woken and answered
    jam.close()


def _own_address():
    """A non-loopback address of this machine's interfaces that no special range covers
    (e.g. 192.0.2.2 on eth0 here), or None."""
    from netpolicy.decision import is_special
    from sandlock._kernel.netlink import interface_addresses
    for a in sorted(interface_addresses(), key=str):
        if a.version == 4 and not is_special(a):
            return str(a)
    return None


def test_host_rule_never_reaches_this_machines_own_addresses(tcp_server):
    """Review observation: a name resolving to an address of one of this machine's
    interfaces passed the SSRF default and reached a service bound to 0.0.0.0."""
    own = _own_address()
    if own is None:
        pytest.skip("no interface address outside the special ranges on this machine")
    srv = tcp_server("0.0.0.0")
    dns_srv = TestDnsServer({"self.sandlock.test": [own]})
    sb = sandbox(net_allow=[f"self.sandlock.test:{srv.port}"], dns_servers=[dns_srv.address])
    assert connect_in(sb, f"{own}:{srv.port}") == [errno.EACCES]
    assert srv.accepted == 0
    r = run_py(sb, f"import socket; socket.create_connection(('self.sandlock.test', "
                   f"{srv.port}))")
    assert b"Permission denied" in r.stderr and srv.accepted == 0
    assert any("an address of this machine" in d["reason"] for d in r.denials)
    # naming the address itself (or allowing private resolution) is the way to reach it
    assert connect_in(sandbox(net_allow=[f"{own}:{srv.port}"]), f"{own}:{srv.port}") == ["ok\n"]
    assert srv.accepted == 1
