"""DNS for sandboxes: resolving policy names, pinning the answers, answering queries.

- `Resolver` asks the configured servers (default: the system's) with dnspython, A and AAAA,
  with a bounded lifetime.
- `Pins` remembers which names an address was resolved from, until the answer's TTL runs
  out; connect decisions use these names (resolve once, check every returned address,
  connect to that checked address: no rebinding between check and connect).
- `parse_query` accepts exactly what an ordinary stub resolver sends: one question, class
  IN, an ordinary type, no records besides an EDNS OPT; anything else is a `QueryRefused`.
  The sandbox's DNS bytes are never forwarded: `build_query` makes the query that leaves
  the machine from the parsed question alone (its id kept, so the reply finds the asker).
- `answer_query` builds the reply to a sandbox's DNS query from our own resolution: names
  the policy does not allow are refused locally and never sent upstream, so DNS cannot carry
  data out.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
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

    def addresses_for(self, name: str) -> tuple[IPAddress, ...]:
        """The addresses `name` is pinned to now."""
        now = time.monotonic()
        with self._lock:
            return tuple(a for a, names in self._names.items() if names.get(name, 0) > now)

    def expiry(self, address: IPAddress) -> float | None:
        """When names_for(address) first changes by expiry (None: no live name)."""
        now = time.monotonic()
        with self._lock:
            live = [exp for exp in (self._names.get(address) or {}).values() if exp > now]
        return min(live) if live else None


# Types an ordinary program asks for. Others (NULL, ANY, private types...) only carry data.
ORDINARY_TYPES = frozenset(dns.rdatatype.from_text(t) for t in (
    "A", "AAAA", "CNAME", "MX", "TXT", "SRV", "NS", "SOA", "PTR", "CAA", "HTTPS", "SVCB"))
MAX_EDNS_PAYLOAD = 1232  # the DNS flag day's safe UDP size


class QueryRefused(ValueError):
    """A DNS message that is not an ordinary query: refused, never forwarded."""


@dataclass(frozen=True)
class Query:
    """The part of a sandbox's query that may influence what leaves the machine."""
    id: int
    name: str                   # canonical
    rdtype: int
    edns_payload: int | None    # the asker's EDNS UDP size; None without EDNS


def parse_query(wire: bytes) -> Query:
    """The one question of an ordinary query; QueryRefused (with the reason) otherwise."""
    try:
        msg = dns.message.from_wire(wire)
    except Exception as e:  # dnspython raises many types for malformed input
        raise QueryRefused(f"malformed DNS message: {type(e).__name__}") from None
    if msg.flags & dns.flags.QR:
        raise QueryRefused("a DNS response, not a query")
    if msg.opcode() != dns.opcode.QUERY:
        raise QueryRefused(f"DNS opcode {dns.opcode.to_text(msg.opcode())}")
    if len(msg.question) != 1:
        raise QueryRefused(f"a DNS query with {len(msg.question)} questions (one is asked)")
    if msg.answer or msg.authority or msg.additional or msg.had_tsig:
        raise QueryRefused("a DNS query carrying records")
    q = msg.question[0]
    if q.rdclass != dns.rdataclass.IN:
        raise QueryRefused(f"DNS class {dns.rdataclass.to_text(q.rdclass)}")
    if q.rdtype not in ORDINARY_TYPES:
        raise QueryRefused(f"DNS type {dns.rdatatype.to_text(q.rdtype)}")
    text = q.name.to_text(omit_final_dot=True)
    try:
        name = canonical_hostname(text)
    except ValueError:
        raise QueryRefused(f"DNS name {text[:80]!r} is not a host name") from None
    payload = msg.payload if msg.edns >= 0 else None
    return Query(msg.id, name, q.rdtype, payload)


def build_query(q: Query) -> bytes:
    """A query of our own for `q`: recursion desired, the asker's id, EDNS only if it asked
    (its reply buffer may hold 512 bytes), and nothing else of what the sandbox sent."""
    use_edns = q.edns_payload is not None
    msg = dns.message.make_query(q.name + ".", q.rdtype, use_edns=0 if use_edns else False,
                                 payload=min(max(q.edns_payload or 512, 512),
                                             MAX_EDNS_PAYLOAD))
    msg.id = q.id
    msg.flags = dns.flags.RD
    return msg.to_wire()


def answer_query(wire: bytes, allowed, resolver: Resolver, pins: Pins):
    """(reply, name, reason): the reply to `wire` from our own resolution, the question's
    name, and why it was refused (None when answered). The reply is None when the message
    cannot be answered at all (malformed).

    `allowed(name)` says whether the policy lets the sandbox resolve `name`."""
    try:
        query = parse_query(wire)
    except QueryRefused as e:
        try:
            reply = dns.message.make_response(dns.message.from_wire(wire))
            reply.question = []
            reply.set_rcode(dns.rcode.REFUSED)
            return reply.to_wire(), None, str(e)
        except Exception:
            return None, None, str(e)
    reply = dns.message.make_response(dns.message.from_wire(wire))
    reply.answer, reply.authority, reply.additional = [], [], []
    name = query.name
    if not allowed(name):
        reply.set_rcode(dns.rcode.REFUSED)
        return reply.to_wire(), name, f"DNS query for {name}: no rule allows that name"
    if query.rdtype not in (dns.rdatatype.A, dns.rdatatype.AAAA):
        return reply.to_wire(), name, None  # allowed name, other type: an empty answer
    try:
        addrs, ttl = resolver.resolve(name)
    except ResolutionError:
        reply.set_rcode(dns.rcode.NXDOMAIN)
        return reply.to_wire(), name, None
    pins.record(name, addrs, ttl)
    version = 4 if query.rdtype == dns.rdatatype.A else 6
    texts = [str(a) for a in addrs if a.version == version]
    if texts:
        qname = reply.question[0].name
        rrset = reply.find_rrset(reply.answer, qname, dns.rdataclass.IN, query.rdtype,
                                 create=True)
        rrset.update_ttl(ttl)
        for t in texts:
            rrset.add(dns.rdata.from_text(dns.rdataclass.IN, query.rdtype, t))
    return reply.to_wire(), name, None
