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


def summarize(path: str, top: int = 10) -> str:
    """A readable summary of an audit log: totals, top denied destinations, by process."""
    from collections import Counter
    dests, procs, rules = Counter(), Counter(), Counter()
    total = bad = 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                rec = json.loads(raw)
            except ValueError:
                bad += 1
                continue
            if rec.get("decision") != "deny":
                continue
            total += 1
            host = rec.get("host")
            dest = f"{rec.get('protocol', '?')} {rec.get('address', '?')}:{rec.get('port', '?')}"
            dests[dest + (f" ({host})" if host else "")] += 1
            argv = rec.get("argv") or []
            procs[" ".join(argv[:3]) or f"pid {rec.get('pid')}"] += 1
            rules[rec.get("rule", "?")] += 1
    lines = [f"{total} denied event(s) in {path}" + (f" ({bad} unreadable lines)" if bad else "")]
    for title, counter in (("top denied destinations", dests), ("by process", procs),
                           ("by rule", rules)):
        if counter:
            lines.append(f"{title}:")
            lines += [f"  {n:6d}  {k}" for k, n in counter.most_common(top)]
    return "\n".join(lines)
