"""The HTTP filter: a loopback proxy that sandboxes' HTTP connections are redirected to.

The supervisor connects a sandbox's socket here instead of to the destination it asked
for, and registers the client address with an `HttpContext` (that original destination,
already admitted by the endpoint policy, the HTTP rules, the DNS pins, the audit sink).

Rules enforced here (netpolicy-threats, "HTTP requests" and "TLS"):
- Nothing the sandbox sends is relayed as raw bytes. Each request's bytes pass the strict
  framer (http_framing) before h11 parses them; the request is checked, then re-serialised
  with framing and hop-by-hop headers recomputed, and its target is exactly the normalised
  string that was matched. Every request on a connection is checked, pipelined ones too.
- The upstream connection is opened only after the first request is allowed, to the
  original destination, which is the address the Host resolved to (pinned) or the literal
  address the Host names; any other Host is refused, never forwarded on trust.
- Protocol switches (Upgrade, CONNECT, HTTP/2) are refused unless the policy names them in
  `upgrades` ("websocket", "h2c", "h2" for prior knowledge, "connect"): the request that
  asks for the switch is still judged (CONNECT on its target host), and what follows the
  switch is spliced, not inspected; the audit record says so. Expect: 100-continue is answered by
  us after the decision, so no body goes upstream before it.
- TLS connections are decided on their ClientHello's SNI (tls_sni) and then spliced, or,
  with interception (tls_intercept), terminated with a leaf for that SNI and judged
  request by request like plain HTTP (the Host must then equal the SNI), the upstream
  connection being TLS again with its certificate verified.
- Any error denies: 400 for what cannot be framed or normalised, 403 for a decision, and
  the connection is closed. Every socket wait has a timeout.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time

import h11

from .http_decide import (_HOP_BY_HOP, Decided, HttpContext, Refusal,  # noqa: F401
                          aliases, check_destination, decide_request)
from .http_framing import FramingError, RequestFramer
from .http_rules import decide_tls_host
from .tls_sni import SniError, client_hello_sni

IDLE_TIMEOUT = 30.0       # no byte from either side for this long: close
HEAD_TIMEOUT = 30.0       # a request head must be complete this long after it began
CONNECT_TIMEOUT = 10.0
MAX_CONNECTIONS = 256     # served at once, across all sandboxes
PER_SANDBOX = 64          # served at once for one sandbox: it cannot shut out the others
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EXPECT_TTL = 10.0
CHUNK = 65536


class _Closed(Exception):
    pass


def _recv(sock: socket.socket, deadline_fn) -> bytes:
    sock.settimeout(max(0.01, deadline_fn()))
    try:
        return sock.recv(CHUNK)
    except socket.timeout:
        raise _Closed("idle timeout") from None


class HttpFilterProxy:
    def __init__(self):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(256)
        self.address = self._sock.getsockname()
        self._clients: dict[tuple[str, int], tuple[HttpContext, float]] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        threading.Thread(target=self._accept_loop, name="sandlock-http", daemon=True).start()

    def expect(self, client: tuple[str, int], ctx: HttpContext) -> None:
        """Judge the connection from `client` with `ctx`. A live registration is never
        replaced: another socket sharing that address could otherwise inherit it."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (_, t) in self._clients.items() if now - t > EXPECT_TTL]:
                del self._clients[key]
            if client in self._clients:
                raise OSError(98, f"{client} is already waiting for the HTTP filter")
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
        ctx = entry[0] if entry is not None else None
        if ctx is None or not self._slots.acquire(blocking=False):
            conn.close()
            return
        if ctx.slots is not None and not ctx.slots.acquire(blocking=False):
            self._slots.release()
            self._audit(ctx, "deny", protocol="http", rule="default:quota",
                        reason=f"more than {PER_SANDBOX} connections through the HTTP "
                               f"filter at once", errno="EAGAIN")
            conn.close()
            return
        threading.Thread(target=self._run, args=(conn, ctx),
                         daemon=True, name="sandlock-http-conn").start()

    def _run(self, conn, ctx) -> None:
        try:
            # Heads and bodies are written separately: never wait on a delayed ACK.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(IDLE_TIMEOUT)
            try:
                first = conn.recv(1, socket.MSG_PEEK)
            except socket.timeout:
                return
            if not first:
                return
            if first != b"\x16" and not _looks_like_http(conn):
                reason = (f"the bytes sent to {ctx.address}:{ctx.port} are neither HTTP nor "
                          f"TLS, and HTTP rules name this host (mark the endpoint raw to "
                          f"relay it unfiltered: http_raw)")
                if ctx.report is None:
                    self._audit(ctx, "deny", protocol="tcp", rule="default:protocol",
                                reason=reason, errno="EACCES")
                    return
                ctx.report()  # report-only: relayed as it is, and recorded
                self._audit(ctx, "would-deny", protocol="tcp", rule="default:protocol",
                            reason=reason, errno="EACCES")
                up = _connect_upstream(ctx)
                try:
                    return _splice(conn, up)
                finally:
                    up.close()
            (self._serve_tls if first == b"\x16" else self._serve_http)(conn, ctx)
        except Exception:
            pass  # a failure ends the connection; it never lets anything through
        finally:
            conn.close()
            self._slots.release()
            if ctx.slots is not None:
                ctx.slots.release()

    # -- audit --

    def _audit(self, ctx, decision, **fields) -> None:
        if ctx.audit is not None:
            ctx.audit(decision=decision, **ctx.info, address=str(ctx.address), port=ctx.port,
                      **fields)

    # -- plain HTTP --

    def _serve_http(self, conn: socket.socket, ctx: HttpContext) -> None:
        if "h2" in ctx.upgrades:
            try:
                head = conn.recv(len(H2_PREFACE), socket.MSG_PEEK | socket.MSG_WAITALL)
            except socket.timeout:
                return
            if head == H2_PREFACE:  # HTTP/2 with prior knowledge, allowed: not inspected
                self._audit(ctx, "allow", protocol="h2", rule="http_upgrades:h2",
                            reason="HTTP/2 with prior knowledge is spliced, not inspected")
                up = _connect_upstream(ctx)
                try:
                    return _splice(conn, up)
                finally:
                    up.close()
        state = _HttpConnection(conn, ctx)
        try:
            state.serve(self)
        finally:
            state.close_upstream()

    # -- TLS, decided on the SNI --

    def _serve_tls(self, conn: socket.socket, ctx: HttpContext) -> None:
        deadline = time.monotonic() + IDLE_TIMEOUT
        try:
            sni, hello = _peek_client_hello(conn, deadline, ctx.intercept is not None)
        except (SniError, _Closed) as e:
            self._audit(ctx, "deny", protocol="tls", rule="default:sni", reason=str(e),
                        errno="EACCES")
            return
        try:
            check_destination(ctx, sni)
            verdict = decide_tls_host(ctx.policy, sni, aliases(ctx, sni), ctx.port)
            # Intercepted, a rule that needs the request is applied to each request; only
            # a host no rule can admit (or a host-wide deny) is refused here.
            if not verdict.allowed and not (ctx.intercept is not None
                                            and verdict.needs_interception):
                raise Refusal(403, verdict.reason, verdict.rule)
        except Refusal as r:
            if ctx.report is None:
                self._audit(ctx, "deny", protocol="tls", host=sni, rule=r.rule,
                            reason=r.reason, errno="EACCES")
                return
            ctx.report()  # report-only: recorded, then the connection goes on
            self._audit(ctx, "would-deny", protocol="tls", host=sni, rule=r.rule,
                        reason=r.reason, errno="EACCES")
            verdict = None
        if ctx.intercept is not None:
            return self._intercept(conn, ctx, sni)
        if verdict is not None:
            self._audit(ctx, "allow", protocol="tls", host=sni, rule=verdict.rule)
        up = _connect_upstream(ctx)
        try:
            _splice(conn, up)  # the peeked ClientHello is still unread: it goes first
        finally:
            up.close()

    def _intercept(self, conn: socket.socket, ctx: HttpContext, sni: str) -> None:
        """Terminate TLS with a leaf for `sni`; judge every request inside."""
        ctx.sni = sni

        def open_upstream():
            raw = _connect_upstream(ctx)
            try:
                return ctx.intercept.upstream.wrap_socket(raw, server_hostname=sni)
            except BaseException:
                raw.close()
                raise
        try:
            up = open_upstream()
        except ssl.SSLError as e:
            self._audit(ctx, "deny", protocol="https", host=sni, rule="default:upstream-tls",
                        reason=f"upstream TLS for {sni} failed verification: "
                               f"{getattr(e, 'verify_message', None) or e}", errno="EACCES")
            return
        try:
            tls = ctx.intercept.server_context(sni).wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            up.close()
            return  # the client does not trust our CA, or went away
        state = _HttpConnection(tls, ctx, up, open_upstream, protocol="https")
        try:
            state.serve(self)
        finally:
            state.close_upstream()
            try:
                tls.close()
            except OSError:
                pass


def _looks_like_http(conn: socket.socket) -> bool:
    """The first bytes are a request line's method and a space (peeked, not consumed)."""
    deadline = time.monotonic() + HEAD_TIMEOUT
    while True:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            head = conn.recv(24, socket.MSG_PEEK)
        except socket.timeout:
            return False
        method, space, _ = head.partition(b" ")
        if space:
            return bool(method) and all(0x21 <= c < 0x7F and c not in b'()<>@,;:\\"/[]?={}'
                                        for c in method)
        if len(head) >= 24 or not head or time.monotonic() > deadline:
            return False
        if not all(0x21 <= c < 0x7F for c in head):
            return False
        time.sleep(0.002)


def _peek_client_hello(conn: socket.socket, deadline: float,
                       intercepting: bool) -> tuple[str, int]:
    """(SNI, length of the ClientHello records) read with MSG_PEEK: nothing is consumed,
    so the hello can still be forwarded untouched or handed to our own TLS server."""
    want = 5
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Closed("no complete ClientHello in time")
        conn.settimeout(left)
        try:
            data = conn.recv(max(want, 5), socket.MSG_PEEK)
        except socket.timeout:
            raise _Closed("no complete ClientHello in time") from None
        if not data:
            raise _Closed("closed before the ClientHello")
        sni = client_hello_sni(data, allow_ech=intercepting)
        if sni is not None:
            return sni, len(data)
        if len(data) < want:  # nothing new yet (a peek does not drain): wait a little
            time.sleep(0.002)
        want = len(data) + 4096


def _connect_upstream(ctx: HttpContext) -> socket.socket:
    """Our own connection to the original destination (already admitted)."""
    s = socket.create_connection((str(ctx.address), ctx.port), timeout=CONNECT_TIMEOUT)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _splice(a: socket.socket, b: socket.socket, redact_b=None) -> None:
    """Relay both ways until either side closes or IDLE_TIMEOUT passes without a byte.
    Every write is bounded too: a peer that stops reading ends the relay. `redact_b`
    (a credentials.Redactor) masks secrets in what `b` sends to `a`."""
    import selectors
    a.settimeout(IDLE_TIMEOUT)
    b.settimeout(IDLE_TIMEOUT)
    peers = {a: b, b: a}
    open_ = {a, b}
    with selectors.DefaultSelector() as sel:
        for s in open_:
            sel.register(s, selectors.EVENT_READ)
        while open_:
            # Bytes already decrypted inside an SSL object make no fd readable.
            ready = [s for s in open_ if isinstance(s, ssl.SSLSocket) and s.pending()]
            if not ready:
                ready = [k.fileobj for k, _ in sel.select(IDLE_TIMEOUT) if k.fileobj in open_]
            if not ready:
                return
            for s in ready:
                data = s.recv(CHUNK)
                if not data:
                    if s is b and redact_b is not None:
                        a.sendall(redact_b.flush())
                    open_.discard(s)
                    sel.unregister(s)
                    try:
                        peers[s].shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    continue
                if s is b and redact_b is not None:
                    data = redact_b.feed(data)
                peers[s].sendall(data)


class _HttpConnection:
    """One sandbox connection: requests in, checked, re-serialised, responses streamed."""

    def __init__(self, conn: socket.socket, ctx: HttpContext, up=None, opener=None,
                 protocol: str = "http"):
        self.conn, self.ctx, self.protocol = conn, ctx, protocol
        self.framer = RequestFramer()
        self.server = h11.Connection(h11.SERVER)
        self.up = up
        self.client: h11.Connection | None = h11.Connection(h11.CLIENT) if up else None
        self.opener = opener or (lambda: _connect_upstream(ctx))
        self.last = time.monotonic()
        self.head_deadline: float | None = None
        self._redactor = None  # credentials.Redactor for the response in flight
        self._identity_only = False  # a credential went out: no content coding back

    def _left(self) -> float:
        left = self.last + IDLE_TIMEOUT - time.monotonic()
        if self.head_deadline is not None:  # a trickled head cannot hold a slot forever
            left = min(left, self.head_deadline - time.monotonic())
        return left

    def _next_request_event(self, head: bool = False):
        self.head_deadline = time.monotonic() + HEAD_TIMEOUT if head else None
        while True:
            ev = self.server.next_event()
            if ev is not h11.NEED_DATA:
                return ev
            data = _recv(self.conn, self._left)
            self.last = time.monotonic()
            self.server.receive_data(self.framer.feed(data) if data else b"")

    def serve(self, proxy: HttpFilterProxy) -> None:
        ctx = self.ctx
        self._proxy = proxy
        while True:
            try:
                ev = self._next_request_event(head=True)
            except FramingError as e:
                return self._refuse(proxy, Refusal(400, f"ambiguous framing: {e}",
                                                   "default:framing"))
            except h11.RemoteProtocolError as e:
                return self._refuse(proxy, Refusal(400, f"malformed request: {e}",
                                                   "default:framing"))
            except _Closed:
                return
            if isinstance(ev, (h11.ConnectionClosed, h11.EndOfMessage)) or ev is h11.PAUSED:
                return
            if not isinstance(ev, h11.Request):
                return
            try:
                decided = decide_request(ctx, ev)
            except Refusal as r:
                return self._refuse(proxy, r, method=ev.method.decode("ascii", "replace"))
            creds = {}
            if decided.applied is not None:  # names, never values
                a = decided.applied
                creds = {k: ",".join(v) for k, v in (("credential", a.injected),
                                                     ("credential_withheld", a.withheld)) if v}
            would = getattr(decided, "would", None)
            if would is not None:  # report-only: what the rules would have refused
                ctx.report()
                proxy._audit(ctx, "would-deny", protocol=self.protocol,
                             method=ev.method.decode(), host=decided.host, path=decided.path,
                             rule=would.rule, reason=would.reason, errno="EACCES")
            else:
                proxy._audit(ctx, "allow", protocol=self.protocol, method=ev.method.decode(),
                             host=decided.host, path=decided.path, rule=decided.rule,
                             **creds)
            if not self._forward(decided):
                return
            self.last = time.monotonic()
            if self.server.our_state is h11.DONE and self.server.their_state is h11.DONE:
                self.server.start_next_cycle()
            else:
                return

    def _refuse(self, proxy, r: Refusal, method: str | None = None) -> None:
        fields = dict(r.fields)
        if method is not None:
            fields.setdefault("method", method)
        proxy._audit(self.ctx, "deny", protocol=self.protocol, rule=r.rule, reason=r.reason,
                     errno="EACCES", **fields)
        phrase = {400: b"Bad Request", 403: b"Forbidden", 413: b"Content Too Large",
                  502: b"Bad Gateway"}.get(r.status, b"Error")
        body = f"sandlock: {r.reason}\n".encode("utf-8", "replace")
        head = (b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % (r.status, phrase,
                                                                      len(body)))
        try:
            self.conn.sendall(head + body)
        except OSError:
            pass

    def close_upstream(self) -> None:
        if self.up is not None:
            self.up.close()
            self.up = self.client = None

    def _open_upstream(self) -> None:
        if self.up is None:
            self.up = self.opener()
            self.client = h11.Connection(h11.CLIENT)

    def _send_up(self, event) -> None:
        data = self.client.send(event)
        if data:
            self.up.sendall(data)

    def _send_down(self, event) -> None:
        data = self.server.send(event)
        if data:
            self.conn.sendall(data)

    def _forward(self, d: Decided) -> bool:
        """Send the request (and its body) upstream and stream the response back.
        False when the connection must end."""
        from .credentials import MAX_SWAP_BODY, Redactor, Scanner
        applied = d.applied
        swap = applied.body_swap if applied is not None else {}
        scanner = Scanner(applied.body_scan) if applied is not None and \
            applied.body_scan else None
        # A sandbox with credentials has every spelling of every secret masked in every
        # response it gets (an echo, a stored copy); with what this request carried.
        creds = self.ctx.credentials
        forms = (applied.redact if applied is not None else ()) + (
            creds.all_forms() if creds is not None else ())
        self._redactor = Redactor(sorted(set(forms), key=len, reverse=True)) if forms \
            else None
        self._identity_only = applied is not None and bool(applied.redact)
        self._method = d.method
        if self.server.they_are_waiting_for_100_continue:
            self._send_down(h11.InformationalResponse(status_code=100, headers=[],
                                                      reason=b"Continue"))
        held = [] if swap else None  # a body whose placeholders are swapped: held whole
        # With a body to scan, the head waits for the body's first bytes: a small body
        # carrying a placeholder is then refused before anything goes upstream.
        head_sent = held is not None

        def send_head():
            nonlocal head_sent
            if not head_sent:
                head_sent = True
                self._open_upstream()
                self._send_up(h11.Request(method=d.method, target=d.target,
                                          headers=d.headers))
        if scanner is None:
            send_head()
        size = 0
        while True:  # the request body, as it arrives (already framed strictly)
            try:
                ev = self._next_request_event()
            except (FramingError, h11.RemoteProtocolError) as e:
                self._refuse(self._proxy, Refusal(400, f"ambiguous framing: {e}",
                                                  "default:framing"))
                return False
            if isinstance(ev, h11.Data):
                data = ev.data
                if scanner is not None:
                    data, cred = scanner.feed(data)
                    if cred is not None:  # the head went up; the body stops here
                        self.close_upstream()
                        self._refuse(self._proxy, Refusal(
                            403, f"the placeholder of credential {cred} was sent in the body "
                                 f"of {d.method.decode()} {d.host}{d.path}, which no rule for "
                                 f"it names", f"credential:{cred}", host=d.host, path=d.path))
                        return False
                if held is not None:
                    size += len(data)
                    if size > MAX_SWAP_BODY:
                        self._refuse(self._proxy, Refusal(
                            413, f"a body whose credential placeholders are swapped is held "
                                 f"whole, up to {MAX_SWAP_BODY >> 20} MiB", "default:size",
                            host=d.host, path=d.path))
                        return False
                    held.append(data)
                elif data:
                    send_head()
                    self._send_up(h11.Data(data=data))
            elif isinstance(ev, h11.EndOfMessage):
                rest = scanner.flush() if scanner is not None else b""
                if held is not None:
                    body = b"".join(held) + rest
                    for ph, secret in swap.items():
                        body = body.replace(ph, secret)
                    headers = [(n, v) for n, v in d.headers
                               if n not in (b"content-length", b"transfer-encoding")]
                    headers.append((b"content-length", b"%d" % len(body)))
                    self._open_upstream()
                    self._send_up(h11.Request(method=d.method, target=d.target,
                                              headers=headers))
                    rest = body
                send_head()
                if rest:
                    self._send_up(h11.Data(data=rest))
                self._send_up(h11.EndOfMessage())
                break
            else:
                return False
        return self._relay_response()

    def _relay_response(self) -> bool:
        while True:
            ev = self.client.next_event()
            if ev is h11.NEED_DATA:
                self.up.settimeout(IDLE_TIMEOUT)
                try:
                    data = self.up.recv(CHUNK)
                except socket.timeout:
                    return False
                self.client.receive_data(data)
                continue
            if isinstance(ev, h11.InformationalResponse):
                if ev.status_code == 101 and self.server.their_state is h11.MIGHT_SWITCH_PROTOCOL:
                    return self._switch(ev)
                continue  # 1xx from upstream: ours was sent already, others are dropped
            if isinstance(ev, h11.Response) and self._method == b"CONNECT" and \
                    200 <= ev.status_code < 300:
                self._send_down(h11.Response(status_code=ev.status_code, headers=[],
                                             reason=ev.reason))
                return self._tunnel()
            if isinstance(ev, h11.Response) and self._identity_only and any(
                    n.lower() == b"content-encoding" and v.strip().lower() != b"identity"
                    for n, v in ev.headers):
                # We asked for no content coding: an echo of the secret could hide in one.
                self.close_upstream()
                self._refuse(self._proxy, Refusal(
                    502, "the server sent a compressed response to a request that carried a "
                         "credential (identity was asked for)", "default:credential-echo"))
                return False
            if isinstance(ev, h11.Response):
                chunked = any(n.lower() == b"transfer-encoding" for n, _ in ev.headers)
                # h11 decoded the body by Transfer-Encoding when both were sent: the
                # Content-Length is then not the body's and must not be passed on.
                headers = [(n, v) for n, v in ev.headers
                           if n.lower() not in _HOP_BY_HOP
                           or (n.lower() == b"content-length" and not chunked)]
                if chunked:
                    headers.append((b"transfer-encoding", b"chunked"))
                red = self._redactor
                reason = ev.reason
                if red is not None:  # a server echoing a secret does not hand it inside
                    headers = [(n, red.value(v)) for n, v in headers]
                    reason = red.value(reason)
                self._send_down(h11.Response(status_code=ev.status_code, headers=headers,
                                             reason=reason))
            elif isinstance(ev, h11.Data):
                data = ev.data if self._redactor is None else self._redactor.feed(ev.data)
                if data:
                    self._send_down(h11.Data(data=data))
            elif isinstance(ev, h11.EndOfMessage):
                if self._redactor is not None:
                    rest = self._redactor.flush()
                    if rest:
                        self._send_down(h11.Data(data=rest))
                self._send_down(h11.EndOfMessage())
                if self.client.our_state is h11.DONE and self.client.their_state is h11.DONE:
                    self.client.start_next_cycle()
                else:
                    self.close_upstream()
                return True
            else:  # upstream closed mid-response
                return False

    def _switch(self, ev) -> bool:
        """An allowed upgrade was accepted upstream: pass the 101 on, then splice."""
        keep = [(n, v) for n, v in ev.headers
                if n.lower() in (b"upgrade", b"connection") or n.lower().startswith(b"sec-")]
        if self._redactor is not None:  # what follows the switch is not inspected
            keep = [(n, self._redactor.value(v)) for n, v in keep]
        self._send_down(h11.InformationalResponse(status_code=101, headers=keep,
                                                  reason=b"Switching Protocols"))
        return self._tunnel()

    def _tunnel(self) -> bool:
        """After an allowed switch (101, or 2xx to CONNECT): what each side already sent
        past the switch goes on, then the bytes are spliced (no longer HTTP)."""
        from_client, _ = self.server.trailing_data
        from_upstream, _ = self.client.trailing_data
        if from_client:
            self.up.sendall(from_client)
        red = self._redactor  # a sandbox with credentials: its secrets masked after too
        if from_upstream:
            self.conn.sendall(red.feed(from_upstream) if red is not None else from_upstream)
        _splice(self.conn, self.up, red)
        return False


_proxy: HttpFilterProxy | None = None
_proxy_lock = threading.Lock()


def http_proxy() -> HttpFilterProxy:
    global _proxy
    with _proxy_lock:
        if _proxy is None:
            _proxy = HttpFilterProxy()
        return _proxy
