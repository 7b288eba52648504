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

from .dns import answer_query

IDLE_TIMEOUT = 10.0
MAX_QUERY = 4096


class DnsContext:
    def __init__(self, allowed, resolver, pins, on_decision=None):
        self.allowed = allowed
        self.resolver = resolver
        self.pins = pins
        self.on_decision = on_decision  # callable(name, allowed) for the audit log


class DnsTcpProxy:
    def __init__(self):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.address = self._sock.getsockname()
        self._clients: dict[tuple[str, int], DnsContext] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._accept_loop, name="sandlock-dns", daemon=True).start()

    def expect(self, client: tuple[str, int], ctx: DnsContext) -> None:
        """Answer connections from `client` (host, port) with `ctx`."""
        with self._lock:
            self._clients[client] = ctx

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            with self._lock:
                ctx = self._clients.pop(peer[:2], None)
            if ctx is None:  # nobody we redirected: not ours to answer
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, ctx), daemon=True).start()

    def _serve(self, conn: socket.socket, ctx: DnsContext) -> None:
        conn.settimeout(IDLE_TIMEOUT)
        try:
            while True:
                head = _recv_exact(conn, 2)
                if head is None:
                    return
                (length,) = struct.unpack("!H", head)
                if not 12 <= length <= MAX_QUERY:
                    return
                wire = _recv_exact(conn, length)
                if wire is None:
                    return
                try:
                    reply, decisions = answer_query(wire, ctx.allowed, ctx.resolver, ctx.pins)
                except Exception:
                    return  # malformed: drop the connection, answer nothing
                if ctx.on_decision:
                    for name, ok in decisions:
                        ctx.on_decision(name, ok)
                conn.sendall(struct.pack("!H", len(reply)) + reply)
        except OSError:
            return
        finally:
            conn.close()


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
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
