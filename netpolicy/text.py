"""Showing strings that came from a sandbox to a person.

Rule: every string a sandboxed program chose (argv, host names, paths, HTTP headers, the
reasons built from them) is passed through `printable` before it reaches a terminal. A
raw escape sequence in an argv once cleared the screen, set the window title and forged
summary lines in `sandlock audit`. Machine-readable output (the JSON Lines audit log,
`--json`) stays exact: it is escaped by its own encoding.

`printable` is injective: a backslash is escaped too, so the shown text names exactly one
original string.
"""

from __future__ import annotations

import shlex
import unicodedata

# Unicode categories never shown raw: controls, format characters (bidi overrides, zero
# width joiners), surrogates (from surrogateescape), private use, unassigned, and line and
# paragraph separators.
_HIDDEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def _escape(ch: str) -> str:
    n = ord(ch)
    if 0xDC80 <= n <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{n - 0xDC00:02x}"
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(value) -> str:
    """`value` as text safe to print: backslashes doubled, every control, format or
    otherwise invisible character written as an escape (`\\x1b`, `\\u202e`)."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and "\\" not in text:
        return text  # the common case, in C
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == " " or (ch.isprintable() and unicodedata.category(ch) not in _HIDDEN):
            out.append(ch)
        else:
            out.append(_escape(ch))
    return "".join(out)


def shell_words(argv, limit: int = 120) -> str:
    """An argv as a shell would read it back (each word quoted as needed, escapes shown),
    shortened to about `limit` characters with an ellipsis."""
    text = " ".join(shlex.quote(printable(a)) for a in argv)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def bracketed(address) -> str:
    """An address as written before a port: IPv6 in brackets."""
    text = printable(address)
    return f"[{text}]" if ":" in text else text
