"""The endpoint grammar: `[tcp://|udp://|icmp://]target[:port[,port...]]`, and matching.

Pure code: no sockets, no DNS, no clock. A rule names a protocol set, a target and ports:
- no scheme = TCP and UDP; `icmp://` rules carry no ports;
- target: `*` or empty (any address), an IPv4 address or CIDR, `[IPv6]` or `[v6/cidr]`,
  a hostname, `*.example.com` (strict subdomains) or `**.example.com` (the domain and every
  subdomain); a wildcard over a single label (`*.com`) or `*` inside a label is an error;
- ports: omitted or `*` = all; `443`, `80,443`, `8000-8010`; mixing `*` with ports is an error.

Numeric IPv4 forms that inet_aton accepts but that are not dotted quads (`127.1`, `0x7f.1`,
`2130706433`, `0177.0.0.1`) are canonicalised, so the policy and a connect() never see two
different addresses for one target. IPv4-mapped IPv6 addresses are unwrapped before matching.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

PROTOCOLS = ("tcp", "udp", "icmp")
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class EndpointError(ValueError):
    """An endpoint spec that does not parse; the message quotes the spec."""


@dataclass(frozen=True)
class EndpointRule:
    spec: str
    protocols: frozenset[str]
    network: IPNetwork | None = None      # an address or CIDR; None with host=None = any
    host: str | None = None               # a hostname or a wildcard's domain
    wildcard: str | None = None           # None, "sub" (*.x) or "deep" (**.x)
    ports: frozenset[int] | None = None   # None = every port

    @property
    def any_address(self) -> bool:
        return self.network is None and self.host is None

    def matches_port(self, port: int) -> bool:
        return self.ports is None or port in self.ports

    def matches_name(self, name: str) -> bool:
        """Whether hostname `name` (already canonical) is named by this rule."""
        if self.host is None:
            return False
        if self.wildcard is None:
            return name == self.host
        if name.endswith("." + self.host):
            return True
        return self.wildcard == "deep" and name == self.host

    def matches(self, protocol: str, address: IPAddress, port: int,
                names: tuple[str, ...] = ()) -> bool:
        """Does a destination (with the names it is known to have) fall under this rule?"""
        if protocol not in self.protocols or not self.matches_port(port):
            return False
        if self.any_address:
            return True
        if self.network is not None:
            return address in self.network
        return any(self.matches_name(n) for n in names)


def canonical_address(addr: str | IPAddress) -> IPAddress:
    """An IP as matched: IPv4-mapped IPv6 unwrapped to IPv4."""
    ip = ipaddress.ip_address(addr) if isinstance(addr, str) else addr
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def canonical_hostname(name: str, spec: str = "") -> str:
    """Lowercase, one trailing dot stripped, LDH labels only (A-labels for IDNs)."""
    where = f"{spec!r}: " if spec else ""
    if not name.isascii():
        raise EndpointError(f"{where}non-ASCII host {name!r}: write the A-label (xn--...)")
    host = name.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host or len(host) > 253:
        raise EndpointError(f"{where}invalid host {name!r}")
    for label in host.split("."):
        if not _LABEL.match(label):
            raise EndpointError(f"{where}invalid host {name!r} (label {label!r})")
    return host


def _numeric_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """inet_aton's reading of `text`, for all-numeric forms that are not dotted quads."""
    if not re.fullmatch(r"[0-9a-fA-FxX.]+", text) or not re.match(r"[0-9]", text):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None


def _parse_ports(text: str, spec: str) -> frozenset[int] | None:
    items = [t.strip() for t in text.split(",")]
    if "*" in items:
        if len(items) > 1:
            raise EndpointError(f"{spec!r}: '*' cannot be combined with other ports")
        return None
    ports: set[int] = set()
    for item in items:
        lo, sep, hi = item.partition("-")
        bounds = (lo, hi) if sep else (lo, lo)
        if not all(b.isdigit() for b in bounds):
            raise EndpointError(f"{spec!r}: {item!r} is not a port or port range")
        a, b = int(bounds[0]), int(bounds[1])
        if not (1 <= a <= 65535 and 1 <= b <= 65535):
            raise EndpointError(f"{spec!r}: port {item} is outside 1-65535")
        if a > b:
            raise EndpointError(f"{spec!r}: port range {item} is empty")
        ports.update(range(a, b + 1))
    return frozenset(ports)


def _split_target(rest: str, spec: str) -> tuple[str, str]:
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise EndpointError(f"{spec!r}: unterminated '['")
        target, tail = rest[1:end], rest[end + 1:]
        if tail and not tail.startswith(":"):
            raise EndpointError(f"{spec!r}: unexpected {tail!r} after ']'")
        return "[" + target + "]", tail[1:] if tail else "*"
    if rest.count(":") > 1:
        raise EndpointError(f"{spec!r}: IPv6 addresses must be bracketed, e.g. [::1]:443")
    target, colon, ports = rest.partition(":")
    return target, ports if colon else "*"


def _parse_target(target: str, spec: str) -> dict:
    if target in ("", "*"):
        return {}
    if target.startswith("["):
        inner = target[1:-1]
        try:
            net = ipaddress.ip_network(inner, strict=False)
        except ValueError:
            raise EndpointError(f"{spec!r}: {inner!r} is not an IPv6 address or CIDR") from None
        if net.version != 6:
            raise EndpointError(f"{spec!r}: brackets are for IPv6; write {inner} unbracketed")
        return {"network": net}
    if "/" in target:
        try:
            return {"network": ipaddress.IPv4Network(target, strict=False)}
        except ValueError:
            raise EndpointError(f"{spec!r}: {target!r} is not an IPv4 CIDR") from None
    try:
        return {"network": ipaddress.IPv4Network(target)}
    except ValueError:
        pass
    numeric = _numeric_ipv4(target)
    if numeric is not None:
        return {"network": ipaddress.IPv4Network(numeric)}
    if re.fullmatch(r"[0-9.]+", target):
        raise EndpointError(f"{spec!r}: {target!r} is not a valid IPv4 address")
    for prefix, kind in (("**.", "deep"), ("*.", "sub")):
        if target.startswith(prefix):
            domain = canonical_hostname(target[len(prefix):], spec)
            if "." not in domain:
                raise EndpointError(f"{spec!r}: a wildcard must cover a domain with at least "
                                    f"two labels, not {domain!r}")
            return {"host": domain, "wildcard": kind}
    if "*" in target:
        raise EndpointError(f"{spec!r}: '*' is allowed only as a whole leading label "
                            f"('*.example.com' or '**.example.com')")
    return {"host": canonical_hostname(target, spec)}


def parse_endpoint(spec: str) -> EndpointRule:
    if not isinstance(spec, str) or not spec.strip():
        raise EndpointError(f"{spec!r}: empty endpoint")
    text = spec.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    scheme = scheme.lower()
    if scheme and scheme not in PROTOCOLS:
        raise EndpointError(f"{spec!r}: unknown scheme {scheme!r} (tcp, udp or icmp)")
    protocols = frozenset([scheme] if scheme else ["tcp", "udp"])
    target, port_text = _split_target(rest, spec)
    fields = _parse_target(target, spec)
    ports = _parse_ports(port_text, spec)
    if scheme == "icmp" and ports is not None:
        raise EndpointError(f"{spec!r}: icmp rules take no ports")
    return EndpointRule(spec=spec, protocols=protocols, ports=ports, **fields)


def parse_server(text: str) -> tuple[str, int]:
    """`1.2.3.4`, `1.2.3.4:5353`, `[::1]:53` -> (address, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":") or "53"
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, "53"
    canonical_address(host)  # raises ValueError for a non-address
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"DNS server {text!r}: bad port")
    return host, int(port)
