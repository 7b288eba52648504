"""Deciding on a network destination: the pure core of the endpoint policy.

Nothing in this module performs I/O or reads process memory: callers pass the destination
they already copied out of the sandbox (protocol, canonical address, port) and the names
that address is known to have (from DNS pinning). The same inputs always give the same
`Verdict`, which names the rule or default that decided.

Order: a `deny` rule wins; then an allow rule naming the address (IP/CIDR or any-address);
then an allow rule naming a host the address was resolved from, subject to the SSRF default:
addresses in private, loopback, link-local, metadata, CGNAT, unspecified or transition
ranges, and the addresses of this machine's own interfaces (`local`, whatever their range:
a name resolving to them reaches services bound to 0.0.0.0), are refused for hostname rules
unless `allow_private` is set or a rule names that address explicitly (which the previous
step already accepted).
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass, replace

from .endpoint import EndpointRule, IPAddress, parse_endpoint

_SPECIAL = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4",
    "240.0.0.0/4", "255.255.255.255/32",
    "::/128", "::1/128", "::/96", "64:ff9b::/96", "64:ff9b:1::/48", "2001::/32",
    "2002::/16", "fc00::/7", "fe80::/10", "ff00::/8", "fd00:ec2::254/128",
)


@functools.cache
def _special_nets():
    return tuple(ipaddress.ip_network(n) for n in _SPECIAL)


def is_special(address: IPAddress) -> bool:
    """Loopback, private, link-local (incl. cloud metadata), CGNAT, multicast, unspecified,
    or an IPv6 transition form that embeds an IPv4 address (NAT64, 6to4, Teredo, ::a.b.c.d).
    Decided by table, not by ipaddress.is_global (wrong for 64:ff9b::/96 in Python 3.11)."""
    return any(address.version == n.version and address in n for n in _special_nets())


def embedded_ipv4(address: IPAddress) -> tuple:
    """IPv4 addresses carried inside an IPv6 one (NAT64, 6to4, IPv4-compatible), so that a
    deny rule on an IPv4 range also covers its IPv6 spellings."""
    if address.version != 6:
        return ()
    n = int(address)
    if address in _NAT64 or (n >> 32) == 0:
        return (ipaddress.IPv4Address(n & 0xFFFFFFFF),)
    if address in _6TO4:
        return (ipaddress.IPv4Address((n >> 80) & 0xFFFFFFFF),)
    return ()


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_6TO4 = ipaddress.ip_network("2002::/16")


def _every_protocol(rule: EndpointRule) -> EndpointRule:
    """A deny rule without a scheme covers TCP, UDP and ICMP alike."""
    if "://" in rule.spec:
        return rule
    return replace(rule, protocols=frozenset({"tcp", "udp", "icmp"}))


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    rule: str      # the spec of the deciding rule, or the name of the default
    reason: str


@dataclass(frozen=True)
class EndpointPolicy:
    allow: tuple[EndpointRule, ...] = ()
    deny: tuple[EndpointRule, ...] = ()
    allow_private: bool = False

    @classmethod
    def from_specs(cls, allow=(), deny=(), allow_private: bool = False) -> "EndpointPolicy":
        deny_rules = tuple(_every_protocol(parse_endpoint(s)) for s in deny)
        for rule in deny_rules:
            if rule.host is not None:
                raise ValueError(f"net_deny {rule.spec!r}: deny rules take addresses or CIDRs, "
                                 f"not host names (a name can resolve anywhere)")
        return cls(tuple(parse_endpoint(s) for s in allow), deny_rules, allow_private)

    @property
    def hostnames(self) -> tuple[EndpointRule, ...]:
        """Allow rules that name hosts: their names may be resolved inside the sandbox."""
        return tuple(r for r in self.allow if r.host is not None)

    def name_allowed(self, name: str) -> EndpointRule | None:
        """The allow rule under which DNS may answer for `name` (canonical), if any."""
        for rule in self.allow:
            if rule.host is not None and rule.matches_name(name):
                return rule
        return None

    def protocols(self) -> frozenset[str]:
        out: set[str] = set()
        for rule in self.allow:
            out |= rule.protocols
        return frozenset(out)

    def decide(self, protocol: str, address: IPAddress, port: int,
               names: tuple[str, ...] = (), local=frozenset()) -> Verdict:
        candidates = (address,) + embedded_ipv4(address)
        for rule in self.deny:
            if any(rule.matches(protocol, a, port) for a in candidates):
                return Verdict(False, rule.spec, f"net_deny {rule.spec} matches {address}")
        for rule in self.allow:
            if rule.host is None and rule.matches(protocol, address, port):
                return Verdict(True, rule.spec, "allowed")
        for rule in self.allow:
            if rule.host is not None and rule.matches(protocol, address, port, names):
                if (is_special(address) or address in local) and not self.allow_private:
                    what = ("an address of this machine" if address in local
                            else "a private or special address")
                    return Verdict(False, "default:ssrf",
                                   f"{rule.host} resolved to {address}, {what}; name the "
                                   f"address in a rule or allow private resolution to "
                                   f"permit it")
                return Verdict(True, rule.spec, "allowed")
        shown = f"[{address}]" if address.version == 6 else str(address)
        via = f" ({', '.join(names)})" if names else ""
        return Verdict(False, "default:deny",
                       f"no rule allows {protocol} {shown}:{port}{via}")
