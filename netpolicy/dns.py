"""DNS for sandboxes: resolving policy names, pinning the answers, answering queries.

- `Resolver` asks the configured servers (default: the system's) with dnspython, A and AAAA,
  with a bounded lifetime.
- `Pins` remembers which names an address was resolved from, until the answer's TTL runs
  out; connect decisions use these names (resolve once, check every returned address,
  connect to that checked address: no rebinding between check and connect).
- `answer_query` builds the reply to a sandbox's DNS query from our own resolution: names
  the policy does not allow are refused locally and never sent upstream, so DNS cannot carry
  data out. It never forwards the sandbox's bytes.
"""

from __future__ import annotations

import threading
import time

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdata
import dns.rdatatype
import dns.resolver

from .endpoint import IPAddress, canonical_address, canonical_hostname, parse_server

MIN_TTL = 1
MAX_TTL = 3600


class ResolutionError(Exception):
    pass


class Resolver:
    def __init__(self, servers: list[str] | None = None, timeout: float = 3.0):
        if servers:
            self._resolver = dns.resolver.Resolver(configure=False)
            parsed = [parse_server(s) for s in servers]
            self._resolver.nameservers = [h for h, _ in parsed]
            ports = {p for _, p in parsed}
            if len(ports) > 1:
                raise ValueError("DNS servers must share one port")
            self._resolver.port = ports.pop()
        else:
            self._resolver = dns.resolver.Resolver()
        self._resolver.lifetime = timeout
        self._resolver.cache = None  # Pins hold what we learned, with its TTL
        self.servers = [(h, self._resolver.port) for h in self._resolver.nameservers]

    def resolve(self, name: str) -> tuple[list[IPAddress], int]:
        """Addresses of `name` (A and AAAA) and the smallest TTL; ResolutionError if none."""
        addrs: list[IPAddress] = []
        ttl = MAX_TTL
        errors = []
        for rdtype in ("A", "AAAA"):
            try:
                ans = self._resolver.resolve(name + ".", rdtype, search=False)
            except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN) as e:
                errors.append(type(e).__name__)
                continue
            except dns.exception.DNSException as e:
                raise ResolutionError(f"resolving {name}: {e}") from None
            ttl = min(ttl, ans.rrset.ttl)
            addrs.extend(canonical_address(r.address) for r in ans)
        if not addrs:
            raise ResolutionError(f"{name} does not resolve ({', '.join(errors)})")
        return addrs, max(MIN_TTL, min(ttl, MAX_TTL))


class Pins:
    """address -> {name: expiry}; thread-safe. `on_change` callables run after every
    record (outside the lock): whoever remembers verdicts made from pins forgets them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._names: dict[IPAddress, dict[str, float]] = {}
        self.on_change: list = []

    def record(self, name: str, addresses, ttl: int) -> None:
        expiry = time.monotonic() + ttl
        with self._lock:
            for a in addresses:
                self._names.setdefault(a, {})[name] = expiry
        for callback in self.on_change:
            callback()

    def names_for(self, address: IPAddress) -> tuple[str, ...]:
        now = time.monotonic()
        with self._lock:
            entry = self._names.get(address)
            if not entry:
                return ()
            return tuple(n for n, exp in entry.items() if exp > now)

    def expiry(self, address: IPAddress) -> float | None:
        """When names_for(address) first changes by expiry (None: no live name)."""
        now = time.monotonic()
        with self._lock:
            live = [exp for exp in (self._names.get(address) or {}).values() if exp > now]
        return min(live) if live else None


def question_names(wire: bytes) -> list[tuple[str, int]]:
    """(canonical name, rdtype) of each question in a query; ValueError if malformed."""
    try:
        msg = dns.message.from_wire(wire)
    except Exception as e:  # dnspython raises many types for malformed input
        raise ValueError(f"malformed DNS query: {e}") from None
    if msg.flags & dns.flags.QR:
        raise ValueError("not a query")
    out = []
    for q in msg.question:
        text = q.name.to_text(omit_final_dot=True)
        out.append((canonical_hostname(text) if text else "", q.rdtype))
    return out


def answer_query(wire: bytes, allowed, resolver: Resolver, pins: Pins) -> tuple[bytes, list]:
    """The reply to `wire`, and [(name, allowed?)] for each question (for the audit log).

    `allowed(name)` says whether the policy lets the sandbox resolve `name`.
    """
    query = dns.message.from_wire(wire)
    reply = dns.message.make_response(query)
    decisions = []
    for q in query.question:
        try:
            name = canonical_hostname(q.name.to_text(omit_final_dot=True))
        except ValueError:
            name = None
        if name is None or not allowed(name):
            decisions.append((q.name.to_text(omit_final_dot=True), False))
            reply.set_rcode(dns.rcode.REFUSED)
            continue
        decisions.append((name, True))
        if q.rdtype not in (dns.rdatatype.A, dns.rdatatype.AAAA):
            continue  # allowed name, other type: an empty NOERROR answer
        try:
            addrs, ttl = resolver.resolve(name)
        except ResolutionError:
            reply.set_rcode(dns.rcode.NXDOMAIN)
            continue
        pins.record(name, addrs, ttl)
        version = 4 if q.rdtype == dns.rdatatype.A else 6
        texts = [str(a) for a in addrs if a.version == version]
        if texts:
            rrset = reply.find_rrset(reply.answer, q.name, q.rdclass, q.rdtype, create=True)
            rrset.update_ttl(ttl)
            for t in texts:
                rrset.add(dns.rdata.from_text(q.rdclass, q.rdtype, t))
    return reply.to_wire(), decisions
