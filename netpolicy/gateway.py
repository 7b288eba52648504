"""Gateway mode: the same HTTP rules, enforced by a mitmproxy addon for clients outside any
sandbox (a shared egress proxy for agents, CI jobs, containers).

    mitmdump -s netpolicy/gateway.py --set sandlock_policy=policies/http-read-only.yaml

It reads the `http:` section (allow, deny) and `audit.file` of a Sandlock policy file.
Decisions are taken in `requestheaders`, before any body is streamed; a refused request
gets the same 403 (body naming the decision, `Connection: close`) and the same audit
record as in a sandbox. CONNECT is refused for hosts no rule can admit; mitmproxy then
intercepts the TLS inside (clients trust its CA), so every request is judged by method,
host and path as plain HTTP is, and its Host and the TLS server name (SNI) must both name
the connection's target. The request is forwarded with the normalised path that was
matched (netpolicy.http_path). A policy that cannot be read stops the proxy from serving:
every request is refused until it is fixed.

One destination, many names: a request is also judged under every name its target's
addresses are known by among the hosts the rules name (resolved with the system resolver,
cached for NAMES_TTL), and under the addresses themselves, so an IP-literal URL cannot walk
past a deny rule that names the host (netpolicy.http_rules).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import threading
import time

from urllib.parse import parse_qs

from mitmproxy import ctx, http

from netpolicy.audit import AuditLog
from netpolicy.http_path import PathError, normalize_path, split_target
from netpolicy.http_rules import HttpPolicy, HttpRuleError, decide_tls_host


def load_http_policy(path: str) -> tuple[HttpPolicy, str | None]:
    """(rules, audit file) from a Sandlock YAML policy. Raises ValueError naming the file."""
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise ValueError(f"{path}: not a version 1 Sandlock policy")
    section = doc.get("http") or {}
    if not isinstance(section, dict):
        raise ValueError(f"{path}: http: expected a mapping")
    try:
        policy = HttpPolicy.from_rules(section.get("allow") or (), section.get("deny") or ())
    except HttpRuleError as e:
        raise ValueError(f"{path}: http: {e}") from None
    audit = (doc.get("audit") or {}).get("file")
    if audit:
        audit = os.path.join(os.path.dirname(os.path.abspath(path)), os.path.expanduser(audit))
    return policy, audit


NAMES_TTL = 30.0


class _Names:
    """Addresses of targets and of the rules' host names, resolved off the event loop and
    cached; `aliases(host)` are the other names of host's addresses."""

    def __init__(self, policy: HttpPolicy):
        self.names = policy.named_hosts()
        self._cache: dict[str, tuple[float, frozenset]] = {}
        self._lock = threading.Lock()

    def _addresses(self, host: str) -> frozenset:
        try:
            return frozenset({ipaddress.ip_address(host.strip("[]"))})
        except ValueError:
            pass
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(host)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            found = frozenset(ipaddress.ip_address(i[4][0].split("%")[0]) for i in infos)
        except (OSError, ValueError):
            found = frozenset()
        with self._lock:
            self._cache[host] = (now + NAMES_TTL, found)
        return found

    def aliases(self, host: str) -> tuple[str, ...]:
        mine = self._addresses(host)
        out = [n for n in self.names if n != host and self._addresses(n) & mine]
        out += [str(a) for a in mine if str(a) != host.strip("[]")]
        return tuple(out)


async def _aliases(names: "_Names | None", host: str) -> tuple[str, ...]:
    if names is None:
        return ()
    return await asyncio.get_running_loop().run_in_executor(None, names.aliases, host)


def _refuse(flow: http.HTTPFlow, status: int, reason: str) -> None:
    flow.response = http.Response.make(
        status, f"sandlock: {reason}\n".encode(),
        {"Content-Type": "text/plain; charset=utf-8", "Connection": "close"})


class SandlockGateway:
    def __init__(self):
        self.policy: HttpPolicy | None = None
        self.names: _Names | None = None
        self.audit: AuditLog | None = None
        self.error = "no sandlock_policy set"

    def load(self, loader):
        loader.add_option("sandlock_policy", str, "", "a Sandlock YAML policy whose http "
                                                        "rules this proxy enforces")
        loader.add_option("sandlock_connect_ports", str, "443",
                          "comma-separated ports CONNECT may reach (default 443)")

    def configure(self, updated):
        if "sandlock_policy" not in updated:
            return
        try:
            self.policy, audit_path = load_http_policy(ctx.options.sandlock_policy)
            self.names = _Names(self.policy)
            self.audit = AuditLog(audit_path) if audit_path else None
            self.error = None
        except ValueError as e:
            self.policy, self.error = None, str(e)
            ctx.log.error(f"sandlock gateway: {e}")

    def _record(self, flow, decision: str, **fields) -> None:
        if self.audit is not None:
            peer = flow.client_conn.peername
            self.audit.record(decision=decision, sandbox="gateway",
                              client=f"{peer[0]}:{peer[1]}" if peer else None, **fields)

    def running(self):
        # Bytes that are not HTTP (after a CONNECT, or a non-HTTP ALPN) would otherwise be
        # relayed as raw TCP, past every rule.
        ctx.options.update(rawtcp=False)

    def tcp_start(self, flow) -> None:
        flow.kill()

    def udp_start(self, flow) -> None:
        flow.kill()

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        if self.policy is None:
            return _refuse(flow, 403, f"gateway has no policy ({self.error})")
        host = flow.request.host.lower().rstrip(".")
        verdict = decide_tls_host(self.policy, host, await _aliases(self.names, host))
        ports = {int(p) for p in ctx.options.sandlock_connect_ports.split(",") if p.strip()}
        if flow.request.port not in ports:
            verdict = type(verdict)(False, "default:connect",
                                    f"CONNECT to port {flow.request.port} (only "
                                    f"{sorted(ports)}: sandlock_connect_ports)")
        # Interception follows: a rule that needs the request is applied per request.
        if not verdict.allowed and not verdict.needs_interception:
            self._record(flow, "deny", protocol="connect", host=host,
                         port=flow.request.port, rule=verdict.rule, reason=verdict.reason)
            _refuse(flow, 403, verdict.reason)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if self.policy is None:
            return _refuse(flow, 403, f"gateway has no policy ({self.error})")
        req = flow.request
        method = req.method
        # Decide on where mitmproxy will connect (the CONNECT target or the URL's host);
        # a Host header naming anything else is refused rather than trusted.
        host = req.host.lower().rstrip(".")
        fields = dict(protocol=req.scheme, method=method, host=host)
        header = (req.host_header or "").lower()
        if header.startswith("["):
            header = header[1:header.find("]")] if "]" in header else header
        elif ":" in header:
            header = header.rsplit(":", 1)[0]
        if header and header.rstrip(".") != host.strip("[]"):
            reason = f"Host {header[:60]} differs from the destination {host}"
            self._record(flow, "deny", rule="default:destination", reason=reason, **fields)
            return _refuse(flow, 403, reason)
        sni = (flow.client_conn.sni or "").lower().rstrip(".")
        if flow.client_conn.tls_established and sni and sni != host.strip("[]"):
            reason = f"TLS server name {sni[:60]} differs from the destination {host}"
            self._record(flow, "deny", rule="default:destination", reason=reason, **fields)
            return _refuse(flow, 403, reason)
        if req.headers.get("upgrade"):
            reason = f"protocol switch refused (Upgrade: {req.headers['upgrade'][:40]})"
            self._record(flow, "deny", rule="default:protocol", reason=reason, **fields)
            return _refuse(flow, 403, reason)
        if method != method.upper():
            self._record(flow, "deny", rule="default:framing", reason="lower-case method",
                         **fields)
            return _refuse(flow, 400, "lower-case method")
        try:
            raw_path, query = split_target(req.path)
            path = normalize_path(raw_path)
        except PathError as e:
            self._record(flow, "deny", rule="default:path", reason=str(e), **fields)
            return _refuse(flow, 400, f"refused path: {e}")
        qs = parse_qs(query, keep_blank_values=True) if query else {}
        headers = {k.lower(): req.headers.get_all(k) for k in req.headers}
        verdict = self.policy.decide(method, host, path, qs, headers,
                                     await _aliases(self.names, host))
        if not verdict.allowed:
            self._record(flow, "deny", path=path, rule=verdict.rule, reason=verdict.reason,
                         **fields)
            return _refuse(flow, 403, verdict.reason)
        req.path = path + ("?" + query if query is not None else "")
        if self.audit is not None and self.audit.log_allowed:
            self._record(flow, "allow", path=path, rule=verdict.rule, **fields)


addons = [SandlockGateway()]
