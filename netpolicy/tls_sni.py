"""The server name (SNI) of a TLS ClientHello, read from the first bytes of a connection.

Pure: bytes in, a name (or a reason to refuse) out. A ClientHello may span several TLS
records; `client_hello_sni` says how many more bytes it needs. No SNI, an encrypted
ClientHello (ECH, even GREASE: its SNI would only be the outer public name), more than one
name, or anything malformed is refused: the filter cannot decide.
"""

from __future__ import annotations

import struct

MAX_HELLO = 64 * 1024
_HANDSHAKE, _CLIENT_HELLO, _EXT_SERVER_NAME = 22, 1, 0
_EXT_ECH = (0xFE0D, 0xFFCE)  # encrypted_client_hello (and its draft code point)


class SniError(ValueError):
    pass


class NeedMore(Exception):
    pass


def _handshake_bytes(data: bytes) -> bytes:
    """Concatenate handshake-record payloads until the ClientHello is complete."""
    out, off = b"", 0
    while True:
        if len(data) < off + 5:
            raise NeedMore
        ctype, _version, length = struct.unpack_from("!BHH", data, off)
        if ctype != _HANDSHAKE:
            raise SniError("not a TLS handshake")
        if length == 0 or length > 16384 + 2048:
            raise SniError("bad TLS record length")
        if len(data) < off + 5 + length:
            raise NeedMore
        out += data[off + 5:off + 5 + length]
        off += 5 + length
        if len(out) >= 4:
            if out[0] != _CLIENT_HELLO:
                raise SniError("first handshake message is not a ClientHello")
            need = 4 + int.from_bytes(out[1:4], "big")
            if need > MAX_HELLO:
                raise SniError("ClientHello too large")
            if len(out) >= need:
                return out[4:need]


def client_hello_sni(data: bytes, allow_ech: bool = False) -> str | None:
    """The server name, or None if more bytes are needed. Raises SniError to refuse.
    `allow_ech`: when the connection is intercepted (we terminate TLS and check every
    request's Host against this name), an ECH extension is harmless and is ignored."""
    try:
        hello = _handshake_bytes(data)
    except NeedMore:
        if len(data) > MAX_HELLO:
            raise SniError("ClientHello too large") from None
        return None
    try:
        return _server_name(hello, allow_ech)
    except (IndexError, struct.error):
        raise SniError("malformed ClientHello") from None


def _server_name(hello: bytes, allow_ech: bool) -> str:
    off = 2 + 32  # client_version, random
    sid_len = hello[off]
    off += 1 + sid_len
    (cs_len,) = struct.unpack_from("!H", hello, off)
    off += 2 + cs_len
    comp_len = hello[off]
    off += 1 + comp_len
    if off == len(hello):
        raise SniError("ClientHello without extensions (no SNI)")
    (ext_total,) = struct.unpack_from("!H", hello, off)
    off += 2
    end = off + ext_total
    if end != len(hello):
        raise SniError("malformed ClientHello extensions")
    names = []
    while off < end:
        etype, elen = struct.unpack_from("!HH", hello, off)
        off += 4
        body = hello[off:off + elen]
        if len(body) != elen:
            raise SniError("malformed extension")
        off += elen
        if etype in _EXT_ECH and not allow_ech:
            # The SNI would be the outer, public name: the real one is encrypted.
            raise SniError("encrypted ClientHello (ECH): the server name cannot be checked")
        if etype == _EXT_SERVER_NAME:
            if names:
                raise SniError("two server_name extensions")
            (list_len,) = struct.unpack_from("!H", body, 0)
            if list_len + 2 != len(body):
                raise SniError("malformed server_name list")
            p = 2
            while p < len(body):
                ntype, nlen = struct.unpack_from("!BH", body, p)
                name = body[p + 3:p + 3 + nlen]
                if len(name) != nlen:
                    raise SniError("malformed server name")
                p += 3 + nlen
                if ntype == 0:
                    names.append(name)
    if len(names) != 1:
        raise SniError("no server name (SNI) in the ClientHello" if not names
                       else "more than one server name")
    try:
        name = names[0].decode("ascii")
    except UnicodeDecodeError:
        raise SniError("non-ASCII server name") from None
    if not name or any(c in name for c in "\0/ :@"):
        raise SniError("invalid server name")
    return name.lower().rstrip(".")
