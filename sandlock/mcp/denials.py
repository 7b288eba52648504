"""A tool call's denials as structured content: what was denied, why, the rule or default
that decided, and the policy change that would allow it (when there is one to suggest).

Sources: the call's audit records (network, DNS and HTTP decisions, the audit log's own
schema, kept whole under "record"), the supervisor's other refusals (Result.denials:
metadata changes, the user-file guard, workspace calls), and the file tools' own refusals
and Landlock's EACCES (built here by `file_denial`). Everything a sandbox chose (paths,
hosts, argv) is data, quoted as is in JSON; the one-line summaries are escaped.
"""

from __future__ import annotations

import time

MAX_ARG = 200   # characters kept of each argv entry in a returned record


def collect(records: list[dict], refusals: list[dict], tool: str, source: str,
            sandbox: str | None = None) -> list[dict]:
    """Denials from a call's audit records and the supervisor's other refusals (whose
    records, made here in the audit log's schema, the caller appends to the audit log)."""
    from .runner import MAX_RECORDS
    out = []
    audited = set()
    seen: dict[tuple, dict] = {}  # the same refusal again (a retry, an A and AAAA query)
    for rec in records:
        if rec.get("decision") != "deny":
            continue
        audited.add((rec.get("pid"), rec.get("reason")))
        key = (rec.get("pid"), rec.get("protocol"), rec.get("reason"), rec.get("rule"))
        if key in seen:
            seen[key]["count"] += 1
        elif len(out) < MAX_RECORDS:
            seen[key] = _from_record(rec, tool, source)
            out.append(seen[key])
    for d in refusals:
        if (d.get("pid"), d.get("reason")) in audited or len(out) >= MAX_RECORDS:
            continue  # the audit record of the same refusal says more
        rec = {"time": d.get("time"), "decision": "deny", "sandbox": sandbox,
               **_trimmed(d), "rule": "supervisor"}
        out.append({"denied": f"{d.get('syscall', '?')} (pid {d.get('pid', '?')})",
                    "kind": "syscall", "reason": d.get("reason"), "decided_by": "supervisor",
                    "allow_with": None, "record": rec})
    return out


def _trimmed(rec: dict) -> dict:
    rec = dict(rec)
    argv = rec.get("argv")
    if isinstance(argv, list):
        rec["argv"] = [a if not isinstance(a, str) or len(a) <= MAX_ARG
                       else a[:MAX_ARG] + "..." for a in argv[:20]]
    return rec


def _from_record(rec: dict, tool: str, source: str) -> dict:
    from netpolicy.audit import describe
    protocol = rec.get("protocol")
    return {"denied": describe(rec), "kind": protocol or "syscall",
            "reason": rec.get("reason"), "decided_by": rec.get("rule"),
            "allow_with": _fix(rec, tool, source), "count": 1, "record": _trimmed(rec)}


def _fix(rec: dict, tool: str, source: str) -> dict | None:
    """The policy change that would allow what `rec` denied, if one is known
    (sandlock.why), and where it goes."""
    from ..why import fix
    f = fix(rec)
    return {"policy": source, "tool": tool, **f} if f is not None else None


def file_denial(action: str, path: str, reason: str, tool: str, source: str,
                grant: str | None, decided_by: str, sandbox: str | None = None) -> dict:
    """A file tool's refusal (decided_by "workspace": a path leading out of it) or the
    sandbox's ("landlock": EACCES inside). `grant`: the key that would allow it, if any."""
    from netpolicy.text import printable
    fix = {"policy": source, "tool": tool, "key": grant, "add": path} if grant else None
    return {"denied": f"{action} {printable(path)}", "kind": "file", "reason": reason,
            "decided_by": decided_by,
            "allow_with": fix,
            "record": {"time": round(time.time(), 6), "decision": "deny", "sandbox": sandbox,
                       "access": action, "path": path, "rule": decided_by, "reason": reason}}


def summary(denials: list[dict]) -> str:
    """Lines for the text content: one per denial."""
    from netpolicy.text import printable
    lines = []
    for d in denials:
        line = f"denied: {d['denied']}"
        if d.get("reason"):
            line += f" ({printable(str(d['reason']))})"
        fix = d.get("allow_with")
        if fix:
            where = printable(str(fix["policy"])) if fix["policy"] != "defaults" else \
                f"a policy for the {fix['tool']} tool (--policy FILE: tools.{fix['tool']})"
            line += f"; to allow it: add {printable(str(fix['add']))!r} to {fix['key']} " \
                    f"in {where}"
        lines.append(line)
    return "\n".join(lines)
