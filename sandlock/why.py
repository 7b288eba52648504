"""Why something was refused, and the smallest policy change that would allow it: for
`sandlock why [AUDIT]`, and for the MCP server's denials (sandlock.mcp.denials).

A suggestion is a suggestion: the person who owns the policy decides. One that would
expose a secret or a persistence vector of the user's says so, and refusals no grant can
fix (malformed requests, quotas, a policy_fn's verdict, a protocol switch) get none.
"""

from __future__ import annotations

import json

# policy key -> (CLI flag, YAML section, YAML key)
_FORMS = {
    "network.allow": ("--allow", "network", "allow"),
    "network.unix": ("--net-allow-unix", "network", "unix"),
    "http.allow": ("--http-allow", "http", "allow"),
    "filesystem.read": ("-r", "filesystem", "read"),
    "filesystem.write": ("-w", "filesystem", "write"),
}
_NO_FIX = ("default:framing", "default:malformed", "default:quota", "default:size", "default:upstream-tls",
           "default:path", "default:protocol", "default:credential-echo", "policy_fn",
           "credential:", "fs_denied:")


def _bracket(address) -> str:
    text = str(address)
    return f"[{text}]" if ":" in text else text


def fix(rec: dict) -> dict | None:
    """{"key", "add", "note"?} for the change that would allow what `rec` denied."""
    protocol = rec.get("protocol")
    host, port, address = rec.get("host"), rec.get("port"), rec.get("address")
    rule = str(rec.get("rule") or "")
    if rule.startswith(_NO_FIX):
        return None
    if rec.get("method") is not None and protocol in ("http", "https"):
        target = host or address or "?"
        if port not in (None, 80, 443):
            target = f"{target}:{port}"
        path = str(rec.get("path") or "/").split("?", 1)[0]
        return {"key": "http.allow", "add": f"{rec['method']} {target}{path}"}
    if protocol == "dns":
        return {"key": "network.allow", "add": f"{host}:443",
                "note": "a name resolves only for hosts a rule names; use the port needed"}
    if protocol == "tls":
        if rule.startswith("default:sni"):
            return None
        return {"key": "network.allow", "add": f"{host or address}:{port or 443}"}
    if protocol in ("tcp", "udp"):
        if protocol == "udp" and port == 53 and not host:
            return {"key": "network.allow", "add": "HOST:PORT",
                    "note": "a DNS query to a server: name the host to reach in "
                            "network.allow, and the supervisor resolves it"}
        if "private" in str(rec.get("reason") or "") or rule == "default:ssrf":
            return {"key": "network.allow",
                    "add": f"{_bracket(address)}:{port}" if address else f"{host}:{port}",
                    "note": "a private or loopback address: allowed only by an explicit "
                            "rule for it (or network.allow_private)"}
        spec = f"{host or _bracket(address)}:{port}"
        return {"key": "network.allow", "add": spec if protocol == "tcp" else f"udp://{spec}"}
    if protocol == "unix":
        return {"key": "network.unix", "add": rec.get("path")}
    if protocol == "file" and isinstance(rec.get("suggest"), dict):  # explain=True
        s = rec["suggest"]
        flag, _, target = str(s.get("flag", "")).partition(" ")
        out = {"key": "filesystem.write" if flag == "-w" else "filesystem.read",
               "add": target}
        if s.get("warning"):
            out["note"] = s["warning"]
        return out
    return None


def forms(f: dict) -> dict:
    """A fix as a CLI flag and as a YAML snippet."""
    flag, section, key = _FORMS[f["key"]]
    value = f["add"]
    shown = f"'{value}'" if " " in value or "*" in value else value
    return {"flag": f"{flag} {shown}", "yaml": f"{section}: {{{key}: [{json.dumps(value)}]}}"}


def explain(records) -> list[dict]:
    """One entry per distinct denial (what, the rule that decided, why, how many times,
    the fix), in the order first seen."""
    from netpolicy.audit import describe
    out: dict[tuple, dict] = {}
    for rec in records:
        if rec.get("decision") not in ("deny", "would-deny"):
            continue
        would = rec["decision"] == "would-deny"  # report-only: allowed, and recorded
        key = (describe(rec), rec.get("rule"), would)
        if key in out:
            out[key]["count"] += 1
            continue
        f = fix(rec)
        entry = {"denied": key[0], "rule": rec.get("rule"), "reason": rec.get("reason"),
                 "count": 1, "argv": rec.get("argv"), "would_deny": would}
        if f is not None:
            entry["fix"] = {**f, **forms(f)}
        out[key] = entry
    return list(out.values())


def render(entries) -> str:
    from netpolicy.text import printable
    if not entries:
        return "no denials recorded"
    lines = []
    for e in entries:
        times = f" (x{e['count']})" if e["count"] > 1 else ""
        lead = "would deny (report-only): " if e.get("would_deny") else ""
        lines.append(f"{lead}{printable(e['denied'])}{times}")
        lines.append(f"  decided by {printable(str(e['rule']))}: {printable(e['reason'] or '')}")
        f = e.get("fix")
        if f is None:
            lines.append("  no grant allows it (refused by design or by your policy_fn)")
        else:
            lines.append(f"  allow with:  {printable(f['flag'])}")
            lines.append(f"         or:  {printable(f['yaml'])}")
            if f.get("note"):
                lines.append(f"  note: {printable(f['note'])}")
    return "\n".join(lines)
