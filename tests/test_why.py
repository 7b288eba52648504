"""`sandlock why`: for each distinct denial of an audit log, the rule that decided and the
smallest change that would allow it. Tested by applying each suggested flag to the same
command and running it again: it then passes."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from conftest import PY, sandlock_cli



def _cli(*args):
    return sandlock_cli(*args, timeout=90)


@pytest.fixture
def web(web_recorder):
    srv = web_recorder()
    srv.server_address = ("127.0.0.1", srv.port)
    return srv


def test_why_suggests_a_fix_for_each_kind_that_works_when_applied(tmp_path, web):
    from dnsserver import TestDnsServer
    dns = TestDnsServer({"api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    port = web.server_address[1]
    data = tmp_path / "data"
    data.mkdir()
    (data / "conf.txt").write_text("conf\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(data, 0o755)
    fetch = ("import sys, urllib.request as u\n"
             "r = u.urlopen(u.Request(sys.argv[1], data=b'x' if len(sys.argv) > 2 else None))\n"
             "print(r.read().decode())\n")
    base = ["--dns-server", dns.address, "--net-allow-private"]
    commands = {  # each meets one kind of denial
        "file": (["--explain"], ["cat", str(data / "conf.txt")]),
        "tcp": ([], [PY, "-c", fetch, f"http://127.0.0.1:{port}/a"]),
        "dns": (["--allow", f"api.test:{port}"], [PY, "-c", fetch,
                                                 f"http://other.test:{port}/b"]),
        "http": (["--allow", f"api.test:{port}", "--http-allow", f"GET api.test:{port}/*"],
                 [PY, "-c", fetch, f"http://api.test:{port}/upload", "post"]),
    }
    log = tmp_path / "audit.jsonl"
    for kind, (flags, cmd) in commands.items():
        r = _cli("run", "--audit", str(log), *base, *flags, "--", *cmd)
        assert r.returncode != 0, (kind, r.stdout, r.stderr)
        assert "sandlock why" in r.stderr  # the end-of-run line points to it
    r = _cli("why", str(log), "--json")
    entries = [json.loads(x) for x in r.stdout.splitlines()]
    by_kind = {}
    for e in entries:
        kind = ("file" if e["denied"].startswith("read ") else
                "dns" if e["denied"].startswith("dns ") else
                "http" if e["denied"].startswith("POST ") else "tcp")
        by_kind.setdefault(kind, e)
    assert set(by_kind) == set(commands), entries
    assert by_kind["file"]["fix"]["flag"] == f"-r {data / 'conf.txt'}"
    assert by_kind["tcp"]["fix"]["flag"] == f"--allow 127.0.0.1:{port}"
    assert by_kind["http"]["fix"]["flag"] == f"--http-allow 'POST api.test:{port}/upload'"
    text = _cli("why", str(log)).stdout
    assert "allow with:" in text and "decided by" in text
    # Apply each suggestion to the command that was refused: it now passes.
    for kind, (flags, cmd) in commands.items():
        extra = shlex.split(by_kind[kind]["fix"]["flag"])
        if kind == "dns":  # a name resolves for the hosts rules name, on the port used
            extra = ["--allow", by_kind[kind]["fix"]["flag"].split()[1].replace(
                ":443", f":{port}")]
        r = _cli("run", *base, *flags, *extra, "--", *cmd)
        assert r.returncode == 0, (kind, extra, r.stdout, r.stderr)
    assert ("POST", "/upload") in web.hits
