"""Strict HTTP/1.1 request framing, checked on the raw bytes before any parser sees them.

Rules (netpolicy-threats, "Smuggling"): a message is accepted only if every reasonable
server would frame it the same way. Refused, with status 400: bare LF or CR, obs-fold,
whitespace before a header's colon, a header name that is not a token, a request line that
is not `METHOD SP target SP HTTP/1.x`, a lowercase or non-token method, Content-Length
together with Transfer-Encoding, more than one Content-Length, one that is not plain
decimal digits (`+3`, `3 `, `0x3`, `03`), Transfer-Encoding other than exactly one
`chunked`, and chunked bodies whose size lines or terminators are malformed (the
CVE-2025-43859 payload). h11 then parses only bytes that passed here, so its own leniency
never decides anything.

`RequestFramer` is sans-IO: feed() bytes, get back the validated bytes that may be handed
to the parser; it keeps its place across pipelined requests.
"""

from __future__ import annotations

import re

MAX_HEAD = 64 * 1024
MAX_CHUNK_LINE = 4096
MAX_TRAILERS = 16 * 1024

_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_METHOD = re.compile(rb"^[A-Z][A-Z0-9_-]*$")
_REQUEST_LINE = re.compile(rb"^([^ ]+) ([^ ]+) HTTP/1\.([01])$")
_FIELD_VALUE = re.compile(rb"^[\t\x20-\x7e\x80-\xff]*$")
_CHUNK_SIZE = re.compile(rb"^([0-9A-Fa-f]{1,16})(;[\t !#-~]*)?$")


class FramingError(ValueError):
    """The bytes cannot be framed unambiguously: answer 400 and close."""


def _lines(block: bytes) -> list[bytes]:
    """Split a head (without its final CRLF CRLF) into lines; only CRLF may end a line."""
    lines = block.split(b"\r\n")
    for line in lines:
        if b"\n" in line or b"\r" in line:
            raise FramingError("bare LF or CR in the message head")
    return lines


def parse_fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    fields = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise FramingError("obsolete line folding")
        name, sep, value = line.partition(b":")
        if not sep:
            raise FramingError("header line without a colon")
        if not _TOKEN.match(name):
            raise FramingError(f"bad header name {name[:40]!r}")
        value = value.strip(b" \t")
        if not _FIELD_VALUE.match(value):
            raise FramingError(f"control character in header {name.decode()}")
        fields.append((name.lower(), value))
    return fields


def check_head(head: bytes) -> tuple[str, int | None]:
    """Validate a request head (request line + fields, without the final blank line).
    Returns the body framing: ("none", None), ("length", n) or ("chunked", None)."""
    lines = _lines(head)
    m = _REQUEST_LINE.match(lines[0])
    if not m:
        raise FramingError("malformed request line (only HTTP/1.0 and HTTP/1.1)")
    if not _METHOD.match(m.group(1)):
        raise FramingError(f"method {m.group(1)[:20]!r} is not an upper-case token")
    fields = parse_fields(lines[1:])
    lengths = [v for n, v in fields if n == b"content-length"]
    codings = [v for n, v in fields if n == b"transfer-encoding"]
    if lengths and codings:
        raise FramingError("both Content-Length and Transfer-Encoding")
    if len(lengths) > 1:
        raise FramingError("more than one Content-Length")
    if lengths:
        v = lengths[0]
        if not v.isdigit() or (len(v) > 1 and v[:1] == b"0") or len(v) > 18:
            raise FramingError(f"bad Content-Length {v[:20]!r}")
        n = int(v)
        return ("length", n) if n else ("none", None)
    if codings:
        if len(codings) != 1 or codings[0].lower() != b"chunked":
            raise FramingError("Transfer-Encoding other than a single 'chunked'")
        if m.group(3) == b"0":
            raise FramingError("Transfer-Encoding in an HTTP/1.0 request")
        return ("chunked", None)
    return ("none", None)


class RequestFramer:
    """Validates a stream of requests; `feed` returns the bytes that passed."""

    def __init__(self):
        self._buf = b""
        self._state = "head"
        self._left = 0  # bytes of the current body or chunk still to come

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        out = bytearray()
        while True:
            progressed = getattr(self, "_" + self._state)(out)
            if not progressed:
                return bytes(out)

    def _head(self, out) -> bool:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD:
                raise FramingError("request head too large")
            if b"\n" in self._buf.replace(b"\r\n", b""):
                raise FramingError("bare LF in the message head")
            return False
        if end > MAX_HEAD:
            raise FramingError("request head too large")
        head = self._buf[:end]
        framing, n = check_head(head)
        out += self._buf[:end + 4]
        self._buf = self._buf[end + 4:]
        if framing == "length":
            self._state, self._left = "body", n
        elif framing == "chunked":
            self._state = "chunk_size"
        return True

    def _counted(self, out, then: str) -> bool:
        """Pass up to `_left` bytes of a body or chunk through; `then` once all are."""
        if not self._buf:
            return False
        take = self._buf[:self._left]
        out += take
        self._buf = self._buf[len(take):]
        self._left -= len(take)
        if self._left == 0:
            self._state = then
        return True

    def _body(self, out) -> bool:
        return self._counted(out, "head")

    def _chunk_size(self, out) -> bool:
        end = self._buf.find(b"\r\n")
        if end < 0:
            if len(self._buf) > MAX_CHUNK_LINE or b"\n" in self._buf:
                raise FramingError("malformed chunk size line")
            return False
        line = self._buf[:end]
        m = _CHUNK_SIZE.match(line)
        if not m:
            raise FramingError(f"malformed chunk size {line[:40]!r}")
        out += self._buf[:end + 2]
        self._buf = self._buf[end + 2:]
        self._left = int(m.group(1), 16)
        self._state = "chunk_data" if self._left else "trailers"
        return True

    def _chunk_data(self, out) -> bool:
        return self._counted(out, "chunk_end")

    def _chunk_end(self, out) -> bool:
        if len(self._buf) < 2:
            if self._buf and self._buf != b"\r":
                raise FramingError("chunk data not followed by CRLF")
            return False
        if self._buf[:2] != b"\r\n":
            raise FramingError("chunk data not followed by CRLF")
        out += b"\r\n"
        self._buf = self._buf[2:]
        self._state = "chunk_size"
        return True

    def _trailers(self, out) -> bool:
        if self._buf.startswith(b"\r\n"):
            out += b"\r\n"
            self._buf = self._buf[2:]
            self._state = "head"
            return True
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_TRAILERS:
                raise FramingError("trailers too large")
            if self._buf and b"\n" in self._buf.replace(b"\r\n", b""):
                raise FramingError("bare LF in trailers")
            return False
        parse_fields(_lines(self._buf[:end]))
        out += self._buf[:end + 4]
        self._buf = self._buf[end + 4:]
        self._state = "head"
        return True
