"""`sandlock learn`: run a script once and write the smallest policy under which it passes
again — and no wider (a script that reads a sibling directory still fails under it)."""

from __future__ import annotations

import os

import pytest

from conftest import sandlock_cli

PY = "/usr/bin/python3"


def _cli(*args, cwd=None):
    return sandlock_cli(*args, cwd=cwd)


@pytest.fixture
def web(web_recorder):
    srv = web_recorder(b"data")
    srv.server_address = ("127.0.0.1", srv.port)
    return srv


SCRIPT = """\
import sys, urllib.request as u
conf = open(sys.argv[1] + "/app.conf").read().strip()
data = u.urlopen(f"http://api.test:{sys.argv[2]}/v1/data").read().decode()
u.urlopen(u.Request(f"http://api.test:{sys.argv[2]}/v1/upload", data=b"up")).read()
open("result.txt", "w").write(conf + " " + data + "\\n")
print("done")
"""


def test_learn_writes_a_policy_that_passes_and_is_no_wider(tmp_path, web):
    from dnsserver import TestDnsServer
    dns = TestDnsServer({"api.test": ["127.0.0.1"]})
    port = web.server_address[1]
    conf, sibling, work = tmp_path / "conf", tmp_path / "sibling", tmp_path / "work"
    for d in (conf, sibling, work):
        d.mkdir()
    (conf / "app.conf").write_text("setting\n")
    (sibling / "other.conf").write_text("other\n")
    (work / "script.py").write_text(SCRIPT)
    for p in (tmp_path, conf, sibling, work, *conf.iterdir(), *sibling.iterdir(),
              *work.iterdir()):
        os.chmod(p, 0o777 if p.is_dir() else 0o666)
    base = tmp_path / "base.yaml"
    base.write_text(f'version: 1\ndns: {{servers: ["{dns.address}"]}}\n')
    learnt = tmp_path / "learnt.yaml"
    r = _cli("learn", "-p", str(base), "-o", str(learnt), "--", PY, "script.py", str(conf),
             str(port), cwd=work)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert not (work / "result.txt").exists()  # the learning run's writes were discarded
    text = learnt.read_text()
    assert str(conf) in text and f"api.test:{port}" in text, text
    assert f'"POST api.test:{port}/v1/upload"' in text and "# read: app.conf" in text
    assert str(sibling) not in text
    web.hits.clear()
    # The same command under the learnt policy: it passes, for real this time.
    r = _cli("run", "--policy", str(learnt), "--strict", "--", PY, "script.py", str(conf),
             str(port), cwd=work)
    assert r.returncode == 0 and r.stdout == "done\n", (r.stderr, text)
    assert (work / "result.txt").read_text() == "setting data\n"
    assert ("POST", "/v1/upload") in web.hits
    # No wider: the sibling directory stays out of reach, and another path on the API too.
    r = _cli("run", "--policy", str(learnt), "--strict", "--", PY, "-c",
             f"print(open({str(sibling / 'other.conf')!r}).read())", cwd=work)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    r = _cli("run", "--policy", str(learnt), "--strict", "--", PY, "-c",
             f"import urllib.request as u; u.urlopen(u.Request("
             f"'http://api.test:{port}/v1/delete', data=b'x'))", cwd=work)
    assert r.returncode != 0 and ("POST", "/v1/delete") not in web.hits


def test_a_learnt_policy_cannot_be_written_by_the_program_nor_made_too_wide(tmp_path,
                                                                           monkeypatch):
    """Found by review: a file name with a line break added a key to the learnt YAML
    (`write: ["~"]`), and listing or creating in the home directory granted it whole."""
    import yaml
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    for p in (tmp_path, home, work):
        os.chmod(p, 0o777)
    monkeypatch.setenv("HOME", str(home))
    evil = 'a\n    - "~"  #'
    learnt = tmp_path / "learnt.yaml"
    r = _cli("learn", "-o", str(learnt), "--", PY, "-c",
             f"import os\nopen({evil!r}, 'w').write('x')\n"
             f"for op in (lambda: os.listdir({str(home)!r}),\n"
             f"           lambda: open({str(home / 'new.txt')!r}, 'w')):\n"
             f"    try:\n        op()\n    except OSError:\n        pass\n", cwd=work)
    text = learnt.read_text()
    policy = yaml.safe_load(text)  # parses, and holds only what was written on purpose
    fs = policy["filesystem"]
    assert fs.get("write") == [str(work)], text
    assert "/" not in (fs.get("read") or []) and str(home) not in (fs.get("read") or [])
    assert fs["protect"] is True
    assert f"# NOT GRANTED: listing {home}" in text, text
    assert f"granting {home} whole" in text, (text, r.stderr)
