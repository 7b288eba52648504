"""A real DNS server for tests: UDP and TCP on one loopback address/port, answering A/AAAA
from a small zone and recording every query name it receives."""

import socket
import struct
import threading

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


class TestDnsServer:
    __test__ = False  # a helper, not a test class
    live: list["TestDnsServer"] = []  # closed by conftest after each test

    def __init__(self, zone: dict[str, list[str]], host: str = "127.0.0.53", ttl: int = 30):
        self.zone = {k.lower().rstrip("."): v for k, v in zone.items()}
        self.ttl = ttl
        self.queries: list[str] = []
        self.raw: list[bytes] = []  # every message received, as it arrived
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((host, 0))
        self.port = self.udp.getsockname()[1]
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind((host, self.port))
        self.tcp.listen(16)
        self.address = f"{host}:{self.port}"
        self._lock = threading.Lock()
        TestDnsServer.live.append(self)
        threading.Thread(target=self._udp_loop, daemon=True).start()
        threading.Thread(target=self._tcp_loop, daemon=True).start()

    def _answer(self, wire: bytes) -> bytes:
        with self._lock:
            self.raw.append(wire)
        q = dns.message.from_wire(wire)
        r = dns.message.make_response(q)
        for question in q.question:
            name = question.name.to_text(omit_final_dot=True).lower()
            with self._lock:
                self.queries.append(name)
            addrs = self.zone.get(name)
            if addrs is None:
                r.set_rcode(dns.rcode.NXDOMAIN)
                continue
            want = [a for a in addrs if (":" in a) == (question.rdtype == dns.rdatatype.AAAA)]
            if question.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA) and want:
                r.answer.append(dns.rrset.from_text_list(
                    question.name, self.ttl, "IN", dns.rdatatype.to_text(question.rdtype), want))
        return r.to_wire()

    def _udp_loop(self):
        while True:
            try:
                data, peer = self.udp.recvfrom(4096)
                self.udp.sendto(self._answer(data), peer)
            except OSError:
                return
            except Exception:
                continue

    def _tcp_loop(self):
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return
            threading.Thread(target=self._tcp_conn, args=(conn,), daemon=True).start()

    def _tcp_conn(self, conn):
        with conn:
            try:
                while True:
                    head = conn.recv(2)
                    if len(head) < 2:
                        return
                    (n,) = struct.unpack("!H", head)
                    data = b""
                    while len(data) < n:
                        chunk = conn.recv(n - len(data))
                        if not chunk:
                            return
                        data += chunk
                    reply = self._answer(data)
                    conn.sendall(struct.pack("!H", len(reply)) + reply)
            except OSError:
                return

    def received(self, data: bytes) -> bool:
        """Whether any message that reached this server contained `data`."""
        with self._lock:
            return any(data in m for m in self.raw)

    def saw(self, name: str) -> bool:
        with self._lock:
            return any(q == name or q.startswith(name + ".") for q in self.queries)

    def close(self):
        for sock in (self.udp, self.tcp):
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the loop blocked on it
            except OSError:
                pass
            sock.close()
