"""The audit log: one JSON object per line, one line per decision recorded.

Invariant: each record is serialised first and written with a single write() on a file
opened O_APPEND, before the decision is returned to the sandbox; a record therefore lands
whole (concurrent writers, even in other processes, never interleave within a line) and is
in the kernel's page cache, safe from a supervisor killed right after.
"""

from __future__ import annotations

import json
import os
import threading
import time


class AuditLog:
    def __init__(self, path: str, allowed: bool = False):
        self.path = os.path.abspath(path)
        self.log_allowed = allowed
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                           0o600)
        self._lock = threading.Lock()
        self.denied = 0

    def record(self, **fields) -> None:
        if fields.get("decision") == "allow" and not self.log_allowed:
            return
        rec = {"time": round(time.time(), 6), **fields}
        line = (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if fields.get("decision") == "deny":
                self.denied += 1
            os.write(self._fd, line)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __del__(self):  # the log lives as long as the sandboxes and filters that write it
        try:
            self.close()
        except OSError:
            pass


def describe(rec: dict) -> str:
    """What a record was about, in one line of escaped text: `POST api.test/v1`,
    `tcp [::1]:443 (api.test)`, `dns evil.test`, `unix /run/x.sock`, `read /etc/x`."""
    from .text import bracketed, printable
    protocol = rec.get("protocol")
    host = rec.get("host")
    if rec.get("method") is not None or protocol in ("http", "https"):
        target = f"{host or '?'}{rec.get('path') or ''}"
        return printable(f"{rec.get('method') or '?'} {target}")
    if protocol == "dns":
        return f"dns {printable(host or '?')}"
    if protocol == "unix":
        return f"unix {printable(rec.get('path') or '?')}"
    if protocol in ("tcp", "udp", "icmp", "tls", "h2"):
        where = f"{bracketed(rec.get('address', '?'))}:{rec.get('port', '?')}"
        return f"{protocol} {where}" + (f" ({printable(host)})" if host else "")
    if rec.get("access") is not None:  # a file access
        return f"{printable(rec['access'])} {printable(rec.get('path') or '?')}"
    return printable(rec.get("syscall") or "?")


def _line(rec: dict) -> str:
    from .text import printable, shell_words
    when = rec.get("time")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(
        when, (int, float)) else "?"
    argv = rec.get("argv") or []
    who = shell_words(argv, 60) if argv else "?"
    why = printable(rec.get("reason") or "")
    return (f"{stamp}  pid {rec.get('pid', '?')}  {who}  {describe(rec)}  "
            f"[{printable(rec.get('rule', '?'))}]" + (f"  {why}" if why else ""))


def summarize(path: str, top: int = 10, lines: bool = True) -> str:
    """A readable account of an audit log: one line per denial (unless `lines` is False),
    then totals, top denied destinations, by process and by rule. Everything that came
    from a sandbox is escaped (netpolicy.text)."""
    from collections import Counter
    from .text import printable, shell_words
    dests, procs, rules = Counter(), Counter(), Counter()
    total = bad = 0
    out = []
    with open(path, "rb") as f:
        for raw in f:
            try:
                rec = json.loads(raw)
            except ValueError:
                bad += 1
                continue
            if not isinstance(rec, dict) or rec.get("decision") != "deny":
                continue
            total += 1
            if lines:
                out.append(_line(rec))
            dests[describe(rec)] += 1
            argv = rec.get("argv") or []
            procs[shell_words(argv[:3], 60) if argv else f"pid {rec.get('pid')}"] += 1
            rules[printable(rec.get("rule", "?"))] += 1
    out.append(f"{total} denied event(s) in {printable(path)}"
               + (f" ({bad} unreadable lines)" if bad else ""))
    for title, counter in (("top denied", dests), ("by process", procs), ("by rule", rules)):
        if counter:
            out.append(f"{title}:")
            out += [f"  {n:6d}  {k}" for k, n in counter.most_common(top)]
    return "\n".join(out)
