"""A DNS-over-TCP responder on loopback for sandboxes' redirected DNS connections.

The supervisor redirects a sandbox's TCP connection to port 53 here and registers the
client address with the context (policy, resolver, pins) that answers it. Each query is
answered by `dns.answer_query` (our own resolution; refused names never leave the machine).
Every socket operation has a timeout: a client that stops talking is dropped.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

from .dns import answer_query

IDLE_TIMEOUT = 10.0      # per connection, in total: a slow client cannot hold a thread
MAX_QUERY = 4096
MAX_CONNECTIONS = 1024   # served at once, across all sandboxes (a memory bound)
PER_SANDBOX = 16         # served at once for one sandbox: it cannot shut out the others
EXPECT_TTL = 10.0        # a registered client that never connects is forgotten


class DnsContext:
    def __init__(self, allowed, resolver, pins, on_decision=None, slots=None):
        self.allowed = allowed
        self.resolver = resolver
        self.pins = pins
        self.slots = slots  # the sandbox's share of connections (a semaphore), or None
        # callable(name or None, refusal reason or None) for the audit log
        self.on_decision = on_decision


class DnsTcpProxy:
    def __init__(self):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.address = self._sock.getsockname()
        self._clients: dict[tuple[str, int], tuple[DnsContext, float]] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        threading.Thread(target=self._accept_loop, name="sandlock-dns", daemon=True).start()

    def expect(self, client: tuple[str, int], ctx: DnsContext) -> None:
        """Answer connections from `client` (host, port) with `ctx`."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (_, t) in self._clients.items() if now - t > EXPECT_TTL]:
                del self._clients[key]
            self._clients[client] = (ctx, now)

    def forget(self, client: tuple[str, int], ctx) -> None:
        """Drop `client`'s registration if it is still `ctx`'s (its connect failed)."""
        with self._lock:
            entry = self._clients.get(client)
            if entry is not None and entry[0] is ctx:
                del self._clients[client]

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            self._dispatch(conn, peer)

    def _dispatch(self, conn, peer) -> None:
        """A function of its own so that no context outlives its connection in a local."""
        with self._lock:
            entry = self._clients.pop(peer[:2], None)
        if entry is None or not self._slots.acquire(blocking=False):
            conn.close()  # nobody we redirected, or too many at once
            return
        ctx = entry[0]
        if ctx.slots is not None and not ctx.slots.acquire(blocking=False):
            self._slots.release()
            if ctx.on_decision:
                ctx.on_decision(None, f"more than {PER_SANDBOX} DNS connections at once")
            conn.close()
            return
        threading.Thread(target=self._serve, args=(conn, ctx), daemon=True).start()

    def _serve(self, conn: socket.socket, ctx: DnsContext) -> None:
        deadline = time.monotonic() + IDLE_TIMEOUT
        try:
            while True:
                head = _recv_exact(conn, 2, deadline)
                if head is None:
                    return
                (length,) = struct.unpack("!H", head)
                if not 12 <= length <= MAX_QUERY:
                    return
                wire = _recv_exact(conn, length, deadline)
                if wire is None:
                    return
                try:
                    reply, name, refusal = answer_query(wire, ctx.allowed, ctx.resolver,
                                                        ctx.pins)
                except Exception as e:  # a bug: deny, and say so
                    reply, name, refusal = None, None, f"supervisor error: {e!r}"
                if ctx.on_decision:
                    ctx.on_decision(name, refusal)
                if reply is None:
                    return  # nothing to answer: drop the connection
                conn.sendall(struct.pack("!H", len(reply)) + reply)
        except OSError:
            return
        finally:
            conn.close()
            self._slots.release()
            if ctx.slots is not None:
                ctx.slots.release()


def _recv_exact(conn: socket.socket, n: int, deadline: float) -> bytes | None:
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(left)
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


_proxy: DnsTcpProxy | None = None
_proxy_lock = threading.Lock()


def dns_proxy() -> DnsTcpProxy:
    global _proxy
    with _proxy_lock:
        if _proxy is None:
            _proxy = DnsTcpProxy()
        return _proxy
