"""What a sandbox chose is never sent raw to a person's terminal (review finding 8).

A sandboxed program picks its own argv, file names and host names; `sandlock audit`, the
dry-run table and error messages quote them. Escape sequences there once cleared the
screen, set the title and forged summary lines. The JSON Lines log stays exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import PY, TcpServer
from netpolicy.text import printable, shell_words

SANDLOCK = [sys.executable, "-m", "sandlock"]
EVIL = "\x1b[2J\x1b]0;owned\x07\r\n0 denied event(s) in /forged\u202e"


def _no_raw_controls(text: str) -> None:
    for ch in text:
        assert ch in "\n" or (ch.isprintable() and ch != "\u202e"), repr(ch)


@pytest.mark.parametrize("raw, shown", [
    ("plain /tmp/x", "plain /tmp/x"),
    ("\x1b[2J", "\\x1b[2J"),
    ("a\nb\rc\td", "a\\x0ab\\x0dc\\x09d"),
    ("back\\slash", "back\\\\slash"),
    ("rtl\u202eexe", "rtl\\u202eexe"),
    ("zero\u200bwidth", "zero\\u200bwidth"),
    ("\x9b31m", "\\x9b31m"),                        # C1 CSI
    (b"bad\xffutf8".decode(errors="surrogateescape"), "bad\\xffutf8"),
    ("ünïcødé ok", "ünïcødé ok"),
])
def test_printable(raw, shown):
    assert printable(raw) == shown


def test_printable_is_injective():
    assert printable("\\x1b") != printable("\x1b")


def test_shell_words_quotes_and_shortens():
    assert shell_words(["curl", "-d", "a b", "x;y"]) == "curl -d 'a b' 'x;y'"
    long = shell_words(["x" * 500])
    assert len(long) <= 120 and long.endswith("…")


def test_audit_of_a_real_denial_with_an_evil_argv(tmp_path):
    """A process whose argv is full of escape sequences is refused a connect; `sandlock
    audit` prints one escaped line for it and the summary, nothing raw; the log is exact."""
    log = tmp_path / "audit.jsonl"
    bad = TcpServer("127.0.0.3")
    code = ("import os, sys; os.execv(sys.executable, [sys.argv[1], '-c', "
            f"'import socket; socket.create_connection((\"127.0.0.3\", {bad.port}))'])")
    try:
        r = subprocess.run(SANDLOCK + ["net-run", "--allow", "127.0.0.2:1", "--audit",
                                       str(log), "--", PY, "-c", code, EVIL],
                           capture_output=True, text=True, cwd=tmp_path)
    finally:
        bad.close()
    assert r.returncode != 0 and bad.accepted == 0
    (rec,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert rec["argv"][0] == EVIL  # exact in the log
    s = subprocess.run(SANDLOCK + ["audit", str(log)], capture_output=True, text=True)
    assert s.returncode == 0
    _no_raw_controls(s.stdout)
    lines = s.stdout.splitlines()
    assert lines[0].count("\\x1b[2J") == 1 and f"tcp 127.0.0.3:{bad.port}" in lines[0]
    # the forged "summary" stays inside the quoted argv, on the denial's own line
    assert [line for line in lines if line.startswith("1 denied event(s)")] == [lines[1]]
    assert not any(line.startswith("0 denied") for line in lines)


def test_dry_run_table_escapes_file_names(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    (work / "keep").write_text("k")
    r = subprocess.run(SANDLOCK + ["run", "--workdir", str(work), "--dry-run", "--", PY, "-c",
                                   f"open({str(work / 'x')!r} + {EVIL.replace('/', '_')!r}, 'w').write('hi')"],
                       capture_output=True, text=True, cwd=work)
    assert r.returncode == 0, r.stderr
    _no_raw_controls(r.stdout + r.stderr)
    assert "\\x1b[2J" in r.stdout and "1 changes: 1 added" in r.stdout
    assert os.listdir(work) == ["keep"]  # dry run: untouched
