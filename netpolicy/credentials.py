"""Credentials the HTTP filter adds to requests: secrets that never enter the sandbox.

A credential is a named secret held by the supervising process only. An auth rule says
which requests carry it and how:

    "METHOD host/path SCHEME NAME [for=PATH,PATH] [allow_cleartext] [swap=query,body]"

    - methods: [GET]            # the structured (YAML) form: the HTTP rule keys, plus
      host: api.github.com
      path: /repos/*
      scheme: bearer            # bearer | basic | header:Header-Name | query:param
      credential: GITHUB
      for: [/usr/bin/gh]        # optional: only connections made by these programs
      allow_cleartext: false    # plain http:// may carry it (default: refused)
      swap: [query]             # placeholders swapped in query strings / bodies too

Invariants, enforced in `Credentials.apply` (called only for a request the HTTP rules
already allowed, on the normalised request that will be forwarded):
- A secret is added only to requests an auth rule for it matches (method, host, path,
  port), made by a program the rule binds it to (the executable by device and inode,
  identified by the supervisor at connect time, with no loader variable that could put
  foreign code in it), over TLS unless the rule allows cleartext. A header the client sent
  under the same name is replaced, never duplicated.
- A placeholder (the value the sandbox may see instead of the secret) is swapped for the
  secret in headers of such requests; in query strings and bodies only where the rule
  says `swap:`. A placeholder sent on any other request refuses that request: a leaked
  placeholder is worthless, and the attempt is recorded.
- No secret appears in a refusal reason or an audit field: they name credentials only.
  Responses to a request that carried a secret have it masked (same length, so framing is
  unchanged) should the server echo it back.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote_plus

from .http_rules import HttpRule, HttpRuleError, parse_http_rule

SCHEMES = ("bearer", "basic", "header", "query")  # and apikey:NAME = header:NAME
SWAPS = ("query", "body")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Loader variables that put code of the caller's choice into any program: a process
# started with one is not the program a binding names.
LOADER_VARS = (b"LD_PRELOAD", b"LD_AUDIT", b"LD_LIBRARY_PATH")
MAX_SWAP_BODY = 8 << 20   # a body whose placeholders are swapped is held whole: bounded


class CredentialError(ValueError):
    pass


@dataclass(frozen=True)
class AuthRule:
    spec: str
    match: HttpRule               # which requests (method, host, path, port)
    credential: str
    scheme: str                   # one of SCHEMES
    param: str | None = None      # header name (lower-case), query parameter, Basic user
    allow_cleartext: bool = False
    executables: tuple[str, ...] = ()   # paths as written; resolved by Credentials
    swap: frozenset = frozenset()       # subset of SWAPS
    add_only: bool = False        # keep a header/parameter the client set (upstream's)

    @property
    def header(self) -> bytes | None:
        if self.scheme in ("bearer", "basic"):
            return b"authorization"
        if self.scheme == "header":
            return self.param.encode("ascii")
        return None


def _scheme(text: str, spec: str) -> tuple[str, str | None]:
    """bearer | basic (the secret is user:password) | basic:USER | header:NAME |
    apikey:NAME (the same) | query:PARAM."""
    kind, colon, param = str(text).partition(":")
    kind = kind.lower()
    if kind == "apikey":
        kind = "header"
    if kind not in SCHEMES:
        raise CredentialError(f"{spec}: unknown scheme {text!r} (bearer, basic, basic:USER, "
                              f"header:Header-Name, apikey:Header-Name or query:param)")
    if kind == "basic" and colon:
        if not param or ":" in param or any(ord(c) < 0x21 for c in param):
            raise CredentialError(f"{spec}: basic:USER needs a user without ':' (RFC 7617)")
        return kind, param
    if kind in ("header", "query"):
        if not param or not (_HEADER if kind == "header" else _NAME).match(param):
            raise CredentialError(f"{spec}: {kind}: needs a name, e.g. {kind}:"
                                  f"{'X-Api-Key' if kind == 'header' else 'api_key'}")
        if kind == "header" and param.lower() in ("host", "content-length",
                                                   "transfer-encoding", "connection"):
            raise CredentialError(f"{spec}: {param} cannot carry a credential")
        return kind, param.lower() if kind == "header" else param
    if colon:
        raise CredentialError(f"{spec}: {kind} takes no parameter")
    return kind, None


def _credential_name(name, spec: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise CredentialError(f"{spec}: {name!r} is not a credential name (letters, digits, "
                              f"'_', '-', '.')")
    return name


def _swap(values, spec: str) -> frozenset:
    values = [values] if isinstance(values, str) else list(values or ())
    bad = [v for v in values if v not in SWAPS]
    if bad:
        raise CredentialError(f"{spec}: swap: {bad[0]!r} is not one of {', '.join(SWAPS)} "
                              f"(headers are always swapped)")
    return frozenset(values)


def _executables(values, spec: str) -> tuple[str, ...]:
    values = [values] if isinstance(values, str) else list(values or ())
    if not all(isinstance(v, str) and v for v in values):
        raise CredentialError(f"{spec}: for: expected a list of executable paths")
    return tuple(values)


def parse_auth_rule(rule) -> AuthRule:
    """An auth rule from its string form or its structured (mapping) form."""
    if isinstance(rule, str):
        spec = repr(rule)
        parts = rule.split()
        if len(parts) < 4:
            raise CredentialError(f"{spec}: expected 'METHOD host/path SCHEME NAME', e.g. "
                                  f"'GET api.github.com/* bearer GITHUB'")
        method, target, scheme, name, *options = parts
        cleartext, executables, swap, add_only = False, (), frozenset(), False
        for opt in options:
            key, eq, value = opt.partition("=")
            if opt == "allow_cleartext":
                cleartext = True
            elif opt in ("replace", "add-only"):
                add_only = opt == "add-only"
            elif key == "for" and eq and value:
                executables = _executables(value.split(","), spec)
            elif key == "swap" and eq and value:
                swap = _swap(value.split(","), spec)
            else:
                raise CredentialError(f"{spec}: unknown option {opt!r} (for=PATH[,PATH], "
                                      f"allow_cleartext, swap=query,body, replace, add-only)")
        try:
            match = parse_http_rule(f"{method} {target}")
        except HttpRuleError as e:
            raise CredentialError(str(e)) from None
        kind, param = _scheme(scheme, spec)
        return AuthRule(rule, match, _credential_name(name, spec), kind, param, cleartext,
                        executables, swap, add_only)
    if not isinstance(rule, dict):
        raise CredentialError(f"{rule!r}: an auth rule is a string or a mapping")
    spec = repr(rule)
    own = {"scheme", "credential", "for", "allow_cleartext", "swap", "add_only"}
    missing = [k for k in ("scheme", "credential") if k not in rule]
    if missing:
        raise CredentialError(f"{spec}: missing {' and '.join(missing)}")
    cleartext = rule.get("allow_cleartext", False)
    add_only = rule.get("add_only", False)
    if not isinstance(cleartext, bool) or not isinstance(add_only, bool):
        raise CredentialError(f"{spec}: allow_cleartext and add_only: expected true or false")
    try:
        match = parse_http_rule({k: v for k, v in rule.items() if k not in own})
    except HttpRuleError as e:
        raise CredentialError(str(e)) from None
    kind, param = _scheme(rule["scheme"], spec)
    return AuthRule(spec, match, _credential_name(rule["credential"], spec), kind, param,
                    cleartext, _executables(rule.get("for"), spec), _swap(rule.get("swap"), spec),
                    add_only)


MAX_ENVIRON = 4 << 20   # an environment larger than this is not read: not trusted
_SPECIAL_MAPPINGS = ("[vdso]", "[vsyscall]")


@dataclass(frozen=True)
class Identity:
    """A process holding a connection, as the supervisor saw it."""
    exe: tuple[int, int] | None   # (st_dev, st_ino) of /proc/PID/exe
    path: str                     # for refusal texts
    problems: tuple[str, ...] = ()  # why its code may not be the program's own

    @property
    def loader_vars(self) -> tuple[str, ...]:  # (the first kind of problem)
        return tuple(p.split("=")[0] for p in self.problems if p.startswith("LD_"))


def identify(pid: int, writable=()) -> Identity:
    """`pid`'s executable, and whether all the code it runs is the program's: no loader
    variable in its environment (read whole), and every executable mapping a file on
    disk beneath none of `writable` (the paths the sandbox may write). Code the sandbox
    could have written — a preloaded library, an OpenSSL provider, a memfd, anonymous
    executable memory — makes it someone else's program. Unreadable: no binding
    matches."""
    try:
        st = os.stat(f"/proc/{pid}/exe")
        path = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read(MAX_ENVIRON + 1)
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return Identity(None, "?", ("unreadable",))
    problems = []
    if len(env) > MAX_ENVIRON:
        problems.append(f"an environment over {MAX_ENVIRON >> 20} MiB")
    for entry in env.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if eq and value and name in LOADER_VARS:
            problems.append(f"{name.decode()}=")
    for line in maps.decode("utf-8", "replace").splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5 or "x" not in fields[1]:
            continue
        where = fields[5] if len(fields) == 6 else ""
        if where in _SPECIAL_MAPPINGS:
            continue
        if not where.startswith("/") or where.endswith(" (deleted)"):
            problems.append(f"executable memory {where or '(anonymous)'}")
        elif any(where == w or where.startswith(w.rstrip("/") + "/") for w in writable):
            problems.append(f"code from {where}, which the sandbox may write")
    return Identity((st.st_dev, st.st_ino), path, tuple(dict.fromkeys(problems)))


class Refused(Exception):
    """A request refused because of a credential; the text names no secret."""

    def __init__(self, reason: str, credential: str):
        super().__init__(reason)
        self.reason, self.credential = reason, credential


@dataclass
class Applied:
    headers: list                 # what is forwarded
    query: str | None
    injected: tuple = ()          # credential names added (audit)
    withheld: tuple = ()          # credential names a binding kept from this program
    body_swap: dict = field(default_factory=dict)   # placeholder -> secret (bytes)
    body_scan: dict = field(default_factory=dict)   # placeholder -> credential: refuse
    redact: tuple = ()            # secrets to mask in the response


def _mask(secret: bytes) -> bytes:
    return b"*" * len(secret)


class Credentials:
    """The secrets of one sandbox, its placeholders and its auth rules."""

    def __init__(self, rules, secrets: dict, placeholders: dict | None = None):
        self.rules = tuple(rules)
        self._secrets = {k: (v.encode() if isinstance(v, str) else bytes(v))
                         for k, v in secrets.items()}
        self.placeholders = {k: v.encode() for k, v in (placeholders or {}).items()}
        for r in self.rules:
            if r.credential not in self._secrets:
                raise CredentialError(f"{r.spec}: no credential named {r.credential}")
        self._bound: dict[str, frozenset] = {}
        for r in self.rules:
            ids = set()
            for p in r.executables:
                try:
                    st = os.stat(p)
                except OSError as e:
                    raise CredentialError(f"{r.spec}: for: {p}: {e.strerror}") from None
                ids.add((st.st_dev, st.st_ino))
            self._bound[r.spec] = frozenset(ids)

    @property
    def bound(self) -> bool:
        """Some rule binds its credential to programs (connections need an Identity)."""
        return any(r.executables for r in self.rules)

    def names_host(self, names) -> bool:
        from .http_rules import _host_matches
        return any(_host_matches(r.match, n) for r in self.rules for n in names)

    def named_hosts(self) -> tuple[str, ...]:
        from .http_rules import HttpPolicy
        return HttpPolicy(tuple(r.match for r in self.rules)).named_hosts()

    def _allowed_program(self, rule: AuthRule, holders) -> bool:
        """Every process holding the connection (there is at least one) runs a program the
        rule names, with none of its code from elsewhere."""
        if not rule.executables:
            return True
        return bool(holders) and all(not h.problems and h.exe in self._bound[rule.spec]
                                     for h in holders)

    def apply(self, method: str, host: str, path: str, port: int, query: str | None,
              qs: dict, hdrs: dict, headers: list, tls: bool,
              holders=None) -> Applied:
        """Add the credentials this request may carry; raises Refused. `holders()`: the
        Identity of every process holding the connection now (asked only when a rule is
        bound to programs)."""
        where = f"{method} {host}{path}"
        usable: dict[str, AuthRule] = {}
        withheld = []
        seen = None
        for r in self.rules:
            if r.credential in usable or not r.match.matches(method, host, path, qs, hdrs,
                                                             port):
                continue
            if r.executables and seen is None:
                seen = list(holders()) if holders is not None else []
            if not self._allowed_program(r, seen):
                withheld.append(r.credential)
                continue
            if not tls and not r.allow_cleartext:
                raise Refused(f"{where} would carry credential {r.credential} over "
                              f"cleartext HTTP ({r.spec} has no allow_cleartext)",
                              r.credential)
            usable[r.credential] = r

        def refuse(cred: str, what: str):
            if cred in withheld:
                odd = [h for h in seen or () if h.problems] or list(seen or ())
                first = odd[0] if odd else None
                why = (f"from {first.path if first else '?'}, a program its rule does not "
                       f"name" + (f" ({first.problems[0]})" if first and first.problems
                                  else ""))
            else:
                why = "which no rule for it names"
            raise Refused(f"the placeholder of credential {cred} was sent in the {what} of "
                          f"{where}, {why}", cred)

        secrets = self._secrets
        injected: dict[str, None] = {}  # ordered set of the credentials added
        wire: set[bytes] = set()        # swapped header values, masked in echoes
        for cred, ph in self.placeholders.items():  # never in a path or a header name
            text = ph.decode()
            if text in _plain(path) or text in _plain(method):
                refuse(cred, "request line")
            if any(text in _plain(n.decode("latin-1")) for n, _ in headers):
                refuse(cred, "header names")
        out = []
        for name, value in headers:
            for cred, ph in self.placeholders.items():
                swapped, found = _swap_header(name, value, ph, secrets[cred])
                if found:
                    if cred not in usable:
                        refuse(cred, f"header {name.decode('latin-1')}")
                    injected[cred] = None
                    # What went out holds the secret in a spelling of the client's making
                    # (inside a Basic value, say): mask that spelling in echoes too.
                    wire.add(swapped)
                    wire.update(set(swapped.split()) - set(value.split()))  # what changed
                    value = swapped
                elif ph.decode() in _plain(value.decode("latin-1")) and cred not in usable:
                    refuse(cred, f"header {name.decode('latin-1')} (encoded)")
            out.append((name, value))
        if query:
            decoded = _plain(query)
            for cred, ph in self.placeholders.items():
                text = ph.decode()
                if text in decoded:
                    if cred not in usable:
                        refuse(cred, "query string")
                    if "query" in usable[cred].swap:
                        query = "&".join(_swap_pair(p, text, secrets[cred])
                                         for p in query.split("&"))
                        injected[cred] = None
        taken = set()
        for cred, r in usable.items():
            secret = secrets[cred]
            if r.scheme == "query":
                pairs = query.split("&") if query else []
                if r.add_only and any(_param_name(p) == r.param for p in pairs):
                    continue
                kept = [p for p in pairs if p and _param_name(p) != r.param]
                kept.append(f"{r.param}={quote(secret, safe='')}")
                query = "&".join(kept)
            else:
                header = r.header
                if header in taken:
                    continue  # two rules for one header: the first one listed wins
                taken.add(header)
                if r.add_only and any(n == header for n, _ in out):
                    continue
                if r.scheme == "bearer":
                    value = b"Bearer " + secret
                elif r.scheme == "basic":
                    user = r.param.encode() + b":" if r.param else b""
                    value = b"Basic " + base64.b64encode(user + secret)
                else:
                    value = secret
                out = [(n, v) for n, v in out if n != header] + [(header, value)]
            injected[cred] = None
        swap = {self.placeholders[c]: secrets[c] for c, r in usable.items()
                if "body" in r.swap and c in self.placeholders}
        scan = {ph: c for c, ph in self.placeholders.items() if c not in usable}
        sent = list(dict.fromkeys([*injected, *(c for c, r in usable.items()
                                                 if "body" in r.swap)]))
        redact = tuple(sorted({f for c in sent for f in self.forms(c)} | wire,
                              key=len, reverse=True))
        if sent:
            # The response must come back as sent, or an echo of the secret could pass
            # compressed: ask for no content coding (the filter refuses one), and for no
            # compressed WebSocket frames after an allowed switch.
            out = [(n, v) for n, v in out
                   if n not in (b"accept-encoding", b"sec-websocket-extensions")]
            out.append((b"accept-encoding", b"identity"))
        return Applied(out, query, tuple(injected), tuple(dict.fromkeys(withheld)), swap,
                       scan, redact)

    def forms(self, cred: str) -> tuple[bytes, ...]:
        """Every spelling of a secret the filter may put on the wire, to mask in echoes:
        the secret, percent-encoded, base64 alone and as a Basic value for each rule's
        user (and for any user: the part after the first three bytes of `user:`)."""
        secret = self._secrets[cred]
        out = {secret, quote(secret, safe="").encode(), quote(secret, safe="/").encode(),
               base64.b64encode(secret)}
        for r in self.rules:
            if r.credential == cred and r.scheme == "basic" and r.param:
                out.add(base64.b64encode(r.param.encode() + b":" + secret))
        return tuple(sorted(out, key=len, reverse=True))

    def all_forms(self) -> tuple[bytes, ...]:
        """The spellings of every secret: masked in every response this sandbox gets."""
        return tuple(sorted({f for c in self._secrets for f in self.forms(c)},
                            key=len, reverse=True))


def _plain(text: str) -> str:
    """Lower case, percent-decoded until it no longer changes (at most 4 rounds): the
    spellings a placeholder could be smuggled in."""
    for _ in range(4):
        decoded = unquote_plus(text)
        if decoded == text:
            break
        text = decoded
    return text.lower()


def _param_name(pair: str) -> str:
    """A query parameter's name as the server reads it (percent-decoded), `?key` too."""
    return unquote_plus(pair.split("=", 1)[0])


def _swap_pair(pair: str, placeholder: str, secret: bytes) -> str:
    """One `name=value` with the placeholder in its (decoded) value swapped."""
    name, eq, value = pair.partition("=")
    plain = unquote_plus(value)
    if placeholder not in plain:
        return pair
    return name + eq + quote(plain.replace(placeholder, secret.decode("latin-1")), safe="")


def _swap_header(name: bytes, value: bytes, ph: bytes, secret: bytes) -> tuple[bytes, bool]:
    """`value` with the placeholder replaced, also inside a Basic authorization (base64)."""
    found = ph in value
    if found:
        value = value.replace(ph, secret)
    if name == b"authorization" and value[:6].lower() == b"basic ":
        try:
            decoded = base64.b64decode(value[6:].strip(), validate=True)
        except ValueError:
            return value, found
        if ph in decoded:
            return value[:6] + base64.b64encode(decoded.replace(ph, secret)), True
    return value, found


class Redactor:
    """Masks secrets in a stream (a response body), same length, across chunk borders."""

    def __init__(self, secrets):
        self.secrets = tuple(s for s in secrets if s)
        self.keep = max((len(s) for s in self.secrets), default=1) - 1
        self.tail = b""

    def feed(self, data: bytes) -> bytes:
        buf = self.tail + data
        for s in self.secrets:
            buf = buf.replace(s, _mask(s))
        cut = max(0, len(buf) - self.keep)
        self.tail = buf[cut:]
        return buf[:cut]

    def flush(self) -> bytes:
        out, self.tail = self.tail, b""
        return out

    def value(self, data: bytes) -> bytes:
        for s in self.secrets:
            data = data.replace(s, _mask(s))
        return data


class Scanner:
    """Finds placeholders in a stream (a request body) across chunk borders. `feed`
    returns what may be forwarded, holding back a possible placeholder's beginning."""

    def __init__(self, placeholders: dict):
        self.placeholders = placeholders  # placeholder -> credential
        self.keep = max((len(p) for p in placeholders), default=1) - 1
        self.tail = b""

    def feed(self, data: bytes) -> tuple[bytes, str | None]:
        buf = self.tail + data
        for ph, cred in self.placeholders.items():
            if ph in buf:
                return b"", cred
        cut = max(0, len(buf) - self.keep)
        self.tail = buf[cut:]
        return buf[:cut], None

    def flush(self) -> bytes:
        out, self.tail = self.tail, b""
        return out
