"""The HTTP filter: real clients in sandboxes, a real upstream server on loopback that
records every request it receives, and the threats note's HTTP and TLS items."""

from __future__ import annotations

import http.server
import json
import os
import socket
import ssl
import threading

import pytest

from conftest import PY, run_py, sandbox
from netpolicy.http_framing import FramingError, RequestFramer
from netpolicy.http_rules import HttpPolicy, decide_tls_host
from netpolicy.tls_sni import SniError, client_hello_sni


# -- framing, pure -------------------------------------------------------------------------

GOOD = [
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
    b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n"
    b"0\r\nX-Trailer: 1\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n",
]
BAD = {
    "CL+TE": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n",
    "two CL": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
    "CL +3": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
    "CL 03": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 03\r\n\r\n",
    "CL hex": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\n",
    "TE gzip": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "TE space colon": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n",
    "obs-fold": b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n",
    "bare LF": b"GET / HTTP/1.1\nHost: a\n\n",
    "bare CR": b"GET / HTTP/1.1\rHost: a\r\n\r\n",
    "lowercase method": b"get / HTTP/1.1\r\nHost: a\r\n\r\n",
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    # CVE-2025-43859: anything but CRLF after chunk data (h11 <= 0.14 skipped 2 bytes).
    "bad chunk terminator": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"5\r\nAAAAAXX0\r\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n",
    "bad chunk size": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"5x\r\nAAAAA\r\n0\r\n\r\n",
    "chunk size LF": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\nAAAAA\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("raw", GOOD)
def test_framer_passes_well_framed_requests_byte_for_byte(raw):
    f = RequestFramer()
    out = b"".join(f.feed(raw[i:i + 7]) for i in range(0, len(raw), 7))
    assert out == raw


@pytest.mark.parametrize("name", BAD)
def test_framer_refuses_ambiguous_framing(name):
    with pytest.raises(FramingError):
        RequestFramer().feed(BAD[name])


def _client_hello(server_name: str | None) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_sni_is_read_from_a_real_client_hello_even_in_pieces():
    hello = _client_hello("API.Example.COM")
    assert client_hello_sni(hello) == "api.example.com"
    assert client_hello_sni(hello[:40]) is None  # needs more
    with pytest.raises(SniError, match="no server name"):
        client_hello_sni(_client_hello(None))
    with pytest.raises(SniError):
        client_hello_sni(b"GET / HTTP/1.1\r\n\r\n")


@pytest.mark.parametrize("allow, deny, host, ok, fragment", [
    (["* api.test"], [], "api.test", True, "allowed"),
    (["GET api.test/repos/*"], [], "api.test", False, "interception is required"),
    (["* **.api.test"], [], "x.api.test", True, "allowed"),
    (["* api.test"], [], "other.test", False, "no rule allows HTTPS to other.test"),
    (["* api.test"], ["POST api.test/x"], "api.test", False, "interception is required"),
    (["* api.test"], ["* api.test"], "api.test", False, "denied by"),
])
def test_tls_host_decisions(allow, deny, host, ok, fragment):
    v = decide_tls_host(HttpPolicy.from_rules(allow, deny), host)
    assert v.allowed == ok and fragment in v.reason


# -- end to end ----------------------------------------------------------------------------

class Upstream:
    """A keep-alive HTTP/1.1 server recording (method, path, body) of every request it
    receives in full."""

    def __init__(self, host="127.0.0.1", tls_context=None, big=0):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _reply(self, body: bytes):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                seen.append(("GET", self.path, b""))
                if self.path == "/ok/big":
                    self.send_response(200)
                    self.send_header("Content-Length", str(big))
                    self.end_headers()
                    chunk = b"x" * 65536
                    for _ in range(big // len(chunk)):
                        self.wfile.write(chunk)
                    return
                self._reply(b"hello " + self.path.encode())

            def do_POST(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        body += self.rfile.read(size)
                        self.rfile.readline()
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen.append(("POST", self.path, body))
                self._reply(b"posted " + body)

            def do_DELETE(self):
                seen.append(("DELETE", self.path, b""))
                self._reply(b"deleted " + self.path.encode())

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        # A connection gone between the server's select and its accept must not block
        # serve_forever (and with it shutdown() at teardown) for good.
        self.server.socket.setblocking(False)
        if tls_context is not None:
            self.server.socket = tls_context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def paths(self):
        return [p for _, p, _ in self.seen]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream():
    servers = []

    def make(**kw):
        s = Upstream(**kw)
        servers.append(s)
        return s
    yield make
    for s in servers:
        s.close()


def _web_sandbox(up, tmp_path, **kw):
    log = tmp_path / "audit.jsonl"
    host = f"127.0.0.1:{up.port}"
    sb = sandbox(net_allow=[host], http_allow=["GET 127.0.0.1/ok*", "POST 127.0.0.1/ok/post"],
                 http_ports=[up.port], audit_log=str(log), **kw)
    return sb, log


def _records(log):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_curl_allowed_get_and_refused_post(upstream, tmp_path):
    up = upstream()
    sb, log = _web_sandbox(up, tmp_path)
    r = sb.run(["curl", "-sS", f"http://127.0.0.1:{up.port}/ok/1"], timeout=30)
    assert r.success and r.stdout == b"hello /ok/1"
    r = sb.run(["curl", "-sS", "-i", "-d", "secret=1", f"http://127.0.0.1:{up.port}/ok/2"],
               timeout=30)
    out = r.stdout.decode()
    assert out.startswith("HTTP/1.1 403 Forbidden") and "connection: close" in out
    assert out.endswith("sandlock: no rule allows POST 127.0.0.1/ok/2\n")
    assert up.seen == [("GET", "/ok/1", b"")]  # the POST never reached the server
    [rec] = [r for r in _records(log) if r["decision"] == "deny"]
    assert rec["method"] == "POST" and rec["path"] == "/ok/2" and rec["host"] == "127.0.0.1"
    assert rec["rule"] == "default:deny" and rec["argv"][0] == "curl"
    assert rec["protocol"] == "http" and rec["port"] == up.port and rec["pid"] > 0


URLLIB = """
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        print(urllib.request.urlopen(url, timeout=10).read().decode())
    except urllib.error.HTTPError as e:
        print(e.code, e.read().decode().strip())
"""


def test_python_client_and_keep_alive(upstream, tmp_path):
    up = upstream()
    sb, _ = _web_sandbox(up, tmp_path)
    base = f"http://127.0.0.1:{up.port}"
    r = run_py(sb, URLLIB, f"{base}/ok/a", f"{base}/secret")
    assert r.stdout.decode().splitlines() == [
        "hello /ok/a", "403 sandlock: no rule allows GET 127.0.0.1/secret"]
    r = sb.run(["curl", "-sS", f"{base}/ok/b", f"{base}/ok/c"], timeout=30)  # one connection
    assert r.stdout == b"hello /ok/bhello /ok/c"
    assert up.paths() == ["/ok/a", "/ok/b", "/ok/c"]


def test_large_download_streams_through(upstream, tmp_path):
    up = upstream(big=64 << 20)
    sb, _ = _web_sandbox(up, tmp_path)
    r = sb.run(["/bin/sh", "-c", f"curl -sS http://127.0.0.1:{up.port}/ok/big | wc -c"],
               timeout=60)
    assert r.stdout.strip() == str(64 << 20).encode(), r.stderr


# Sends raw bytes on one connection; prints every status line received, then "closed".
RAW = r"""
import re, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(bytes.fromhex(sys.argv[2]))
data, sent = b"", False
try:
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        if sys.argv[3:] == ["continue"] and b"100 Continue" in data and not sent:
            s.sendall(b"7\r\npost=ok\r\n0\r\n\r\n")
            sent = True
except socket.timeout:
    pass
print(" ".join(m.decode() for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)))
"""

H = "127.0.0.1:{port}"
ATTACKS = {
    # name: (request, expected statuses, path the server must never see)
    "allowed": ("GET /ok/x HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n", "200", None),
    "encoded slash": ("GET /ok/..%2fadmin HTTP/1.1\r\nHost: {h}\r\n\r\n", "400", "/admin"),
    "encoded dots": ("GET /ok/%2e%2e/admin HTTP/1.1\r\nHost: {h}\r\n\r\n", "403", "/admin"),
    "dot segments": ("GET /ok/../admin HTTP/1.1\r\nHost: {h}\r\n\r\n", "403", "/admin"),
    "double slash": ("GET /ok//x HTTP/1.1\r\nHost: {h}\r\n\r\n", "400", None),
    "backslash": ("GET /ok\\..\\admin HTTP/1.1\r\nHost: {h}\r\n\r\n", "400", None),
    "encoded NUL": ("GET /ok/%00 HTTP/1.1\r\nHost: {h}\r\n\r\n", "400", None),
    "params": ("GET /ok;x=/../admin HTTP/1.1\r\nHost: {h}\r\n\r\n", "400", None),
    "lowercase method": ("get /ok/x HTTP/1.1\r\nHost: {h}\r\n\r\n", "400", None),
    "h2 preface": ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "400", None),
    "h2c upgrade": ("GET /ok/x HTTP/1.1\r\nHost: {h}\r\nConnection: Upgrade\r\n"
                    "Upgrade: h2c\r\n\r\n", "403", None),
    "websocket": ("GET /ok/x HTTP/1.1\r\nHost: {h}\r\nConnection: Upgrade\r\n"
                  "Upgrade: websocket\r\n\r\n", "403", None),
    "CONNECT": ("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", "403",
                None),
    "foreign host": ("GET /ok/x HTTP/1.1\r\nHost: evil.test\r\n\r\n", "403", None),
    "host port": ("GET /ok/x HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n", "403", None),
    "userinfo": ("GET /ok/x HTTP/1.1\r\nHost: a@{h}\r\n\r\n", "400", None),
    "absolute mismatch": ("GET http://evil.test/ok/x HTTP/1.1\r\nHost: {h}\r\n\r\n", "400",
                          None),
    "absolute ok": ("GET http://{h}/ok/abs HTTP/1.1\r\nHost: {h}\r\nConnection: close"
                    "\r\n\r\n", "200", None),
    "CL+TE": ("POST /ok/post HTTP/1.1\r\nHost: {h}\r\nContent-Length: 4\r\n"
              "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: {h}\r\n\r\n",
              "400", "/admin"),
    "two CL": ("POST /ok/post HTTP/1.1\r\nHost: {h}\r\nContent-Length: 0\r\n"
               "Content-Length: 40\r\n\r\nGET /admin HTTP/1.1\r\nHost: {h}\r\n\r\n", "400",
               "/admin"),
    "CL +3": ("POST /ok/post HTTP/1.1\r\nHost: {h}\r\nContent-Length: +3\r\n\r\nabc",
              "400", None),
    "CL 03": ("POST /ok/post HTTP/1.1\r\nHost: {h}\r\nContent-Length: 03\r\n\r\nabc",
              "400", None),
    "TE gzip": ("POST /ok/post HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: gzip\r\n\r\n",
                "400", None),
    "TE space colon": ("POST /ok/post HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding : chunked"
                       "\r\n\r\n0\r\n\r\n", "400", None),
    "trailing-dot host": ("GET /ok/case HTTP/1.1\r\nHost: 127.0.0.1.:{port}\r\n"
                                      "Connection: close\r\n\r\n", "200", None),
    "obs-fold": ("GET /ok/x HTTP/1.1\r\nHost: {h}\r\nX-A: 1\r\n Transfer-Encoding: chunked"
                 "\r\n\r\n", "400", None),
    "bare LF": ("GET /ok/x HTTP/1.1\nHost: {h}\n\n", "400", None),
    "CVE-2025-43859": ("POST /ok/post HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked"
                       "\r\n\r\n5\r\nAAAAAXX0\r\n\r\nGET /admin HTTP/1.1\r\nHost: {h}\r\n\r\n",
                       "400", "/admin"),
    "pipelined": ("GET /ok/1 HTTP/1.1\r\nHost: {h}\r\n\r\nGET /admin HTTP/1.1\r\nHost: {h}"
                  "\r\n\r\n", "200 403", "/admin"),
    "expect denied": ("POST /ok/other HTTP/1.1\r\nHost: {h}\r\nContent-Length: 7\r\n"
                      "Expect: 100-continue\r\n\r\n", "403", "/ok/other"),
}


@pytest.mark.parametrize("name", ATTACKS)
def test_http_threats_never_reach_the_server(upstream, tmp_path, name):
    up = upstream()
    sb, log = _web_sandbox(up, tmp_path)
    request, statuses, forbidden = ATTACKS[name]
    raw = request.replace("{h}", H.format(port=up.port)).replace("{port}",
                                                                 str(up.port)).encode()
    r = run_py(sb, RAW, str(up.port), raw.hex())
    assert r.stdout.decode().strip() == statuses, (r.stdout, r.stderr[-500:])
    if forbidden:
        assert forbidden not in up.paths()
    if statuses in ("400", "403"):
        assert up.seen == []  # nothing at all reached the server
        assert any(rec["decision"] == "deny" for rec in _records(log))
    if name == "absolute ok":
        assert up.paths() == ["/ok/abs"]  # forwarded in origin form


@pytest.mark.parametrize("host, path, status", [
    ("[::ffff:127.0.0.1]:{port}", "/admin", "403"),   # an alias of the denied address
    ("[::ffff:127.0.0.1]:{port}", "/fine", "200"),    # the same alias, allowed path
    ("[evil.test]:{port}", "/fine", "400"),           # brackets hold IPv6 only
])
def test_host_literals_are_canonical_for_rules(upstream, host, path, status):
    up = upstream()
    sb = sandbox(net_allow=[f"127.0.0.1:{up.port}"], http_allow=["* *"],
                 http_deny=["* 127.0.0.1/admin*"], http_ports=[up.port])
    raw = (f"GET {path} HTTP/1.1\r\nHost: {host.format(port=up.port)}\r\n"
           "Connection: close\r\n\r\n").encode()
    r = run_py(sb, RAW, str(up.port), raw.hex())
    assert r.stdout.decode().strip() == status
    assert up.paths() == (["/fine"] if status == "200" else [])


def test_query_and_header_conditions_need_exactly_one_value():
    policy = HttpPolicy.from_rules([{"methods": ["GET"], "host": "a.test", "path": "/list",
                                     "query": {"per_page": "100"}}])
    assert policy.decide("GET", "a.test", "/list", {"per_page": ["100"]}).allowed
    assert not policy.decide("GET", "a.test", "/list",
                             {"per_page": ["100", "100000"]}).allowed


def test_encrypted_client_hello_is_refused():
    import struct
    hello = bytearray(_client_hello("api.test"))
    # Append an encrypted_client_hello extension (0xfe0d) and fix the three lengths.
    ext = struct.pack("!HH", 0xFE0D, 4) + b"\0\0\0\0"
    body = bytes(hello[9:]) + ext
    ext_total_at = 9 + 2 + 32
    ext_total_at += 1 + body[ext_total_at - 9]                      # session id
    ext_total_at += 2 + struct.unpack_from("!H", body, ext_total_at - 9)[0]  # suites
    ext_total_at += 1 + body[ext_total_at - 9]                      # compression
    body = bytearray(body)
    old = struct.unpack_from("!H", body, ext_total_at - 9)[0]
    struct.pack_into("!H", body, ext_total_at - 9, old + len(ext))
    msg = bytes([1]) + len(body).to_bytes(3, "big") + bytes(body)
    record = bytes([22]) + bytes(hello[1:3]) + struct.pack("!H", len(msg)) + msg
    assert client_hello_sni(bytes(hello)) == "api.test"
    with pytest.raises(SniError, match="encrypted ClientHello"):
        client_hello_sni(record)


def test_expect_continue_is_answered_after_the_decision(upstream, tmp_path):
    up = upstream()
    sb, _ = _web_sandbox(up, tmp_path)
    raw = (f"POST /ok/post HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\nConnection: close\r\n"
           "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n").encode()
    r = run_py(sb, RAW, str(up.port), raw.hex(), "continue")
    assert r.stdout.decode().split() == ["100", "200"], r.stderr[-300:]
    assert up.seen == [("POST", "/ok/post", b"post=ok")]


def test_http_rules_need_the_endpoint_policy_too(upstream, tmp_path):
    """A request the HTTP rules allow still needs its destination admitted."""
    up = upstream()
    sb = sandbox(net_allow=["127.0.0.1:1"], http_allow=["* *"], http_ports=[up.port])
    r = sb.run(["curl", "-sS", f"http://127.0.0.1:{up.port}/ok/x"], timeout=30)
    assert r.exit_code == 7 and up.seen == []  # curl: couldn't connect


# -- HTTPS without interception: decided on the SNI -----------------------------------------

@pytest.fixture
def tls_upstream(upstream, tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("api.test", "other.test")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    up = upstream(tls_context=ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    os.chmod(tmp_path, 0o755)
    os.chmod(ca_file, 0o644)
    return up, str(ca_file)


def test_https_sni_allows_one_host_and_refuses_another(tls_upstream, tmp_path):
    from dnsserver import TestDnsServer
    up, ca = tls_upstream
    dns = TestDnsServer({"api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    log = tmp_path / "audit.jsonl"
    sb = sandbox(fs_readable=[ca], net_allow=[f"api.test:{up.port}", f"other.test:{up.port}"],
                 net_allow_private=True, dns_servers=[dns.address],
                 http_allow=["* api.test"], http_ports=[up.port], audit_log=str(log))
    r = sb.run(["curl", "-sS", "--cacert", ca, f"https://api.test:{up.port}/ok/tls"],
               timeout=30)
    assert r.success and r.stdout == b"hello /ok/tls", r.stderr
    r = sb.run(["curl", "-sS", "--cacert", ca, f"https://other.test:{up.port}/ok/tls"],
               timeout=30)
    assert not r.success and up.paths() == ["/ok/tls"]
    denied = [rec for rec in _records(log) if rec["decision"] == "deny"]
    assert denied[-1]["host"] == "other.test" and denied[-1]["protocol"] == "tls"
    assert "no rule allows HTTPS to other.test" in denied[-1]["reason"]


def test_https_path_rule_without_interception_is_refused_and_says_why(tls_upstream,
                                                                      tmp_path):
    from dnsserver import TestDnsServer
    up, ca = tls_upstream
    dns = TestDnsServer({"api.test": ["127.0.0.1"]})
    log = tmp_path / "audit.jsonl"
    sb = sandbox(fs_readable=[ca], net_allow=[f"api.test:{up.port}"], net_allow_private=True,
                 dns_servers=[dns.address], http_allow=["GET api.test/ok/*"],
                 http_ports=[up.port], audit_log=str(log))
    r = sb.run(["curl", "-sS", "--cacert", ca, f"https://api.test:{up.port}/ok/tls"],
               timeout=30)
    assert not r.success and up.seen == []
    [rec] = [rec for rec in _records(log) if rec["decision"] == "deny"]
    assert "interception is required" in rec["reason"]


# -- one destination, many names (review finding 4) ---------------------------------------

def test_ip_literal_host_meets_the_deny_rules_of_the_name(upstream, tmp_path):
    """Host: 127.0.0.1 or [::ffff:127.0.0.1] on a connection to api.test's address is judged
    under api.test too: /admin and POST never reach the server; GET /public does."""
    from dnsserver import TestDnsServer
    up = upstream()
    dns = TestDnsServer({"api.test": ["127.0.0.1"]})
    log = tmp_path / "audit.jsonl"
    sb = sandbox(net_allow=[f"api.test:{up.port}"], net_allow_private=True,
                 dns_servers=[dns.address], http_allow=["GET *", "POST *"],
                 http_deny=["* api.test/admin*", "POST api.test/*"], http_ports=[up.port],
                 audit_log=str(log))
    base = f"http://api.test:{up.port}"
    outs = []
    for host in (f"127.0.0.1:{up.port}", f"[::ffff:127.0.0.1]:{up.port}", "api.test"):
        r = sb.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}\n", "-H",
                    f"Host: {host}", f"{base}/admin/users", "-o", "/dev/null", "-d", "x=1",
                    f"{base}/upload"], timeout=30)
        outs.append(r.stdout.split())
    assert outs == [[b"403", b"403"]] * 3, outs
    r = sb.run(["curl", "-s", "-H", f"Host: 127.0.0.1:{up.port}", f"{base}/public"], timeout=30)
    assert r.stdout == b"hello /public"  # positive control
    assert up.seen == [("GET", "/public", b"")]
    denied = [rec for rec in _records(log) if rec["decision"] == "deny"]
    assert len(denied) == 6 and all("api.test" in rec["reason"] for rec in denied)


def test_sni_of_another_name_meets_the_deny_rules_of_the_name(tls_upstream, tmp_path):
    """SNI-only HTTPS: the SNI other.test, on a connection to the address api.test also
    resolved to, meets `* api.test` (the request never reaches the server); SNI 127.0.0.1
    (a literal, which no TLS library sends, so the test writes it into the ClientHello)
    meets it too. Without the deny rule the same request goes through (control)."""
    from dnsserver import TestDnsServer
    up, ca = tls_upstream
    dns = TestDnsServer({"api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    log = tmp_path / "audit.jsonl"
    common = dict(fs_readable=[ca], net_allow=[f"api.test:{up.port}", f"other.test:{up.port}"],
                  net_allow_private=True, dns_servers=[dns.address], http_allow=["* *"],
                  http_ports=[up.port], audit_log=str(log))
    code = f"""
import socket, ssl, sys
ctx = ssl.create_default_context(cafile={ca!r})
s = socket.create_connection(("127.0.0.1", {up.port}))
try:
    t = ctx.wrap_socket(s, server_hostname="other.test")
    t.sendall(b"POST /x HTTP/1.1\\r\\nHost: other.test\\r\\nContent-Length: 1\\r\\n\\r\\nx")
    print(t.recv(100))
except (OSError, ssl.SSLError) as e:
    print("refused", type(e).__name__)
# A ClientHello whose server name is the literal 127.0.0.1
ctx2 = ssl.create_default_context()
ctx2.check_hostname, ctx2.verify_mode = False, ssl.CERT_NONE
inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
obj = ctx2.wrap_bio(inc, out, server_hostname="xxxxxxxxx")
try:
    obj.do_handshake()
except ssl.SSLWantReadError:
    pass
hello = out.read().replace(b"xxxxxxxxx", b"127.0.0.1")
s = socket.create_connection(("127.0.0.1", {up.port}))
s.sendall(hello)
s.settimeout(5)
try:
    n = len(s.recv(100))
except OSError:
    n = 0
print("literal", n)
"""
    r = run_py(sandbox(http_deny=["* api.test"], **common), code)
    assert r.stdout.startswith(b"refused"), r
    assert b"literal 0" in r.stdout  # closed by the filter, nothing relayed
    assert up.seen == []
    denied = [rec for rec in _records(log) if rec["decision"] == "deny"]
    assert [rec["host"] for rec in denied] == ["other.test", "127.0.0.1"], denied
    assert all("also known as api.test" in rec["reason"] for rec in denied)
    r = run_py(sandbox(**common), code)  # control: no deny rule
    assert r.stdout.startswith(b"b'HTTP/1.1 200"), r
    assert up.seen == [("POST", "/x", b"x")]


# -- HTTP rules are never silently off (agent-defaults issue) -----------------------------

def test_dev_port_is_filtered_without_http_port(upstream, tmp_path):
    """`--allow 127.0.0.2:PORT --http-allow 'GET 127.0.0.2/ok/*'` and no --http-port: every
    connection to a host the rules name goes through the filter, whatever its port. POST
    and DELETE never reach the server; GET /ok/ does."""
    import subprocess
    import sys
    up = upstream(host="127.0.0.2")
    base = f"http://127.0.0.2:{up.port}"
    r = subprocess.run([sys.executable, "-m", "sandlock", "net-run", "--allow",
                        f"127.0.0.2:{up.port}", "--http-allow", "GET 127.0.0.2/ok/*",
                        "--audit", str(tmp_path / "a.jsonl"), "--", "sh", "-c",
                        f"curl -s -o /dev/null -w '%{{http_code}} ' {base}/ok/x; "
                        f"curl -s -o /dev/null -w '%{{http_code}} ' -d x=1 {base}/ok/x; "
                        f"curl -s -o /dev/null -w '%{{http_code}}' -X DELETE {base}/ok/x"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.stdout == "200 403 403", (r.stdout, r.stderr)
    assert up.seen == [("GET", "/ok/x", b"")]


def test_http_rules_alone_open_their_host_and_a_port_in_a_rule_works(upstream, tmp_path):
    up = upstream(host="127.0.0.2")
    base = f"http://127.0.0.2:{up.port}"
    sb = sandbox(http_allow=[f"GET 127.0.0.2:{up.port}/ok/*"])  # no net_allow at all
    r = sb.run(["sh", "-c", f"curl -s {base}/ok/a; echo; curl -s -o /dev/null "
                            f"-w '%{{http_code}}' -d x {base}/ok/b"], timeout=30)
    assert r.stdout == b"hello /ok/a\n403", (r.stdout, r.stderr)
    assert up.paths() == ["/ok/a"]
    other = upstream(host="127.0.0.2")  # the same host, a port no rule names: closed
    r = sb.run(["curl", "-sS", f"http://127.0.0.2:{other.port}/ok/a"], timeout=30)
    assert r.exit_code != 0 and other.seen == []
    from sandlock import Sandbox
    p = Sandbox(http_allow=["GET api.example.com/v1/*", "* pypi.org", "GET *.ex.test/*"]).policy
    assert [r.spec for r in p.endpoints.allow] == [
        "tcp://api.example.com:80", "tcp://pypi.org:80", "tcp://pypi.org:443",
        "tcp://*.ex.test:80"]


def test_bytes_that_are_not_http_never_pass_unless_the_endpoint_is_raw(tmp_path, tcp_server):
    """A raw TCP exchange with a host the HTTP rules name is refused (audited); marking the
    endpoint raw relays it (positive control)."""
    srv = tcp_server("127.0.0.2")
    code = ("import socket, sys\ns = socket.create_connection(('127.0.0.2', int(sys.argv[1])))"
            "\ns.sendall(b'\\x00\\x01binary hello')\ns.settimeout(5)\n"
            "try:\n    print(s.recv(3))\nexcept OSError as e:\n    print('closed', e)")
    log = tmp_path / "audit.jsonl"
    sb = sandbox(net_allow=[f"127.0.0.2:{srv.port}"], http_allow=["GET 127.0.0.2/*"],
                 audit_log=str(log))
    r = run_py(sb, code, str(srv.port))
    assert srv.accepted == 0 and not r.stdout.startswith(b"b'ok"), r
    assert any("neither HTTP nor TLS" in rec.get("reason", "") for rec in _records(log))
    raw = sandbox(net_allow=[f"127.0.0.2:{srv.port}"], http_allow=["GET 127.0.0.2/*"],
                  http_raw=[f"127.0.0.2:{srv.port}"])
    r = run_py(raw, code, str(srv.port))
    assert r.stdout.startswith(b"b'ok"), r
    assert srv.accepted == 1


# -- YAML and CLI ------------------------------------------------------------------------

def test_yaml_http_rules_and_errors_name_the_line(tmp_path, upstream):
    from sandlock import PolicyError, Sandbox
    up = upstream()
    good = tmp_path / "good.yaml"
    good.write_text(f"""version: 1
network:
  allow: ["127.0.0.1:{up.port}"]
http:
  allow:
    - methods: [GET]
      host: 127.0.0.1
      path: /ok/*
  ports: [{up.port}]
""")
    sb = Sandbox.from_policy(str(good))
    r = sb.run(["curl", "-sS", f"http://127.0.0.1:{up.port}/ok/y",
                f"http://127.0.0.1:{up.port}/no"], timeout=30)
    assert r.stdout.startswith(b"hello /ok/y") and \
        b"no rule allows GET 127.0.0.1/no" in r.stdout, (r.stdout, r.stderr, up.seen)
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nhttp:\n  allow:\n    - \"GET api.test/a*b\"\n")
    with pytest.raises(PolicyError, match=r"bad.yaml:4: http.allow: .*only at the end"):
        Sandbox.from_policy(str(bad))


def test_cli_http_flags(upstream, tmp_path):
    import subprocess
    import sys
    up = upstream()
    base = f"http://127.0.0.1:{up.port}"
    cmd = [sys.executable, "-m", "sandlock", "run", "--net-allow", f"127.0.0.1:{up.port}",
           "--http-allow", "GET 127.0.0.1/ok/*", "--http-port", str(up.port), "--",
           "/bin/sh", "-c", f"curl -sS -o /dev/null -w '%{{http_code}} ' {base}/ok/1; "
           f"curl -sS -o /dev/null -w '%{{http_code}}' -X DELETE {base}/ok/2"]
    r = subprocess.run(cmd, capture_output=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
                           + [p for p in [os.environ.get("PYTHONPATH")] if p])})
    assert r.stdout.split() == [b"200", b"403"], r.stderr
    assert up.seen == [("GET", "/ok/1", b"")]


# -- property: whatever the encoding, a denied path is never forwarded ---------------------

def test_property_no_encoding_gets_a_denied_path_forwarded(upstream):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from netpolicy.http_path import PathError, normalize_path
    from netpolicy.http_proxy import HttpContext, http_proxy
    up = upstream()
    policy = HttpPolicy.from_rules(["GET 127.0.0.1/ok/*"], ["* 127.0.0.1/ok/secret*"])
    proxy = http_proxy()
    pieces = ["ok", "secret", "admin", "..", ".", "%2e", "%2E%2e", "%2f", "%5c", "%73ecret",
              "se%63ret", "a", "%41", ";x", "\\", "%00", "", "%c3%a9", "%ff", "%", "~", "%7e"]

    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.sampled_from(pieces), min_size=1, max_size=6))
    def check(segments):
        path = "/" + "/".join(segments)
        up.seen.clear()
        c = socket.socket()
        c.bind(("127.0.0.1", 0))
        proxy.expect(c.getsockname(), HttpContext("127.0.0.1", up.port, policy, lambda a: ()))
        c.connect(proxy.address)
        c.settimeout(5)
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\n"
                  "Connection: close\r\n\r\n".encode("latin-1"))
        while c.recv(65536):
            pass
        c.close()
        try:
            normal = normalize_path(path)
        except PathError:
            normal = None
        for _, seen, _ in up.seen:
            # What reached the server is exactly the normalised path, and it is allowed.
            assert seen == normal and policy.decide("GET", "127.0.0.1", seen).allowed
        if normal is None or not policy.decide("GET", "127.0.0.1", normal).allowed:
            assert up.seen == []
    check()


# -- HTTPS interception ----------------------------------------------------------------------

@pytest.fixture
def certs_dir(tmp_path, monkeypatch):
    d = tmp_path / "certs"
    monkeypatch.setenv("SANDLOCK_CERTS_DIR", str(d))
    return d


def _intercepting_sandbox(up, ca_file, tmp_path, rules, **kw):
    from dnsserver import TestDnsServer
    dns = TestDnsServer({"api.test": ["127.0.0.1"]})
    log = tmp_path / "audit.jsonl"
    sb = sandbox(net_allow=[f"api.test:{up.port}"], net_allow_private=True,
                 dns_servers=[dns.address], http_allow=rules, http_ports=[up.port],
                 http_inject_ca=True, http_upstream_ca=ca_file, audit_log=str(log), **kw)
    return sb, log, dns


def test_interception_enforces_path_rules_over_https(tls_upstream, tmp_path, certs_dir):
    up, ca = tls_upstream
    sb, log, _dns = _intercepting_sandbox(up, ca, tmp_path, ["GET api.test/ok/*"])
    base = f"https://api.test:{up.port}"
    # No --cacert: the sandbox trusts Sandlock's CA through the injected bundle.
    r = sb.run(["/bin/sh", "-c", f"curl -sS {base}/ok/1; echo; curl -sS -i -d x=1 {base}/ok/2"],
               timeout=30)
    out = r.stdout.decode()
    assert out.startswith("hello /ok/1\n"), (out, r.stderr)
    assert "403 Forbidden" in out and "no rule allows POST api.test/ok/2" in out
    assert up.seen == [("GET", "/ok/1", b"")]
    denied = [rec for rec in _records(log) if rec["decision"] == "deny"]
    assert denied[0]["protocol"] == "https" and denied[0]["path"] == "/ok/2"
    # A Python client (REQUESTS_CA_BUNDLE / SSL_CERT_FILE) sees the same.
    r = run_py(sb, URLLIB, f"{base}/ok/py", f"{base}/other")
    assert r.stdout.decode().splitlines() == [
        "hello /ok/py", "403 sandlock: no rule allows GET api.test/other"], r.stderr


def test_interception_refuses_an_untrusted_upstream(upstream, tmp_path, certs_dir):
    trustme = pytest.importorskip("trustme")
    bad_ca, good_ca = trustme.CA(), trustme.CA()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    bad_ca.issue_cert("api.test").configure_cert(ctx)  # signed by a CA nobody trusts
    up = upstream(tls_context=ctx)
    trusted = tmp_path / "trusted.pem"
    good_ca.cert_pem.write_to_path(str(trusted))
    sb, log, _dns = _intercepting_sandbox(up, str(trusted), tmp_path, ["* api.test"])
    r = sb.run(["curl", "-sS", f"https://api.test:{up.port}/ok/1"], timeout=30)
    assert not r.success and up.seen == []
    [rec] = [rec for rec in _records(log) if rec["decision"] == "deny"]
    assert "failed verification" in rec["reason"] and rec["host"] == "api.test"


def test_the_ca_private_key_is_not_readable_inside(tls_upstream, tmp_path, certs_dir):
    up, ca = tls_upstream
    os.chmod(tmp_path, 0o755)
    sb, _, _dns = _intercepting_sandbox(up, ca, tmp_path, ["* api.test"],
                                        fs_readable=[str(tmp_path)])
    r = sb.run(["/bin/sh", "-c", f"cat {certs_dir}/sandlock-ca.pem; "
                                 "cat $CURL_CA_BUNDLE | grep -c BEGIN"], timeout=30)
    assert b"PRIVATE KEY" not in r.stdout
    assert r.stderr.count(b"Permission denied") == 1, r.stderr
    assert int(r.stdout.split()[-1]) >= 1  # the public bundle is readable


def test_ca_out_exports_the_certificate_only(tls_upstream, tmp_path, certs_dir):
    up, ca = tls_upstream
    pub = tmp_path / "pub"
    pub.mkdir()
    os.chmod(tmp_path, 0o755)
    out = pub / "exported.pem"
    sb, _, _dns = _intercepting_sandbox(up, ca, tmp_path, ["* api.test"],
                                        http_ca_out=str(out), fs_readable=[str(pub)])
    r = sb.run(["curl", "-sS", "--cacert", str(out), f"https://api.test:{up.port}/ok/out"],
               timeout=30)
    assert r.stdout == b"hello /ok/out", r.stderr  # curl trusts exactly the exported CA
    assert b"PRIVATE" not in out.read_bytes()


NODE_FETCH = """
const urls = process.argv.slice(1);  // node -e: argv[1] is the first argument
(async () => {
  for (const u of urls) {
    try { const r = await fetch(u); console.log(r.status, (await r.text()).trim()); }
    catch (e) { console.log("error", e.cause ? e.cause.code : e.message); }
  }
})();
"""


def test_node_fetch_goes_through_the_filter(upstream, tmp_path):
    import shutil
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    up = upstream()
    sb, _ = _web_sandbox(up, tmp_path, fs_readable=[os.path.dirname(os.path.realpath(node))])
    base = f"http://127.0.0.1:{up.port}"
    r = sb.run([node, "-e", NODE_FETCH, f"{base}/ok/node", f"{base}/admin"], timeout=60)
    assert r.stdout.decode().splitlines() == [
        "200 hello /ok/node", "403 sandlock: no rule allows GET 127.0.0.1/admin"], r.stderr
    assert up.paths() == ["/ok/node"]


def test_certs_cli(certs_dir):
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + [p for p in [os.environ.get("PYTHONPATH")] if p])}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "sandlock", "certs", *args],
                              capture_output=True, text=True, env=env, timeout=60)
    assert cli("path").returncode == 125
    r = cli("init")
    assert r.returncode == 0 and "created CA" in r.stdout
    assert (certs_dir / "sandlock-ca.pem").stat().st_mode & 0o077 == 0
    assert cli("path").stdout.strip() == str(certs_dir / "sandlock-ca-cert.pem")
    pem = cli("export").stdout
    assert pem.startswith("-----BEGIN CERTIFICATE-----") and "PRIVATE" not in pem


NO_SNI = r"""
import socket, ssl, sys
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
try:
    ctx.wrap_socket(s)  # no server_hostname: a ClientHello without SNI
    print("handshake")
except (ssl.SSLError, OSError) as e:
    print("refused")
"""


def test_tls_without_sni_is_refused(tls_upstream, tmp_path):
    up, ca = tls_upstream
    log = tmp_path / "audit.jsonl"
    sb = sandbox(net_allow=[f"127.0.0.1:{up.port}"], http_allow=["* *"],
                 http_ports=[up.port], audit_log=str(log))
    r = run_py(sb, NO_SNI, str(up.port))
    assert r.stdout.split() == [b"refused"] and up.seen == []
    [rec] = [rec for rec in _records(log) if rec["decision"] == "deny"]
    assert "no server name" in rec["reason"]


def test_intercepted_host_must_equal_sni(tls_upstream, tmp_path, certs_dir):
    up, ca = tls_upstream
    sb, log, _dns = _intercepting_sandbox(up, ca, tmp_path, ["* api.test", "* other.test"])
    r = sb.run(["curl", "-sS", "-H", "Host: other.test", f"https://api.test:{up.port}/ok/1"],
               timeout=30)
    assert b"differs from the TLS server name api.test" in r.stdout and up.seen == []


def test_non_ascii_host_is_refused(upstream, tmp_path):
    up = upstream()
    sb, _ = _web_sandbox(up, tmp_path)
    raw = f"GET /ok/x HTTP/1.1\r\nHost: \u00e9xample.test\r\n\r\n".encode("latin-1")
    r = run_py(sb, RAW, str(up.port), raw.hex())
    assert r.stdout.decode().strip() == "400" and up.seen == []


# -- gateway mode: the same rules in a real mitmdump ------------------------------------------

@pytest.mark.skipif(os.environ.get("SANDLOCK_NESTED_UNPRIVILEGED") == "1",
                    reason="no sandbox involved; mitmdump's own dependencies are not copied")
def test_gateway_addon_under_real_mitmdump(upstream, tls_upstream, tmp_path):
    import subprocess
    import sys
    import time
    from conftest import free_port
    up = upstream()
    policy = tmp_path / "gw.yaml"
    policy.write_text("version: 1\nhttp:\n  allow: ['GET 127.0.0.1/ok/*']\n"
                      "  deny: ['* localhost/ok/secret*']\n"
                      "audit:\n  file: gw-audit.jsonl\n")
    port = free_port()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from mitmproxy.tools.main import mitmdump; mitmdump()",
         "-q", "--listen-host", "127.0.0.1", "--listen-port", str(port),
         "--set", f"confdir={tmp_path / 'mitm'}", "-s", os.path.join(root, "netpolicy",
                                                                      "gateway.py"),
         "--set", f"sandlock_policy={policy}", "--set", "ssl_insecure=true",
         "--set", f"sandlock_connect_ports=443,{tls_upstream[0].port}"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [root] + [p for p in [os.environ.get("PYTHONPATH")] if p])}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        proxy = f"http://127.0.0.1:{port}"
        base = f"http://127.0.0.1:{up.port}"

        def curl(*args):
            return subprocess.run(["curl", "-sS", "--noproxy", "", "-x", proxy, *args],
                                  capture_output=True, timeout=30)
        assert curl(f"{base}/ok/1").stdout == b"hello /ok/1"
        r = curl("-i", "-d", "x=1", f"{base}/ok/2")
        assert r.stdout.startswith(b"HTTP/1.1 403") and \
            b"sandlock: no rule allows POST 127.0.0.1/ok/2" in r.stdout
        assert curl(f"{base}/ok/%2e%2e/admin").stdout.startswith(b"sandlock: no rule allows")
        r = curl("-H", "Host: other.test", f"{base}/ok/3")  # the URL's host decides
        assert b"differs from the destination" in r.stdout
        tls_up, _ = tls_upstream
        mitm_ca = str(tmp_path / "mitm" / "mitmproxy-ca-cert.pem")
        # Through the tunnel to 127.0.0.1 with Host 127.0.0.1 but SNI api.test: refused.
        r = curl("--cacert", mitm_ca, "-H", f"Host: 127.0.0.1:{tls_up.port}", "--connect-to",
                 f"api.test:{tls_up.port}:127.0.0.1:{tls_up.port}",
                 f"https://api.test:{tls_up.port}/ok/sni")
        assert b"TLS server name api.test differs" in r.stdout, r.stderr
        assert tls_up.seen == []
        # The target's address is localhost's (/etc/hosts): the deny rule naming localhost
        # applies to the IP-literal URL too.
        r = curl("-i", f"{base}/ok/secret-1")
        assert r.stdout.startswith(b"HTTP/1.1 403") and b"localhost" in r.stdout, r.stdout
        r = curl("https://nowhere.test/")  # CONNECT to a host no rule admits
        assert r.returncode != 0 and b"403" in r.stderr
        assert up.paths() == ["/ok/1"]
        recs = _records(tmp_path / "gw-audit.jsonl")
        assert [(r.get("method"), r.get("path")) for r in recs[:2]] == [
            ("POST", "/ok/2"), ("GET", "/admin")]
        assert recs[-1]["protocol"] == "connect" and recs[-1]["host"] == "nowhere.test"
    finally:
        proc.terminate()
        proc.wait(10)


class EchoUpgrade:
    """Accepts `Upgrade: websocket` with a 101, then echoes bytes; records request lines."""

    def __init__(self):
        self.seen = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        with c:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = c.recv(4096)
                if not chunk:
                    return
                head += chunk
            line = head.split(b"\r\n")[0]
            self.seen.append(line.decode())
            if line.startswith(b"CONNECT "):
                c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            elif not line.startswith(b"PRI "):
                token = [h.split(b":", 1)[1].strip() for h in head.split(b"\r\n")
                         if h.lower().startswith(b"upgrade:")][0]
                c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + token +
                          b"\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n")
            rest = head.split(b"\r\n\r\n", 1)[1]
            while True:
                if rest:
                    c.sendall(b"echo:" + rest)
                rest = c.recv(4096)
                if not rest:
                    return

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
        except OSError:
            pass
        self.sock.close()


@pytest.fixture
def echo_upgrade():
    srv = EchoUpgrade()
    yield srv
    srv.close()


WS = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(f"GET {sys.argv[2]} HTTP/1.1\r\nHost: 127.0.0.1:{sys.argv[1]}\r\nConnection: Upgrade\r\n"
          "Upgrade: websocket\r\nSec-WebSocket-Key: abc\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    chunk = s.recv(4096)
    if not chunk:
        break
    head += chunk
print(head.split(b"\r\n")[0].decode())
if b" 101 " in head.split(b"\r\n")[0]:
    s.sendall(b"ping")
    print(s.recv(100).decode())
"""


@pytest.mark.parametrize("upgrades, path, expect, seen", [
    (None, "/ok/ws", ["HTTP/1.1 403 Forbidden"], []),
    (["websocket"], "/ok/ws", ["HTTP/1.1 101 Switching Protocols", "echo:ping"],
     ["GET /ok/ws HTTP/1.1"]),
    (["websocket"], "/admin/ws", ["HTTP/1.1 403 Forbidden"], []),  # rules still apply
])
def test_websocket_only_when_allowed(upgrades, path, expect, seen, echo_upgrade):
    srv = echo_upgrade
    sb = sandbox(net_allow=[f"127.0.0.1:{srv.port}"], http_allow=["GET 127.0.0.1/ok/*"],
                 http_ports=[srv.port], http_upgrades=upgrades)
    r = run_py(sb, WS, str(srv.port), path)
    assert r.stdout.decode().splitlines() == expect, r.stderr
    assert srv.seen == seen


def test_only_known_upgrades_can_be_allowed():
    from sandlock import PolicyError
    with pytest.raises(PolicyError, match="http_upgrades: expected a list of websocket"):
        sandbox(net_allow=[":80"], http_allow=["* *"], http_upgrades=["spdy"])


SWITCH = r"""
import socket, sys
port, kind = int(sys.argv[1]), sys.argv[2]
s = socket.create_connection(("127.0.0.1", port), timeout=5)
if kind == "h2":
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nping")
else:
    if kind == "connect":
        req = f"CONNECT {sys.argv[3]} HTTP/1.1\r\nHost: {sys.argv[3]}\r\n\r\n"
    else:
        req = (f"GET /ok/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\n"
               "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n")
    s.sendall(req.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    print(head.split(b"\r\n")[0].decode())
    if b" 101 " not in head and b" 200 " not in head:
        sys.exit(0)
    s.sendall(b"ping")
try:
    print(repr(s.recv(100).decode() or "closed")[1:-1])
except OSError as e:
    print("error", e)
"""


@pytest.mark.parametrize("kind, allowed, args, expect, seen", [
    ("connect", False, ["tunnel.test:443"], ["HTTP/1.1 403 Forbidden"], []),
    ("connect", True, ["tunnel.test:443"],
     ["HTTP/1.1 200 Connection established", "echo:ping"], ["CONNECT tunnel.test:443 HTTP/1.1"]),
    ("connect", True, ["elsewhere.test:443"], ["HTTP/1.1 403 Forbidden"], []),
    ("h2c", False, [], ["HTTP/1.1 403 Forbidden"], []),
    ("h2c", True, [], ["HTTP/1.1 101 Switching Protocols", "echo:ping"],
     ["GET /ok/x HTTP/1.1"]),
    ("h2", False, [], ["HTTP/1.1 400 Bad Request"], []),
    ("h2", True, [], [r"echo:SM\r\n\r\nping"], ["PRI * HTTP/2.0"]),
])
def test_protocol_switches_only_when_the_policy_names_them(kind, allowed, args, expect,
                                                            seen, echo_upgrade):
    srv = echo_upgrade
    sb = sandbox(net_allow=[f"127.0.0.1:{srv.port}"],
                 http_allow=["GET 127.0.0.1/ok/*", "* tunnel.test"], http_ports=[srv.port],
                 http_upgrades=[kind] if allowed else None)
    r = run_py(sb, SWITCH, str(srv.port), kind, *args)
    out = r.stdout.decode().splitlines()
    assert len(out) == len(expect) and all(o.startswith(e) for o, e in zip(out, expect)), \
        (out, r.stderr)
    assert srv.seen == seen


HOG = r"""
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
time.sleep(0.5)
closed = 0
for s in socks:
    s.setblocking(False)
    try:
        closed += s.recv(1) == b""
    except BlockingIOError:
        pass
print(closed)
sys.stdout.flush()
time.sleep(float(sys.argv[3]))
"""


def test_one_sandbox_cannot_take_every_filter_connection(upstream, tmp_path):
    from netpolicy.http_proxy import PER_SANDBOX
    from sandlock import StdioMode
    up = upstream()
    hog, _ = _web_sandbox(up, tmp_path)
    proc = hog.popen([PY, "-c", HOG, str(up.port), str(PER_SANDBOX + 10), "5"],
                     stdout=StdioMode.PIPED)
    try:
        line = os.read(proc._stdout_fd, 100)
        assert line.strip() == b"10"  # those beyond its share were closed at once
        (tmp_path / "other").mkdir()
        other, _ = _web_sandbox(up, tmp_path / "other")  # another sandbox, meanwhile
        r = other.run(["curl", "-sS", f"http://127.0.0.1:{up.port}/ok/other"], timeout=30)
        assert r.stdout == b"hello /ok/other"
    finally:
        proc.kill()
        proc.close()


TRICKLE = r"""
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
head = f"GET /ok/slow HTTP/1.1\r\nHost: 127.0.0.1:{sys.argv[1]}\r\n\r\n".encode()
start = time.monotonic()
try:
    for b in head:  # one byte every 0.1 s: never idle, never complete in time
        s.sendall(bytes([b]))
        time.sleep(0.1)
    print("sent all", s.recv(100)[:12])
except OSError as e:
    print("cut off after", round(time.monotonic() - start))
"""


def test_a_trickled_request_head_is_cut_off(upstream, tmp_path, monkeypatch):
    import netpolicy.http_proxy as hp
    monkeypatch.setattr(hp, "HEAD_TIMEOUT", 1.0)
    up = upstream()
    sb, _ = _web_sandbox(up, tmp_path)
    r = run_py(sb, TRICKLE, str(up.port))
    assert r.stdout.decode().split()[:3] == ["cut", "off", "after"], r.stdout
    assert int(r.stdout.split()[-1]) <= 3 and up.seen == []


def test_policy_check_reports_rules_that_never_apply_bypasses_and_contradictions(tmp_path):
    import subprocess
    import sys
    pol = tmp_path / "p.yaml"
    pol.write_text("version: 1\nnetwork:\n  allow: ['127.0.0.2:18080', 'db.internal:5432']\n"
                   "  allow_private: true\n"
                   "http:\n  allow: ['GET 127.0.0.2/ok/*', 'GET 10.9.9.9/x']\n")
    r = subprocess.run([sys.executable, "-m", "sandlock", "policy", "check", str(pol)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "'GET 10.9.9.9/x' can never apply" in r.stdout
    assert "TCP to db.internal:5432 bypasses the HTTP rules" in r.stdout
    assert "127.0.0.2:18080 bypasses" not in r.stdout  # named by a rule: filtered
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nhttp:\n  allow: ['GET api.test/v1/*']\n"
                   "  deny: ['* api.test']\n")
    r = subprocess.run([sys.executable, "-m", "sandlock", "policy", "check", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 125 and "can never allow anything" in r.stdout, r.stdout


def test_inject_ca_into_named_bundles_in_place(tls_upstream, tmp_path, certs_dir):
    from sandlock import PolicyError
    """http_inject_ca=[bundle]: programs that read that bundle's path trust the filter's
    CA (shown in place, read-only, in the sandbox's own mount namespace); the file itself
    is unchanged outside, and no CA variables are set."""
    up, ca = tls_upstream
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(open(ca).read())  # trusts only the upstream's CA
    os.chmod(bundle, 0o644)
    url = f"https://api.test:{up.port}/ok/b"
    script = (f"curl -sS --cacert {bundle} {url}; echo; "
              f"echo vars=${{SSL_CERT_FILE:-none}}; echo x >> {bundle} || echo read-only")
    plain, _, _dns = _intercepting_sandbox(up, ca, tmp_path, ["GET api.test/ok/*"],
                                           fs_writable=[str(tmp_path)])
    r = plain.run(["/bin/sh", "-c", script], timeout=30)
    assert "hello /ok/b" not in r.stdout.decode()  # negative control: not trusted
    before = bundle.read_bytes()  # (the control could write it: it is not shown in place)
    sb, _log, _dns2 = _intercepting_sandbox(up, ca, tmp_path, ["GET api.test/ok/*"],
                                            fs_writable=[str(tmp_path)])
    sb.http_inject_ca = [str(bundle)]
    r = sb.run(["/bin/sh", "-c", script], timeout=30)
    out = r.stdout.decode()
    assert out.startswith("hello /ok/b\n"), (out, r.stderr)
    assert "ca-bundles" not in out and "read-only" in out  # no CA variables of ours
    assert bundle.read_bytes() == before
    with pytest.raises(PolicyError, match="is not a file"):
        sandbox(net_allow=["api.test:443"], http_allow=["GET api.test/*"],
                http_inject_ca=[str(tmp_path / "missing.pem")])
