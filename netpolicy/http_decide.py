"""Deciding on one HTTP request (or a CONNECT) of a redirected connection: pure code over
its context (HttpContext: where the connection was going, the rules, the names the
sandbox resolved, credentials), no sockets. The filter itself is netpolicy.http_proxy;
the rules' grammar and matching are netpolicy.http_rules.

Every request is judged on exactly what will be forwarded: the Host must be the
destination (its literal address, or a name the sandbox resolved to it: no domain
fronting), the path is normalised first, deny rules apply under every name the
destination is known by, and the forwarded head is rebuilt from what was checked (hop-by-
hop and framing headers recomputed). A Refusal says why, for the 400/403 answer and the
audit log. Credentials are added only after the rules passed the request.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import parse_qs

import h11

from .endpoint import canonical_address
from .http_path import PathError, normalize_path, split_target
from .http_rules import HttpPolicy, decide_tls_host

_HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization",
               b"proxy-authenticate", b"te", b"trailer", b"transfer-encoding", b"upgrade",
               b"content-length", b"expect"}


class HttpContext:
    """One redirected connection: where it was going and how to judge it. Whether it
    speaks TLS is read from its first byte (a handshake record), not assumed from the
    port."""

    def __init__(self, address, port: int, policy: HttpPolicy, names_for, audit=None,
                 info=None, intercept=None, upgrades=frozenset(), slots=None,
                 addresses_for=None, credentials=None, holders=None, report=None):
        self.address = ipaddress.ip_address(address)
        self.port = port
        self.intercept = intercept  # tls_intercept.Interceptor, or None (SNI only)
        self.upgrades = upgrades    # protocol switches allowed ({"websocket"} at most)
        self.slots = slots          # the sandbox's share of connections (a semaphore)
        self.sni: str | None = None  # set once an intercepted connection's SNI is known
        self.policy = policy
        self.names_for = names_for  # address -> names the sandbox resolved to it
        self.addresses_for = addresses_for or (lambda name: ())  # name -> pinned addresses
        self.audit = audit          # callable(**record), or None
        self.info = info or {}      # sandbox, pid, argv for the audit records
        self.credentials = credentials  # netpolicy.credentials.Credentials, or None
        self.holders = holders      # () -> [credentials.Identity] of the socket's holders
        self.report = report        # report-only: a callable counting "would-deny", else None


class Refusal(Exception):
    def __init__(self, status: int, reason: str, rule: str | None = None, **fields):
        super().__init__(reason)
        if rule is None:  # a request no rule could allow is malformed, not refused by one
            rule = "default:malformed" if status == 400 else "default:deny"
        self.status, self.reason, self.rule, self.fields = status, reason, rule, fields


class Decided:
    """An allowed request: what will be sent upstream."""

    def __init__(self, method: bytes, target: bytes, host: str, headers: list, path: str,
                 rule: str, applied=None):
        self.method, self.target, self.host, self.headers = method, target, host, headers
        self.path, self.rule = path, rule
        self.applied = applied  # credentials.Applied, when the sandbox has credentials


def _parse_host(value: str) -> tuple[str, int | None]:
    """Host header or authority -> (lower-case host without trailing dot, port or None)."""
    if not value or "@" in value or any(c in value for c in " \t/\\?#"):
        raise Refusal(400, f"malformed host {value[:60]!r}")
    port = None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            raise Refusal(400, "malformed IPv6 host")
        host, rest = value[1:end], value[end + 1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise Refusal(400, f"[{host[:40]}] is not an IPv6 address") from None
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise Refusal(400, "malformed host port")
            port = int(rest[1:])
    else:
        host, sep, p = value.rpartition(":")
        if not sep:
            host = value
        elif not p.isdigit() or not host:
            raise Refusal(400, "malformed host port")
        else:
            port = int(p)
    try:
        host.encode("ascii")
    except UnicodeEncodeError:
        raise Refusal(400, "non-ASCII host (policies name A-labels)") from None
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host or host.endswith("."):
        raise Refusal(400, "malformed host")
    if port is not None and not 0 < port < 65536:
        raise Refusal(400, "host port out of range")
    literal = _literal(host)
    if literal is not None:  # one spelling per address: rules see what the check saw
        host = str(literal)
    elif ":" in host:
        raise Refusal(400, "malformed host")
    return host, port


def _authority(host: str, port: int | None) -> bytes:
    """The Host value we forward: the canonical host that was matched."""
    text = f"[{host}]" if ":" in host else host
    return (text if port is None else f"{text}:{port}").encode("ascii")


def _literal(host: str):
    try:
        return canonical_address(ipaddress.ip_address(host))
    except ValueError:
        return None


def check_destination(ctx: HttpContext, host: str) -> None:
    """The host must be the destination: its literal address, or a name the sandbox
    resolved (through Sandlock) to that address."""
    literal = _literal(host)
    if literal is not None:
        if literal != ctx.address:
            raise Refusal(403, f"host {host} is not the connection's destination "
                               f"{ctx.address}", "default:destination")
        return
    if host not in ctx.names_for(ctx.address):
        raise Refusal(403, f"host {host} does not resolve to the destination {ctx.address} "
                           f"(domain fronting is refused)", "default:destination")


def aliases(ctx: HttpContext, host: str) -> tuple[str, ...]:
    """Every other name the connection's destination is known by: the names that resolved
    to its address in this sandbox, and the address itself (http_rules' module note)."""
    out = dict.fromkeys((*ctx.names_for(ctx.address), str(ctx.address)))
    out.pop(host, None)
    return tuple(out)


def tunnel_aliases(ctx: HttpContext, host: str) -> tuple[str, ...]:
    """Every other name a CONNECT target is known by: for an address, the names pinned to
    it; for a name, the names sharing one of its pinned addresses, and those addresses."""
    literal = _literal(host)
    addresses = (literal,) if literal is not None else ctx.addresses_for(host)
    out = {}
    for a in addresses:
        out.update(dict.fromkeys((*ctx.names_for(a), str(a))))
    out.pop(host, None)
    return tuple(out)


def _decide_connect(ctx: HttpContext, req: h11.Request) -> Decided:
    """CONNECT through an allowed HTTP proxy: only when the policy allows tunnels, and then
    decided on the tunnel's host alone (what passes inside is not inspected)."""
    if "connect" not in ctx.upgrades:
        raise Refusal(403, "CONNECT is refused (tunnels cannot be inspected; "
                           "http_upgrades=['connect'] allows them)", "default:protocol")
    host, port = _parse_host(req.target.decode("latin-1"))
    if port is None:
        raise Refusal(400, "CONNECT target without a port")
    verdict = decide_tls_host(ctx.policy, host, tunnel_aliases(ctx, host))
    if not verdict.allowed:
        raise Refusal(403, verdict.reason, verdict.rule, method="CONNECT", host=host)
    authority = _authority(host, port)
    return Decided(b"CONNECT", authority, host, [(b"host", authority)], "", verdict.rule)


def decide_request(ctx: HttpContext, req: h11.Request) -> Decided:
    """Check one parsed request; raises Refusal. Pure except for ctx.names_for."""
    method = req.method.decode("ascii")
    if method == "CONNECT":
        return _decide_connect(ctx, req)
    headers = [(n.lower(), v) for n, v in req.headers]
    upgrade = [v for n, v in headers if n == b"upgrade"]
    tokens = {t.strip().lower() for v in upgrade for t in v.decode("latin-1").split(",")}
    if upgrade and (len(upgrade) != 1 or not tokens or not tokens <= ctx.upgrades):
        raise Refusal(403, f"protocol switch refused (Upgrade: {upgrade[0][:40].decode('latin-1')})",
                      "default:protocol")
    hosts = [v for n, v in headers if n == b"host"]
    if len(hosts) != 1:
        raise Refusal(400, "a request needs exactly one Host header")
    host, port = _parse_host(hosts[0].decode("latin-1"))
    if ctx.sni is not None and host != ctx.sni:
        raise Refusal(403, f"Host {host} differs from the TLS server name {ctx.sni}",
                      "default:destination")
    if port is not None and port != ctx.port:
        raise Refusal(403, f"Host port {port} is not the connection's port {ctx.port}",
                      "default:destination")
    target = req.target.decode("latin-1")
    if target.startswith(("http://", "https://")):
        scheme, _, rest = target.partition("://")
        if scheme != "http":
            raise Refusal(400, "https:// target on a plain HTTP connection")
        authority, slash, rest = rest.partition("/")
        if _parse_host(authority) != (host, port):
            raise Refusal(400, "absolute-form authority differs from Host")
        target = slash + rest if slash else "/"
    if not target.startswith("/"):
        raise Refusal(400, f"request target {target[:60]!r} is not a path")
    try:
        raw_path, query = split_target(target)
        path = normalize_path(raw_path)
    except PathError as e:
        raise Refusal(400, f"refused path: {e}") from None
    check_destination(ctx, host)
    qs = parse_qs(query, keep_blank_values=True) if query else {}
    hdrs: dict[str, list[str]] = {}
    for n, v in headers:
        hdrs.setdefault(n.decode("latin-1"), []).append(v.decode("latin-1"))
    verdict = ctx.policy.decide(method, host, path, qs, hdrs, aliases(ctx, host), ctx.port)
    would = None
    if not verdict.allowed:
        refusal = Refusal(403, verdict.reason, verdict.rule, method=method, host=host,
                          path=path)
        if ctx.report is None:
            raise refusal
        would = refusal  # report-only: recorded by the caller, then forwarded
    keep = [(n, v) for n, v in headers if n not in _HOP_BY_HOP and n != b"host"]
    applied = None
    # Only now, and only for a request the rules passed (report-only lets a refused one
    # through, never with a secret).
    if ctx.credentials is not None and would is None:
        from .credentials import Refused
        try:
            applied = ctx.credentials.apply(method, host, path, ctx.port, query, qs, hdrs,
                                            keep, ctx.sni is not None, ctx.holders)
        except Refused as r:
            raise Refusal(403, r.reason, f"credential:{r.credential}", method=method,
                          host=host, path=path) from None
        keep, query = applied.headers, applied.query
    forwarded = path + ("?" + query if query is not None else "")
    keep.insert(0, (b"host", _authority(host, port)))
    if upgrade:  # allowed above: the switch is requested again, in our own words
        keep += [(b"connection", b"Upgrade"), (b"upgrade", upgrade[0])]
    lengths = [v for n, v in headers if n == b"content-length"]
    if lengths:
        keep.append((b"content-length", lengths[0]))
    elif any(n == b"transfer-encoding" for n, _ in headers):
        keep.append((b"transfer-encoding", b"chunked"))
    decided = Decided(req.method, forwarded.encode("ascii"), host, keep, path, verdict.rule,
                      applied)
    decided.would = would
    return decided
