"""Request-target normalisation: the one string that is both matched and forwarded.

Strict by design (netpolicy-threats, "Path tricks"): percent-encoded unreserved characters
are decoded, other escapes are upper-cased and kept; dot segments are removed (RFC 3986
5.2.4). Anything a server might read differently from us is refused rather than guessed:
encoded `/` or `\\`, backslashes, `;` parameters, empty segments (`//`), control characters
and NUL (raw or encoded), bytes outside ASCII, malformed escapes and escapes that decode to
invalid UTF-8.
"""

from __future__ import annotations

import re

_UNRESERVED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_ALLOWED_RAW = re.compile(r"^[A-Za-z0-9\-._~!$&'()*+,=:@/%]*$")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


class PathError(ValueError):
    """The path cannot be normalised safely: the request is refused with 400."""


def split_target(target: str) -> tuple[str, str | None]:
    """Origin-form target -> (path, query or None). Fragments never reach a server."""
    if "#" in target:
        raise PathError("fragment in request target")
    path, sep, query = target.partition("?")
    return path, (query if sep else None)


def normalize_path(path: str) -> str:
    if not path.startswith("/"):
        raise PathError("path must start with '/'")
    if not _ALLOWED_RAW.match(path):
        bad = next(c for c in path if not _ALLOWED_RAW.match(c))
        raise PathError(f"character {bad!r} is not allowed in a path")
    if "%" in _ESCAPE.sub("", path):
        raise PathError("malformed percent-escape")
    raw_bytes = bytearray()

    def decode(m: re.Match) -> str:
        value = int(m.group(1), 16)
        raw_bytes.append(value)
        if value < 0x20 or value == 0x7F:
            raise PathError("encoded control character")
        if chr(value) in "/\\":
            raise PathError("encoded path separator")
        if value < 0x80 and chr(value) in _UNRESERVED:
            return chr(value)
        return "%" + m.group(1).upper()
    text = _ESCAPE.sub(decode, path)
    try:
        bytes(raw_bytes).decode("utf-8") if raw_bytes and max(raw_bytes) >= 0x80 else None
    except UnicodeDecodeError:
        raise PathError("escapes decode to invalid UTF-8") from None
    if ";" in text:
        raise PathError("';' parameters are not allowed in a path")
    if "//" in text:
        raise PathError("empty path segment ('//')")
    return _remove_dot_segments(text)


def _remove_dot_segments(path: str) -> str:
    out: list[str] = []
    segments = path.split("/")[1:]
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == ".":
            if last:
                out.append("")
        elif seg == "..":
            if out:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(seg)
    return "/" + "/".join(out)
