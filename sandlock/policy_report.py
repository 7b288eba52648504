"""What `sandlock policy check` says beyond the rules themselves: HTTP rules that can never
apply, endpoints whose traffic bypasses the HTTP rules, and contradictions (an error).

Pure: reads a validated Policy, performs no I/O.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


@dataclass
class Report:
    notes: list[str] = field(default_factory=list)    # worth knowing
    errors: list[str] = field(default_factory=list)   # contradictions: the check fails


def _reaches(rule_host, wildcard, port, endpoints) -> bool:
    """Can some endpoint allow rule admit a connection a rule for this host may need?"""
    for e in endpoints.allow:
        if "tcp" not in e.protocols or (port is not None and not e.matches_port(port)):
            continue
        if e.any_address or rule_host is None:
            return True
        if e.network is not None:
            try:
                if ipaddress.ip_address(rule_host) in e.network:
                    return True
            except ValueError:
                continue
        elif e.host is not None:
            if wildcard is None and e.matches_name(rule_host):
                return True
            if wildcard is not None and (e.host == rule_host or
                                         e.host.endswith("." + rule_host)):
                return True
    return False


def _covers(deny, allow) -> bool:
    """A host-wide deny rule for the same host (and port) leaves the allow rule nothing."""
    from netpolicy.http_rules import _host_wide
    return (_host_wide(deny) and deny.host == allow.host and deny.wildcard == allow.wildcard
            and (deny.port is None or deny.port == allow.port))


def http_report(policy) -> Report:
    out = Report()
    http = policy.http
    if http is None:
        return out
    endpoints = policy.endpoints
    for rule in http.allow:
        if not _reaches(rule.host, rule.wildcard, rule.port, endpoints):
            out.notes.append(f"http rule {rule.spec!r} can never apply: no network.allow "
                             f"entry reaches {rule.host or 'any host'}"
                             + (f" on port {rule.port}" if rule.port else ""))
        for deny in http.deny:
            if deny.spec == rule.spec:
                out.errors.append(f"{rule.spec!r} is both allowed and denied")
            elif _covers(deny, rule):
                out.errors.append(f"http allow {rule.spec!r} can never allow anything: "
                                  f"deny {deny.spec!r} covers its whole host")
        from netpolicy.http_rules import _host_wide
        if not _host_wide(rule) and policy.intercept is None and \
                (rule.port in (None, 443)):
            out.notes.append(f"http rule {rule.spec!r} names a method or path: HTTPS to "
                             f"{rule.host or 'any host'} is refused without interception "
                             f"(http.inject_ca)")
    for e in endpoints.allow:
        if "tcp" not in e.protocols:
            continue
        named = e.host is not None and http.names_host((e.host,)) or (
            e.network is not None and e.network.num_addresses == 1 and
            http.names_host((str(e.network.network_address),))) or any(
            r.host is None for r in (*http.allow, *http.deny))
        if not named and (e.ports is None or not e.ports <= policy.http_ports):
            shown = sorted(e.ports - policy.http_ports) if e.ports else "any port"
            out.notes.append(f"TCP to {e.spec} bypasses the HTTP rules (no rule names its "
                             f"host; HTTP ports {sorted(policy.http_ports)}; not filtered: "
                             f"{shown})")
    if policy.http_raw is not None:
        for e in policy.http_raw.allow:
            out.notes.append(f"TCP to {e.spec} is relayed unfiltered (http.raw)")
    return out
