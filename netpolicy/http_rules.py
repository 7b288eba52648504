"""HTTP rules: `"METHOD host/path"` and the structured YAML form, and deciding on a request.

Pure code over plain values (no sockets). The request handed to `HttpPolicy.decide` must
already be normalised (see `netpolicy.http_path`): the decision is taken on exactly the
strings that will be forwarded.

Grammar: method `*` or a token (matched case-insensitively against the policy, but a
request's method is taken as sent: `get` is not `GET`); host `*`, a name, `*.example.com`
(strict subdomains) or `**.example.com` (the domain too), optionally with a port
(`api.example.com:8080`, `[::1]:8080`: the rule applies on connections to that port only,
and makes it an HTTP port for that host); path exact, or a prefix when it ends in `*`; no
path = `/*`. Structured form (YAML, `port:` for the port):

    - methods: [GET, HEAD]
      host: api.github.com
      path: /repos/*            # or `path_prefix:` / `path_exact:`
      query: {per_page: "100"}  # optional: each listed parameter must have this value
      headers: {accept: application/json}   # optional, names case-insensitive

Deny rules are checked first; with allow rules present a request passes only if one matches.

One destination, many names: a request is judged under its Host (or SNI) *and* under every
other name its destination is known by (`aliases`: the names that resolved to its address
in this sandbox, and the address itself). A deny rule naming any of them applies, so
`Host: 127.0.0.1` or `[::ffff:127.0.0.1]` cannot walk past `* api.test/admin*` on a
connection to api.test's address. Allow rules are matched on the Host spelling only (the
narrower reading).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .endpoint import EndpointError, canonical_hostname

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class HttpRuleError(ValueError):
    pass


@dataclass(frozen=True)
class HttpRule:
    spec: str
    methods: frozenset[str] | None        # upper-case names; None = any method
    host: str | None                      # None = any host
    wildcard: str | None = None           # None, "sub" or "deep"
    path: str = "/"
    prefix: bool = True
    query: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = field(default=())
    port: int | None = None               # None = any port

    def matches(self, method: str, host: str, path: str, query: dict[str, list[str]],
                headers: dict[str, list[str]], port: int | None = None) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        if self.port is not None and port is not None and port != self.port:
            return False
        if self.host is not None:
            if self.wildcard is None and host != self.host:
                return False
            if self.wildcard is not None and not (
                    host.endswith("." + self.host)
                    or (self.wildcard == "deep" and host == self.host)):
                return False
        if self.prefix:
            if not path.startswith(self.path):
                return False
        elif path != self.path:
            return False
        # A condition holds only for exactly one value, equal to the rule's: with repeated
        # parameters or headers, servers differ on which one counts.
        for k, v in self.query:
            if list(query.get(k, ())) != [v]:
                return False
        for k, v in self.headers:
            if list(headers.get(k, ())) != [v]:
                return False
        return True


def _host_port(text: str, spec: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]` or `[v6]:port` -> (host text, port or None)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise HttpRuleError(f"{spec!r}: unterminated '['")
        host, rest = text[1:end], text[end + 1:]
    elif text.count(":") == 1:
        host, rest = text.split(":")
        rest = ":" + rest
    else:
        host, rest = text, ""
    if not rest:
        return host, None
    if not rest.startswith(":") or not rest[1:].isdigit() or not 0 < int(rest[1:]) < 65536:
        raise HttpRuleError(f"{spec!r}: {rest[1:]!r} is not a port 1-65535")
    return host, int(rest[1:])


def _host(text: str, spec: str) -> tuple[str | None, str | None]:
    if text == "*":
        return None, None
    import ipaddress
    try:  # an address literal: one spelling per address (IPv4-mapped unwrapped)
        from .endpoint import canonical_address
        return str(canonical_address(ipaddress.ip_address(text))), None
    except ValueError:
        pass
    for prefix, kind in (("**.", "deep"), ("*.", "sub")):
        if text.startswith(prefix):
            try:
                domain = canonical_hostname(text[len(prefix):], spec)
            except EndpointError as e:
                raise HttpRuleError(str(e)) from None
            if "." not in domain:
                raise HttpRuleError(f"{spec!r}: a wildcard must cover a domain with at least "
                                    f"two labels")
            return domain, kind
    if "*" in text:
        raise HttpRuleError(f"{spec!r}: '*' is allowed only as a whole leading label")
    try:
        return canonical_hostname(text, spec), None
    except EndpointError as e:
        raise HttpRuleError(str(e)) from None


def _path(text: str, spec: str) -> tuple[str, bool]:
    if not text.startswith("/"):
        raise HttpRuleError(f"{spec!r}: the path must start with '/'")
    prefix = text.endswith("*")
    path = text[:-1] if prefix else text
    if "*" in path:
        raise HttpRuleError(f"{spec!r}: '*' is allowed only at the end of the path")
    from .http_path import PathError, normalize_path
    try:
        normalized = normalize_path(path or "/")
    except PathError as e:
        raise HttpRuleError(f"{spec!r}: {e}") from None
    if normalized != path and not (prefix and normalized == path.rstrip("/")):
        raise HttpRuleError(f"{spec!r}: write the path in normalised form ({normalized!r})")
    return path, prefix


def _methods(values, spec) -> frozenset[str] | None:
    out = set()
    for m in values:
        if m == "*":
            return None
        if not isinstance(m, str) or not _TOKEN.match(m):
            raise HttpRuleError(f"{spec!r}: {m!r} is not an HTTP method")
        out.add(m.upper())
    return frozenset(out)


def parse_http_rule(rule) -> HttpRule:
    """A rule from its string form or its structured (mapping) form."""
    if isinstance(rule, str):
        spec = rule
        parts = rule.split()
        if len(parts) != 2:
            raise HttpRuleError(f"{spec!r}: expected 'METHOD host/path', e.g. "
                                f"'GET api.github.com/repos/*'")
        method, target = parts
        host_text, slash, path_text = target.partition("/")
        host_text, port = _host_port(host_text, spec)
        host, wildcard = _host(host_text, spec)
        path, prefix = _path("/" + path_text if slash else "/*", spec)
        return HttpRule(spec, _methods([method], spec), host, wildcard, path, prefix,
                        port=port)
    if not isinstance(rule, dict):
        raise HttpRuleError(f"{rule!r}: an HTTP rule is a string or a mapping")
    spec = repr(rule)
    unknown = set(rule) - {"methods", "host", "path", "path_prefix", "path_exact", "query",
                           "headers", "port"}
    if unknown:
        raise HttpRuleError(f"{spec}: unknown key(s) {', '.join(sorted(unknown))}")
    paths = [k for k in ("path", "path_prefix", "path_exact") if k in rule]
    if len(paths) > 1:
        raise HttpRuleError(f"{spec}: give one of path, path_prefix, path_exact")
    methods = rule.get("methods", ["*"])
    if isinstance(methods, str):
        methods = [methods]
    host, wildcard = _host(str(rule.get("host", "*")), spec)
    if paths and paths[0] == "path_prefix":
        path, prefix = _path(str(rule["path_prefix"]).rstrip("*") + "*", spec)
    elif paths and paths[0] == "path_exact":
        path, prefix = _path(str(rule["path_exact"]), spec)
        if prefix:
            raise HttpRuleError(f"{spec}: path_exact cannot end in '*'")
    else:
        path, prefix = _path(str(rule.get("path", "/*")), spec)
    conditions = []
    for key in ("query", "headers"):
        value = rule.get(key, {})
        if not isinstance(value, dict):
            raise HttpRuleError(f"{spec}: {key} must be a mapping of names to values")
        conditions.append(tuple(sorted(
            ((k.lower() if key == "headers" else str(k)), str(v)) for k, v in value.items())))
    port = rule.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 < port < 65536):
        raise HttpRuleError(f"{spec}: port must be 1-65535, got {port!r}")
    return HttpRule(spec, _methods(methods, spec), host, wildcard, path, prefix,
                    conditions[0], conditions[1], port)


@dataclass(frozen=True)
class HttpVerdict:
    allowed: bool
    rule: str
    reason: str
    needs_interception: bool = False  # TLS: a rule for this host needs the request


@dataclass(frozen=True)
class HttpPolicy:
    allow: tuple[HttpRule, ...] = ()
    deny: tuple[HttpRule, ...] = ()

    def named_hosts(self) -> tuple[str, ...]:
        """The host names (not addresses, not wildcards) the rules name: resolved by the
        caller so that their addresses are judged under them too."""
        import ipaddress
        out = []
        for rule in (*self.allow, *self.deny):
            if rule.host is None or rule.wildcard is not None:
                continue
            try:
                ipaddress.ip_address(rule.host)
            except ValueError:
                out.append(rule.host)
        return tuple(dict.fromkeys(out))

    @classmethod
    def from_rules(cls, allow=(), deny=()) -> "HttpPolicy":
        return cls(tuple(parse_http_rule(r) for r in allow),
                   tuple(parse_http_rule(r) for r in deny))

    def decide(self, method: str, host: str, path: str, query=None, headers=None,
               aliases=(), port: int | None = None) -> HttpVerdict:
        """`port`: the connection's destination port (rules with a port need it)."""
        query, headers = query or {}, headers or {}
        for name in (host, *aliases):
            for rule in self.deny:
                if rule.matches(method, name, path, query, headers, port):
                    via = f" (the destination is also known as {name})" if name != host else ""
                    return HttpVerdict(False, rule.spec, f"denied by {rule.spec}{via}")
        if not self.allow:
            return HttpVerdict(True, "default:allow", "no allow rules")
        for rule in self.allow:
            if rule.matches(method, host, path, query, headers, port):
                return HttpVerdict(True, rule.spec, "allowed")
        where = f"{host}:{port}" if port is not None and any(
            r.port is not None for r in self.allow) else host
        return HttpVerdict(False, "default:deny", f"no rule allows {method} {where}{path}")

    # -- what the rules mean for the endpoint policy ------------------------------------------

    def names_host(self, names) -> bool:
        """Does some rule name one of `names` (host names or address texts)? A rule for
        any host (`*`) names every one."""
        rules = (*self.allow, *self.deny)
        return any(_host_matches(r, n) for r in rules for n in names)

    def ports(self) -> frozenset[int]:
        """Ports rules name explicitly."""
        return frozenset(r.port for r in (*self.allow, *self.deny) if r.port is not None)

    def endpoint_specs(self, tls: bool) -> tuple[str, ...]:
        """What allow rules open when no net_allow narrows them (upstream's semantics):
        a concrete host on port 80 (443 too when `tls`, or when the rule is host-wide and
        decidable on the SNI), or the rule's own port; a wildcard host the same for its
        domain, `*` any address."""
        out = []
        for rule in self.allow:
            if rule.host is None:
                target = ""
            elif rule.wildcard == "sub":
                target = f"*.{rule.host}"
            elif rule.wildcard == "deep":
                target = f"**.{rule.host}"
            else:
                target = f"[{rule.host}]" if ":" in rule.host else rule.host
            if rule.port is not None:
                ports = [rule.port]
            else:
                ports = [80] + ([443] if tls or _host_wide(rule) else [])
            out += [f"tcp://{target}:{p}" for p in ports]
        return tuple(dict.fromkeys(out))


def _host_matches(rule: HttpRule, host: str) -> bool:
    if rule.host is None:
        return True
    if rule.wildcard is None:
        return host == rule.host
    return host.endswith("." + rule.host) or (rule.wildcard == "deep" and host == rule.host)


def _host_wide(rule: HttpRule) -> bool:
    """A rule that says nothing about method, path, query or headers."""
    return (rule.methods is None and rule.prefix and rule.path == "/"
            and not rule.query and not rule.headers)


def decide_tls_host(policy: HttpPolicy, host: str, aliases=(),
                    port: int | None = None) -> HttpVerdict:
    """A TLS connection seen only by its SNI: the host is all there is to decide on. A rule
    for this host that needs method, path, query or headers cannot be enforced without
    interception, so it refuses the connection (a deny rule) or does not allow it. Deny
    rules apply under the SNI and every alias of the destination (see the module note)."""
    def on_port(rule):
        return rule.port is None or port is None or rule.port == port
    for name in (host, *aliases):
        for rule in policy.deny:
            if _host_matches(rule, name) and on_port(rule):
                via = f" (the destination is also known as {name})" if name != host else ""
                if _host_wide(rule):
                    return HttpVerdict(False, rule.spec, f"denied by {rule.spec}{via}")
                return HttpVerdict(False, rule.spec, f"{rule.spec} needs the request "
                                                     f"itself: HTTPS interception is "
                                                     f"required{via}", True)
    if not policy.allow:
        return HttpVerdict(True, "default:allow", "no allow rules")
    partial = None
    for rule in policy.allow:
        if _host_matches(rule, host) and on_port(rule):
            if _host_wide(rule):
                return HttpVerdict(True, rule.spec, "allowed")
            partial = partial or rule
    if partial is not None:
        return HttpVerdict(False, partial.spec, f"{partial.spec} allows only some requests "
                                                f"to {host}: HTTPS interception is required",
                           True)
    return HttpVerdict(False, "default:deny", f"no rule allows HTTPS to {host}")
