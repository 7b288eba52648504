"""Credential injection: secrets the HTTP filter adds to requests, which never enter the
sandbox. Real clients (curl, Python) in sandboxes, a real HTTPS server on loopback behind
a real DNS server, that records every request's headers and body."""

from __future__ import annotations

import base64
import http.server
import json
import os
import secrets
import ssl
import subprocess
import sys
import threading

import pytest

from conftest import PY, sandbox
from netpolicy.credentials import (CredentialError, Credentials, Identity, Refused,
                                   parse_auth_rule)
from sandlock import PolicyError, SandlockError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CURL = "/usr/bin/curl"


# -- rules and their application, pure ----------------------------------------------------

def _apply(creds, headers=(), query=None, method="GET", host="api.test", path="/v1/x",
           tls=True, identity=None):
    hdrs = {}
    for n, v in headers:
        hdrs.setdefault(n.decode(), []).append(v.decode())
    return creds.apply(method, host, path, 443, query, {}, hdrs, list(headers), tls,
                       (lambda: [identity]) if identity is not None else None)


def test_rule_forms_and_errors():
    r = parse_auth_rule("GET api.test/v1/* header:X-Api-Key K for=/bin/true,/bin/false "
                        "swap=query,body")
    assert (r.scheme, r.param, r.credential, r.executables, r.swap) == (
        "header", "x-api-key", "K", ("/bin/true", "/bin/false"), frozenset({"query", "body"}))
    m = parse_auth_rule({"methods": ["POST"], "host": "api.test", "path": "/up",
                         "scheme": "query:key", "credential": "K", "allow_cleartext": True})
    assert (m.scheme, m.param, m.allow_cleartext, m.match.path) == ("query", "key", True, "/up")
    for bad, msg in [("GET api.test bearer", "expected 'METHOD host/path SCHEME NAME'"),
                     ("GET api.test/* token K", "unknown scheme"),
                     ("GET api.test/* header: K", "header: needs a name"),
                     ("GET api.test/* header:Host K", "cannot carry a credential"),
                     ("GET api.test/* bearer K swap=headers", "is not one of"),
                     ("GET api.test/* bearer K always", "unknown option"),
                     ({"host": "api.test", "scheme": "bearer"}, "missing credential")]:
        with pytest.raises(CredentialError, match=msg):
            parse_auth_rule(bad)


def test_injection_replaces_and_placeholders_are_swapped_or_refused():
    rules = [parse_auth_rule("GET api.test/v1/* bearer A"),
             parse_auth_rule("* api.test/v1/* header:X-Key B swap=query")]
    c = Credentials(rules, {"A": "secret-a", "B": "secret-b"},
                    {"A": "ph-a-123", "B": "ph-b-456"})
    a = _apply(c, [(b"authorization", b"Bearer mine"), (b"authorization", b"Bearer two"),
                   (b"x-key", b"ph-b-456")], query="k=ph-b-456&x=1")
    assert [v for n, v in a.headers if n == b"authorization"] == [b"Bearer secret-a"]
    assert [v for n, v in a.headers if n == b"x-key"] == [b"secret-b"]
    assert a.query == "k=secret-b&x=1" and set(a.injected) == {"A", "B"}
    assert {b"secret-a", b"secret-b", base64.b64encode(b"secret-a")} <= set(a.redact)
    assert (b"accept-encoding", b"identity") in a.headers  # an echo cannot come compressed
    # Outside every rule: nothing is added, and a placeholder refuses the request.
    assert _apply(c, [(b"accept", b"*/*")], host="other.test").injected == ()
    with pytest.raises(Refused, match="placeholder of credential A was sent in the header "
                                      "authorization of GET other.test/v1/x, which no rule"):
        _apply(c, [(b"authorization", b"Bearer ph-a-123")], host="other.test")
    basic = base64.b64encode(b"user:ph-a-123")
    with pytest.raises(Refused, match="credential A"):  # inside a Basic header too
        _apply(c, [(b"authorization", b"Basic " + basic)], path="/v2/")
    with pytest.raises(Refused, match="query string"):
        _apply(c, query="token=ph-b-456", path="/v2/")
    with pytest.raises(Refused, match="cleartext HTTP"):
        _apply(c, tls=False)
    # The secret is in no refusal text.
    try:
        _apply(c, [(b"authorization", b"Bearer ph-a-123")], host="other.test")
    except Refused as e:
        assert "secret" not in str(e)


def test_upstream_spellings_add_only_and_encoded_placeholders():
    rules = [parse_auth_rule("GET api.test/b/* basic:alice A"),
             parse_auth_rule("GET api.test/k/* apikey:X-Key A add-only"),
             parse_auth_rule("GET api.test/q/* query:key A replace")]
    c = Credentials(rules, {"A": "pw"}, {"A": "ph-a-123"})
    a = _apply(c, path="/b/1")
    assert a.headers == [(b"authorization", b"Basic " + base64.b64encode(b"alice:pw")),
                         (b"accept-encoding", b"identity")]
    assert base64.b64encode(b"alice:pw") in a.redact
    assert _apply(c, [(b"x-key", b"mine")], path="/k/1").headers == [(b"x-key", b"mine")]
    assert _apply(c, path="/k/1").headers[0] == (b"x-key", b"pw")
    # The parameter is recognised however its name is spelt, `?key` without a value too.
    assert _apply(c, query="%6Bey=child&a=1&key", path="/q/1").query == "a=1&key=pw"
    with pytest.raises(CredentialError, match="RFC 7617"):
        parse_auth_rule("GET api.test/* basic:a:b A")
    # A placeholder percent-encoded in a query, in a path or a header name is found too.
    for kw in (dict(query="t=%70h-a-123"), dict(path="/x/ph-a-123"),
               dict(path="/x/%70h-a-123"),
               dict(headers=[(b"ph-a-123", b"1")])):
        with pytest.raises(Refused, match="credential A"):
            _apply(c, **{"host": "other.test", **kw})


def test_binding_to_a_program():
    rule = parse_auth_rule(f"GET api.test/* bearer A for={CURL}")
    c = Credentials([rule], {"A": "s3"}, {"A": "ph-a"})
    st = os.stat(CURL)
    curl = Identity((st.st_dev, st.st_ino), CURL)
    other = Identity((os.stat(PY).st_dev, os.stat(PY).st_ino), PY)
    assert _apply(c, identity=curl).injected == ("A",)
    a = _apply(c, identity=other)
    assert a.injected == () and a.withheld == ("A",)
    assert _apply(c, identity=Identity(curl.exe, CURL, ("LD_PRELOAD=",))).injected == ()
    with pytest.raises(Refused, match=f"from {PY}, a program its rule does not name"):
        _apply(c, [(b"authorization", b"Bearer ph-a")], identity=other)


# -- a real HTTPS server -------------------------------------------------------------------

class Recorder:
    """HTTP(S) server recording (method, path, headers, body); /echo returns the
    Authorization header it received."""

    def __init__(self, tls_context=None):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen.append((self.command, self.path,
                             {k.lower(): v for k, v in self.headers.items()},
                             self.headers.get_all("Authorization") or [], body))
                reply = (self.headers.get("Authorization", "") if self.path == "/v1/echo"
                         else "ok " + self.path).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket.setblocking(False)
        if tls_context is not None:
            self.server.socket = tls_context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def web(tmp_path, monkeypatch):
    """(https server for api.test and other.test, plain http server, CA file, DNS)."""
    trustme = pytest.importorskip("trustme")
    from dnsserver import TestDnsServer
    ca = trustme.CA()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("api.test", "other.test").configure_cert(ctx)
    tls, plain = Recorder(ctx), Recorder()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    os.chmod(tmp_path, 0o755)
    os.chmod(ca_file, 0o644)
    monkeypatch.setenv("SANDLOCK_CERTS_DIR", str(tmp_path / "certs"))
    dns = TestDnsServer({"api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    yield tls, plain, str(ca_file), dns
    tls.close()
    plain.close()


def _sb(web, tmp_path, auth, **kw):
    tls, plain, ca, dns = web
    kw.setdefault("credentials", {"TOK": "env:SANDLOCK_TEST_TOKEN"})
    return sandbox(net_allow=[f"api.test:{tls.port}", f"other.test:{tls.port}",
                              f"127.0.0.1:{plain.port}"],
                   net_allow_private=True, dns_servers=[dns.address],
                   http_ports=[tls.port, plain.port], http_inject_ca=True,
                   http_upstream_ca=ca, audit_log=str(tmp_path / "audit.jsonl"),
                   http_auth=auth, **kw)


def _records(tmp_path):
    log = tmp_path / "audit.jsonl"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def token(monkeypatch):
    value = "tok-" + secrets.token_hex(20)
    monkeypatch.setenv("SANDLOCK_TEST_TOKEN", value)
    monkeypatch.setenv("SANDLOCK_TEST_COPY", value)  # the same secret under another name
    return value


def test_the_header_arrives_on_allowed_requests_only_and_replaces_the_clients(
        web, tmp_path, token):
    tls, _, _, _ = web
    sb = _sb(web, tmp_path, ["GET api.test/v1/* bearer TOK"])
    base = f"https://api.test:{tls.port}"
    r = sb.run(["/bin/sh", "-c",
                f"curl -sS -H 'Authorization: Bearer mine' {base}/v1/a; echo; "
                f"curl -sS {base}/v2/b; echo; "
                f"curl -sS https://other.test:{tls.port}/v1/c; echo; "
                f"curl -sS {base}/v1/echo; echo; env"], timeout=60)
    out = r.stdout.decode()
    assert out.splitlines()[:4] == ["ok /v1/a", "ok /v2/b", "ok /v1/c",
                                    "Bearer " + "*" * len(token)], (out, r.stderr)
    seen = {p: auth for _, p, _, auth, _ in tls.seen}
    assert seen["/v1/a"] == [f"Bearer {token}"]      # replaced, not duplicated
    assert seen["/v2/b"] == [] and seen["/v1/c"] == []   # no rule names them
    assert seen["/v1/echo"] == [f"Bearer {token}"]   # sent, and masked on the way back
    # Never inside: not in the environment, under its own name or another.
    assert token not in out and "SANDLOCK_TEST_TOKEN" not in out
    assert "SANDLOCK_TEST_COPY" not in out
    assert token not in (tmp_path / "audit.jsonl").read_text()


def test_placeholder_is_swapped_where_a_rule_names_it_and_refused_elsewhere(
        web, tmp_path, token):
    tls, _, _, _ = web
    sb = _sb(web, tmp_path, ["GET api.test/v1/* bearer TOK"],
             credential_env={"TOK": "API_KEY"})
    r = sb.run(["/bin/sh", "-c",
                f'echo "$API_KEY"; '
                f'curl -sS -H "Authorization: Bearer $API_KEY" '
                f'https://api.test:{tls.port}/v1/ph; echo; '
                f'curl -sS -i -H "Authorization: Bearer $API_KEY" '
                f'https://other.test:{tls.port}/v1/leak'], timeout=60)
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith("sandlock-placeholder-tok-") and token not in lines[0]
    assert lines[1] == "ok /v1/ph", (lines, r.stderr)
    assert any("403 Forbidden" in x for x in lines)
    assert [p for _, p, *_ in tls.seen] == ["/v1/ph"]       # the leak never left
    assert tls.seen[0][3] == [f"Bearer {token}"]
    denied = [x for x in _records(tmp_path) if x["decision"] == "deny"]
    assert denied and denied[0]["rule"] == "credential:TOK" and denied[0]["host"] == \
        "other.test"
    assert token not in (tmp_path / "audit.jsonl").read_text()


def test_a_full_memory_scan_of_the_sandbox_finds_no_secret(web, tmp_path, token):
    """A Python client that used the credential (through its placeholder) stays alive;
    every readable mapping of it is searched for the secret. The placeholder is found
    (so the scan sees the process's data), the secret is not."""
    tls, _, _, _ = web
    sb = _sb(web, tmp_path, ["GET api.test/v1/* bearer TOK"],
             credential_env={"TOK": "API_KEY"})
    code = ("import os, sys, urllib.request as u\n"
            "q = u.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + "
            "os.environ['API_KEY']})\n"
            "print(u.urlopen(q).read().decode(), flush=True)\n"
            "print(open('/proc/self/environ','rb').read().count(b'API_KEY'), flush=True)\n"
            "sys.stdin.read()\n")
    from sandlock import StdioMode
    p = sb.popen([PY, "-c", code, f"https://api.test:{tls.port}/v1/echo"],
                 stdin=StdioMode.PIPED, stdout=StdioMode.PIPED)
    try:
        echoed = p.stdout.readline().decode().strip()
        # The server saw it; the value the client sent (swapped) comes back masked whole.
        assert echoed == "*" * len("Bearer " + token), echoed
        assert p.stdout.readline().strip() == b"1"
        found = _scan(p.pid)
        assert found["placeholder"] and not found["secret"], found
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    assert tls.seen[0][3] == [f"Bearer {token}"]


def _scan(pid: int) -> dict:
    """Search every readable mapping of `pid` and its descendants (ptrace rights: we
    are its ancestor's owner) for the secret and a placeholder."""
    import re
    secret = os.environ["SANDLOCK_TEST_TOKEN"].encode()
    found = {"secret": 0, "placeholder": 0}
    pids = [pid]
    for p in pids:
        try:
            children = open(f"/proc/{p}/task/{p}/children").read().split()
        except OSError:
            children = []
        pids += [int(c) for c in children]
        try:
            maps = open(f"/proc/{p}/maps").read().splitlines()
            mem = open(f"/proc/{p}/mem", "rb", buffering=0)
        except OSError:
            continue
        with mem:
            for line in maps:
                m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
                if not m or "[vvar" in line or "[vsyscall" in line:
                    continue
                start, end = int(m[1], 16), int(m[2], 16)
                try:
                    mem.seek(start)
                    data = mem.read(end - start)
                except OSError:
                    continue
                found["secret"] += data.count(secret)
                found["placeholder"] += data.count(b"sandlock-placeholder-tok-")
    return found


def test_a_credential_bound_to_curl_is_not_sent_for_python(web, tmp_path, token):
    tls, _, _, _ = web
    sb = _sb(web, tmp_path, [f"GET api.test/v1/* bearer TOK for={CURL}"],
             audit_allowed=True)
    url = f"https://api.test:{tls.port}/v1"
    r = sb.run(["/bin/sh", "-c",
                f"curl -sS {url}/curl; echo; "
                f"{PY} -c \"import urllib.request as u; print(u.urlopen('{url}/py').read()"
                f".decode())\"; "
                f"LD_PRELOAD=/lib/x86_64-linux-gnu/libm.so.6 curl -sS {url}/preload"],
               timeout=60)
    assert r.stdout.decode().split() == ["ok", "/v1/curl", "ok", "/v1/py", "ok",
                                         "/v1/preload"], r.stderr
    seen = {p: auth for _, p, _, auth, _ in tls.seen}
    assert seen == {"/v1/curl": [f"Bearer {token}"], "/v1/py": [], "/v1/preload": []}
    withheld = {x["path"]: x.get("credential_withheld") for x in _records(tmp_path)
                if x["decision"] == "allow" and "path" in x}
    assert withheld.get("/v1/py") == "TOK"


def test_schemes_query_header_basic_and_body_swap(web, tmp_path, token, monkeypatch):
    tls, _, _, _ = web
    monkeypatch.setenv("SANDLOCK_TEST_BASIC", "user:" + token)
    sb = _sb(web, tmp_path, ["GET api.test/q/* query:api_key TOK",
                             "GET api.test/h/* header:X-Api-Key TOK",
                             "GET api.test/b/* basic BAS",
                             "POST api.test/up/* bearer TOK swap=body"],
             credentials={"TOK": "env:SANDLOCK_TEST_TOKEN", "BAS": "env:SANDLOCK_TEST_BASIC"},
             credential_env={"TOK": "API_KEY"})
    base = f"https://api.test:{tls.port}"
    r = sb.run(["/bin/sh", "-c",
                f"curl -sS '{base}/q/1?api_key=mine&x=1'; echo; "
                f"curl -sS -H 'X-Api-Key: mine' {base}/h/1; echo; "
                f"curl -sS {base}/b/1; echo; "
                f'curl -sS --data-binary "key=$API_KEY" {base}/up/1; echo; '
                f'curl -sS -i --data-binary "key=$API_KEY" https://other.test:{tls.port}/up/2'],
               timeout=60)
    out = r.stdout.decode()
    # The server echoes the path: the secret in it comes back masked.
    assert out.startswith("ok /q/1?x=1&api_key=" + "*" * len(token)), (out, r.stderr)
    assert "403 Forbidden" in out and "in the body of POST other.test/up/2" in out
    seen = {p.split("?")[0]: (h, b) for _, p, h, _, b in tls.seen}
    assert set(seen) == {"/q/1", "/h/1", "/b/1", "/up/1"}  # /up/2 never completed
    assert [p for _, p, *_ in tls.seen if p.startswith("/q/")] == [
        f"/q/1?x=1&api_key={token}"]  # the client's own api_key replaced
    assert seen["/h/1"][0]["x-api-key"] == token
    assert seen["/b/1"][0]["authorization"] == "Basic " + base64.b64encode(
        f"user:{token}".encode()).decode()
    assert seen["/up/1"][1] == f"key={token}".encode()
    assert seen["/up/1"][0]["content-length"] == str(len(f"key={token}"))


def test_cleartext_is_refused_unless_the_rule_allows_it(web, tmp_path, token):
    _, plain, _, _ = web
    url = f"http://127.0.0.1:{plain.port}"
    sb = _sb(web, tmp_path, ["GET 127.0.0.1/no/* bearer TOK",
                             "GET 127.0.0.1/yes/* bearer TOK allow_cleartext"])
    r = sb.run(["/bin/sh", "-c", f"curl -sS -i {url}/no/1; curl -sS {url}/yes/1"],
               timeout=60)
    out = r.stdout.decode()
    assert "403 Forbidden" in out and "over cleartext HTTP" in out and token not in out
    assert out.endswith("ok /yes/1")
    assert [(p, a) for _, p, _, a, _ in plain.seen] == [("/yes/1", [f"Bearer {token}"])]


def test_sources_file_and_cmd_and_the_file_is_denied_inside(web, tmp_path, token):
    tls, _, _, _ = web
    d = tmp_path / "conf"
    d.mkdir()
    (d / "token").write_text(token + "\n")
    (d / "public").write_text("public\n")
    os.chmod(d, 0o755)
    for f in d.iterdir():
        os.chmod(f, 0o644)
    sb = _sb(web, tmp_path, ["GET api.test/f/* bearer FT", "GET api.test/c/* bearer CT"],
             credentials={"FT": f"file:{d / 'token'}", "CT": f"cmd:/bin/cat {d / 'token'}"},
             fs_readable=[str(d)])
    base = f"https://api.test:{tls.port}"
    r = sb.run(["/bin/sh", "-c", f"cat {d}/public; cat {d}/token; "
                                 f"curl -sS {base}/f/1; echo; curl -sS {base}/c/1"],
               timeout=60)
    assert r.stdout.decode().splitlines() == ["public", "ok /f/1", "ok /c/1"], r.stderr
    assert {p: a for _, p, _, a, _ in tls.seen} == {"/f/1": [f"Bearer {token}"],
                                                    "/c/1": [f"Bearer {token}"]}


def test_fd_source_and_an_unused_credential_is_still_kept_out(web, tmp_path, token,
                                                              monkeypatch):
    tls, _, _, _ = web
    r_fd, w_fd = os.pipe()
    os.write(w_fd, token.encode() + b"\n")
    os.close(w_fd)
    monkeypatch.setenv("SANDLOCK_TEST_UNUSED", "unused-" + token)
    try:
        sb = _sb(web, tmp_path, ["GET api.test/fd/* bearer FD"],
                 credentials={"FD": f"fd:{r_fd}", "SPARE": "env:SANDLOCK_TEST_UNUSED"})
        r = sb.run(["/bin/sh", "-c", f"env; curl -sS https://api.test:{tls.port}/fd/1"],
                   timeout=60)
    finally:
        os.close(r_fd)
    out = r.stdout.decode()
    assert out.endswith("ok /fd/1"), (out, r.stderr)
    assert "SANDLOCK_TEST_UNUSED" not in out and token not in out
    assert tls.seen[0][3] == [f"Bearer {token}"]


def test_policy_errors_are_refused_before_anything_runs(web, tmp_path, token, monkeypatch):
    tls, _, ca, dns = web
    base = dict(net_allow=[f"api.test:{tls.port}"], credentials={"TOK": "env:SANDLOCK_TEST_TOKEN"})
    cases = [
        (dict(http_auth=["GET api.test/* bearer TOK"]), "needs HTTPS interception"),
        (dict(http_auth=["GET api.test/* bearer NOPE"], http_inject_ca=True),
         "no credential named NOPE"),
        (dict(http_auth=[f"GET api.test/* bearer TOK for={tmp_path}/tool"],
              http_inject_ca=True), "is not an executable file"),
        (dict(credentials={"TOK": "vault:x"}, http_auth=["GET api.test/* bearer TOK "
                                                         "allow_cleartext"]),
         "expected env:VAR, file:PATH, fd:N or cmd:COMMAND"),
        (dict(credentials={"TOK": "fd:1"}, http_auth=["GET api.test/* bearer TOK "
                                                       "allow_cleartext"]),
         "other than 1 and 2"),
    ]
    for extra, msg in cases:
        with pytest.raises(PolicyError, match=msg):
            sandbox(**{**base, **extra})
    tool = tmp_path / "w" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    with pytest.raises(PolicyError, match="is a script, which runs as its interpreter"):
        sandbox(**base, http_auth=[f"GET api.test/* bearer TOK for={tool}"],
                http_inject_ca=True)
    import shutil
    shutil.copy("/bin/true", tool)
    with pytest.raises(PolicyError, match="the sandbox could replace the program"):
        sandbox(**base, http_auth=[f"GET api.test/* bearer TOK for={tool}"],
                http_inject_ca=True, fs_writable=[str(tool.parent)])
    monkeypatch.delenv("SANDLOCK_TEST_TOKEN")
    sb = _sb(web, tmp_path, ["GET api.test/* bearer TOK"])
    with pytest.raises(SandlockError, match="SANDLOCK_TEST_TOKEN is not set"):
        sb.run(["/bin/true"], timeout=30)
    with pytest.raises(PolicyError, match="credentials cannot be used with COW clones"):
        monkeypatch.setenv("SANDLOCK_TEST_TOKEN", token)
        _sb(web, tmp_path, ["GET api.test/* bearer TOK"], init_fn=lambda: None,
            work_fn=lambda i: None).fork(1)


def _cli(*args, env=None, **kw):
    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "sandlock", *args], env=e,
                          capture_output=True, timeout=90, **kw)


def test_cli_flags_and_yaml_policy(web, tmp_path, token):
    tls, _, ca, dns = web
    url = f"https://api.test:{tls.port}/v1/cli"
    flags = ["--allow", f"api.test:{tls.port}", "--net-allow-private",
             "--dns-server", dns.address, "--http-port", str(tls.port), "--http-inject-ca",
             "--http-upstream-ca", ca]
    r = _cli("run", *flags, "--credential", "TOK=env:SANDLOCK_TEST_TOKEN",
             "--credential-env", "TOK=API_KEY",
             "--http-auth", "GET api.test/v1/* bearer TOK", "--",
             "/bin/sh", "-c", f'curl -sS -H "Authorization: Bearer $API_KEY" {url}')
    assert r.returncode == 0 and r.stdout == b"ok /v1/cli", r.stderr
    assert tls.seen[-1][3] == [f"Bearer {token}"]
    r = _cli("run", *flags, "--credential", "TOK", "--", "/bin/true")
    assert r.returncode != 0 and b"--credential 'TOK': expected NAME=env:VAR" in r.stderr
    policy = tmp_path / "api.yaml"
    policy.write_text(f"""version: 1
network: {{allow: ["api.test:{tls.port}"], allow_private: true}}
dns: {{servers: ["{dns.address}"]}}
credentials:
  TOK: {{source: env:SANDLOCK_TEST_TOKEN, env: API_KEY}}
http:
  ports: [{tls.port}]
  inject_ca: true
  upstream_ca: {ca}
  auth:
    - {{methods: [GET], host: api.test, path: /v1/*, scheme: bearer, credential: TOK}}
""")
    r = _cli("run", "--policy", str(policy), "--", "/bin/sh", "-c",
             f'curl -sS -H "Authorization: Bearer $API_KEY" {url}')
    assert r.returncode == 0 and r.stdout == b"ok /v1/cli", r.stderr
    assert tls.seen[-1][3] == [f"Bearer {token}"]
    r = _cli("policy", "check", str(policy))
    assert r.returncode == 0 and token.encode() not in r.stdout + r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(policy.read_text().replace("scheme: bearer", "scheme: token"))
    r = _cli("policy", "check", str(bad))
    assert r.returncode != 0 and f"{bad}:11: http.auth".encode() in r.stderr, r.stderr


# -- attacks from the review (each failed the promise before its fix) ------------------------

USE_FD = r'''
import os, socket, ssl
s = socket.socket(fileno=int(os.environ["HJ_FD"]))
host, port = os.environ["HJ_HOST"], os.environ["HJ_PORT"]
t = ssl.create_default_context().wrap_socket(s, server_hostname=host)
t.sendall(f"GET /v1/handoff HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
          .encode())
data = b""
while chunk := t.recv(65536):
    data += chunk
print("python got", data.split(b"\r\n")[0].decode())
'''
LAUNCH = r'''
import os, sys
mode, so, host, port, script = sys.argv[1:6]
env = dict(os.environ, HJ_HOST=host, HJ_PORT=port, HJ_EXEC=sys.executable, HJ_SCRIPT=script)
if mode == "scrub":
    env.update(LD_PRELOAD=so, HJ_SCRUB="1")
else:  # an OpenSSL provider: no loader variable at all
    env["OPENSSL_CONF"] = os.path.join(os.path.dirname(so), "evil.cnf")
os.execve("/usr/bin/curl", ["curl", "-sS", f"https://{host}:{port}/v1/never"], env)
'''


@pytest.mark.parametrize("mode", ["scrub", "openssl"])
def test_a_bound_connection_handed_to_another_program_gets_no_secret(web, tmp_path, token,
                                                                      mode):
    """Code loaded into curl (bound) connects while it is curl, then execs python with the
    socket: the credential follows whoever holds the connection at each request, not who
    connected. The kit lies in a read-only grant (code the user installed)."""
    tls = web[0]
    kit = tmp_path / "kit"
    kit.mkdir()
    so = kit / "handoff.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(so),
                    os.path.join(ROOT, "tests", "helpers", "handoff.c")], check=True)
    (kit / "use_fd.py").write_text(USE_FD)
    (kit / "launch.py").write_text(LAUNCH)
    (kit / "evil.cnf").write_text(
        "openssl_conf = init\n[init]\nproviders = prov\n[prov]\nevil = evil_sect\n"
        "default = default_sect\n[default_sect]\nactivate = 1\n"
        f"[evil_sect]\nmodule = {so}\nactivate = 1\n")
    for p in [kit, *kit.iterdir()]:
        os.chmod(p, 0o755)
    sb = _sb(web, tmp_path, [f"GET api.test/v1/* bearer TOK for={CURL}"],
             fs_readable=[str(kit)], audit_allowed=True)
    r = sb.run([PY, str(kit / "launch.py"), mode, str(so), "api.test", str(tls.port),
                str(kit / "use_fd.py")], timeout=60)
    assert "python got HTTP/1.1 200" in r.stdout.decode(), (r.stdout, r.stderr)
    sent = [h.get("authorization") for _, p, h, _, _ in tls.seen if p == "/v1/handoff"]
    assert sent == [None], sent   # the request arrived, without the secret
    withheld = [x for x in _records(tmp_path) if x.get("path") == "/v1/handoff"]
    assert withheld and withheld[0].get("credential_withheld") == "TOK"


def test_code_the_sandbox_could_write_makes_a_process_not_its_program(tmp_path):
    """identify(): executable memory that is not a file, or a file beneath a writable
    path, is named; a plain process has none (the positive control)."""
    from netpolicy.credentials import identify
    from sandlock import StdioMode
    code = ("import mmap, sys\n"
            "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)"
            "\nprint('ready', flush=True)\nsys.stdin.read()\n")
    for jit in (False, True):
        p = sandbox().popen([PY, "-c", code if jit else code.replace(
            " | mmap.PROT_EXEC", "")], stdin=StdioMode.PIPED, stdout=StdioMode.PIPED)
        try:
            assert p.stdout.readline() == b"ready\n"
            who = identify(p.pid, ["/tmp"])
            assert who.exe == (os.stat(PY).st_dev, os.stat(PY).st_ino)
            if jit:  # shared anonymous memory shows as "/dev/zero (deleted)"
                assert len(who.problems) == 1 and who.problems[0].startswith(
                    "executable memory "), who
            else:
                assert who.problems == (), who
            assert identify(p.pid, [os.path.dirname(os.path.realpath(PY))]).problems[:1] \
                == (f"code from {os.path.realpath(PY)}, which the sandbox may write",)
        finally:
            p.stdin.close()
            p.wait(timeout=10)


def test_echoes_in_other_spellings_are_masked_too(web, tmp_path, token, monkeypatch):
    """The server echoes what it got: a Basic value, a percent-encoded query secret, a
    gzip-compressed echo (identity is asked for; a compressed answer is refused), a
    placeholder swapped inside a client's Basic value."""
    tls, _, _, _ = web
    odd = token + "+/=="
    monkeypatch.setenv("SANDLOCK_TEST_ODD", odd)
    sb = _sb(web, tmp_path, ["GET api.test/v1/echo basic:alice TOK",
                             "GET api.test/q/* query:key ODD",
                             "GET api.test/h/* header:X-Key TOK"],
             credentials={"TOK": "env:SANDLOCK_TEST_TOKEN", "ODD": "env:SANDLOCK_TEST_ODD"},
             credential_env={"TOK": "API_KEY"})
    base = f"https://api.test:{tls.port}"
    r = sb.run(["/bin/sh", "-c",
                f"curl -sS --compressed {base}/v1/echo; echo; curl -sS '{base}/q/1'; echo; "
                f'curl -sS -u "x:$API_KEY" {base}/h/1'], timeout=60)
    out = r.stdout.decode()
    import base64 as b64
    for form in (token, b64.b64encode(f"alice:{token}".encode()).decode(),
                 __import__("urllib.parse").parse.quote(odd, safe=""),
                 b64.b64encode(f"x:{token}".encode()).decode()):
        assert form not in out, (form, out)
    assert "Basic ****" in out and "/q/1?key=****" in out, out
    seen = {p.split("?")[0]: h for _, p, h, _, _ in tls.seen}
    assert seen["/v1/echo"]["authorization"] == "Basic " + b64.b64encode(
        f"alice:{token}".encode()).decode()            # it was sent,
    assert seen["/v1/echo"]["accept-encoding"] == "identity"  # uncompressed,
    assert seen["/h/1"]["authorization"] == "Basic " + b64.b64encode(
        f"x:{token}".encode()).decode()                # and the placeholder swapped


def test_report_only_lets_a_refused_request_through_without_the_secret(web, tmp_path,
                                                                        token):
    """Found by review: in report-only, a request the HTTP rules would refuse was forwarded
    with the credential its auth rule names. It goes through (recorded), bare."""
    tls, _, _, _ = web
    sb = _sb(web, tmp_path, ["GET api.test/v1/* bearer TOK"],
             http_allow=["GET api.test/v1/ok"], report_only=True)
    base = f"https://api.test:{tls.port}"
    r = sb.run(["/bin/sh", "-c", f"curl -sS {base}/v1/ok; echo; curl -sS {base}/v1/no"],
               timeout=60)
    assert r.stdout.decode().split() == ["ok", "/v1/ok", "ok", "/v1/no"], r.stderr
    seen = {p: a for _, p, _, a, _ in tls.seen}
    assert seen == {"/v1/ok": [f"Bearer {token}"], "/v1/no": []}
    assert any(x["decision"] == "would-deny" and x.get("path") == "/v1/no"
               for x in _records(tmp_path))
