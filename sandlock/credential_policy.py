"""Credentials in a policy: where each secret comes from, which requests carry it
(netpolicy.credentials), and what the sandbox sees instead.

    credentials={"GITHUB": "env:GH_TOKEN"}          # or file:PATH, fd:N, cmd:COMMAND
    credential_env={"GITHUB": "GH_TOKEN"}           # the sandbox sees a placeholder there
    http_auth=["GET api.github.com/* bearer GITHUB for=/usr/bin/gh"]

Checked when the policy is built (nothing is read yet): every rule names a declared
credential; a rule that is not `allow_cleartext` needs HTTPS interception; a program a
rule binds a credential to exists and is not something the sandbox could overwrite; a
`file:` source is denied to the sandbox.

Read when the sandbox starts (`read_secrets`, in the supervising process): `env:` from our
environment, `file:` from the file, `cmd:` by running the command once, outside the
sandbox, with a bound. A secret never enters the sandbox: the variable it came from is
removed from the program's environment, and so is any other variable holding it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from .errors import PolicyError, SandlockError

CMD_TIMEOUT = 30.0
MAX_SECRET = 64 << 10


@dataclass(frozen=True)
class CredentialSpec:
    sources: tuple[tuple[str, str], ...]      # (name, "env:VAR" | "file:PATH" | "cmd:...")
    rules: tuple                              # netpolicy.credentials.AuthRule
    env: tuple[tuple[str, str], ...]          # (credential, VAR seeing its placeholder)

    def source(self, name: str) -> str:
        return dict(self.sources)[name]


def _source(name: str, value) -> str:
    if not isinstance(value, str):
        raise PolicyError(f"credentials: {name}: expected env:VAR, file:PATH, fd:N or "
                          f"cmd:COMMAND, got {value!r}")
    kind, colon, rest = value.partition(":")
    if not colon or kind not in ("env", "file", "cmd", "fd") or not rest.strip():
        raise PolicyError(f"credentials: {name}: expected env:VAR, file:PATH, fd:N or "
                          f"cmd:COMMAND, got {value!r}")
    if kind == "fd" and (not rest.isdigit() or int(rest) in (1, 2)):
        raise PolicyError(f"credentials: {name}: fd:{rest}: expected an open descriptor "
                          f"other than 1 and 2 (fd:0 for a pipe on stdin)")
    if kind == "file":
        # Denied inside by the file it reaches (a symlink's target), and only when that
        # is its one name: another hard link elsewhere could be read through.
        path = os.path.realpath(os.path.expanduser(rest))
        if not os.path.isfile(path):
            raise PolicyError(f"credentials: {name}: {path} is not a file")
        if os.stat(path).st_nlink > 1:
            raise PolicyError(f"credentials: {name}: {path} has other hard links, through "
                              f"which the sandbox could read it; keep the secret in a file "
                              f"of its own")
        return f"file:{path}"
    if kind == "cmd":
        try:
            if not shlex.split(rest):
                raise ValueError("empty")
        except ValueError as e:
            raise PolicyError(f"credentials: {name}: cmd: {e}") from None
    return value


def parse_credentials(fields: dict, intercept, writable, beneath) -> CredentialSpec | None:
    """The fields' credentials, or None. `writable`: paths the sandbox may write (a bound
    program must not lie beneath one); `beneath(a, b)`: is a at or beneath b."""
    from .policy import CREDENTIAL_FIELDS
    creds, env, rules = (fields.get(k) for k in CREDENTIAL_FIELDS)
    if not (creds or env or rules):
        return None
    from netpolicy.credentials import CredentialError, _credential_name, parse_auth_rule
    if creds is not None and not isinstance(creds, dict):
        raise PolicyError(f"credentials: expected a mapping of NAME to a source, got {creds!r}")
    if env is not None and not isinstance(env, dict):
        raise PolicyError(f"credential_env: expected a mapping of NAME to VAR, got {env!r}")
    if isinstance(rules, (str, bytes, dict)):
        raise PolicyError(f"http_auth: expected a list of rules, got {rules!r}")
    sources = []
    for name, value in (creds or {}).items():
        try:
            _credential_name(name, "credentials")
        except CredentialError as e:
            raise PolicyError(str(e)) from None
        sources.append((name, _source(name, value)))
    declared = dict(sources)
    parsed = []
    for rule in rules or ():
        try:
            r = parse_auth_rule(rule)
        except CredentialError as e:
            raise PolicyError(f"http_auth: {e}") from None
        if r.credential not in declared:
            raise PolicyError(f"http_auth: {r.spec}: no credential named {r.credential} "
                              f"(declare it: --credential {r.credential}=env:VAR)")
        if not r.allow_cleartext and intercept is None:
            raise PolicyError(f"http_auth: {r.spec}: adding a credential to HTTPS requests "
                              f"needs HTTPS interception (http_inject_ca: true, or http_ca); "
                              f"or say allow_cleartext for plain http://")
        exes = []
        for p in r.executables:
            path = os.path.realpath(os.path.expanduser(p))
            if not os.path.isfile(path) or not os.access(path, os.X_OK):
                raise PolicyError(f"http_auth: {r.spec}: for: {p} is not an executable file")
            with open(path, "rb") as f:
                if f.read(2) == b"#!":
                    raise PolicyError(f"http_auth: {r.spec}: for: {p} is a script, which runs "
                                      f"as its interpreter: name the interpreter (and know "
                                      f"that every script it runs then gets the credential)")
            w = next((w for w in writable if beneath(path, w)), None)
            if w is not None:
                raise PolicyError(f"http_auth: {r.spec}: for: {path} lies beneath the "
                                  f"writable {w}: the sandbox could replace the program")
            exes.append(path)
        from dataclasses import replace
        parsed.append(replace(r, executables=tuple(exes)))
    placeholders = []
    for name, var in (env or {}).items():
        if name not in declared:
            raise PolicyError(f"credential_env: no credential named {name}")
        if not isinstance(var, str) or not var or "=" in var or "\0" in var:
            raise PolicyError(f"credential_env: {name}: {var!r} is not a variable name")
        placeholders.append((name, var))
    # A credential no rule uses is never sent, but still kept out of the sandbox
    # (upstream's reading: declaring env:VAR says VAR is a secret).
    return CredentialSpec(tuple(sources), tuple(parsed), tuple(placeholders))


def denied_files(spec: CredentialSpec | None) -> tuple[str, ...]:
    """`file:` sources: never readable inside."""
    if spec is None:
        return ()
    return tuple(v[5:] for _, v in spec.sources if v.startswith("file:"))


def read_secret(name: str, source: str) -> bytes:
    kind, _, rest = source.partition(":")
    if kind == "env":
        value = os.environb.get(os.fsencode(rest))
        if not value:
            raise SandlockError(f"credential {name}: the environment variable {rest} is "
                                f"not set")
    elif kind == "file":
        try:
            with open(rest, "rb") as f:
                value = f.read(MAX_SECRET + 1)
        except OSError as e:
            raise SandlockError(f"credential {name}: {rest}: {e.strerror}") from None
    elif kind == "fd":
        value = _read_fd(name, int(rest))
    else:
        import subprocess
        try:
            done = subprocess.run(shlex.split(rest), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=CMD_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SandlockError(f"credential {name}: cmd: {e}") from None
        if done.returncode != 0:  # its stderr is not shown: it may hold the secret
            raise SandlockError(f"credential {name}: cmd: exited with status "
                                f"{done.returncode}")
        value = done.stdout
    value = value.rstrip(b"\r\n")
    if not value or len(value) > MAX_SECRET:
        raise SandlockError(f"credential {name}: {kind}: the secret is empty or over "
                            f"{MAX_SECRET >> 10} KiB")
    if any(c in value for c in b"\r\n\0"):
        raise SandlockError(f"credential {name}: {kind}: the secret holds a line break or "
                            f"NUL (it would split a header)")
    return value


def _read_fd(name: str, fd: int) -> bytes:
    """An inherited descriptor (a pipe, `<(...)`), read through a duplicate. Stdin only
    when it cannot be rewound: it is the program's stdin too, and a seekable one (a file
    redirect) would let the program seek back and read the secret."""
    try:
        dup = os.dup(fd)
    except OSError as e:
        raise SandlockError(f"credential {name}: fd:{fd}: {e.strerror}") from None
    with os.fdopen(dup, "rb", buffering=0):  # closes the duplicate
        if fd == 0:
            try:
                os.lseek(dup, 0, os.SEEK_CUR)
                seekable = True
            except OSError:
                seekable = False
            if seekable:
                raise SandlockError(f"credential {name}: fd:0 (stdin) is seekable, so the "
                                    f"program could rewind it and read the secret; pipe it "
                                    f"instead")
        import select
        import time
        deadline, data = time.monotonic() + CMD_TIMEOUT, b""
        while len(data) <= MAX_SECRET:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([dup], [], [], left)[0]:
                raise SandlockError(f"credential {name}: fd:{fd}: no end of input within "
                                    f"{CMD_TIMEOUT:g} s (close the writing end)")
            try:
                chunk = os.read(dup, 65536)
            except OSError as e:
                raise SandlockError(f"credential {name}: fd:{fd}: {e.strerror}") from None
            if not chunk:
                break
            data += chunk
        return data


class Secrets:
    """What the supervisor holds for one sandbox: the secrets, their placeholders, and
    the netpolicy Credentials that applies them."""

    def __init__(self, spec: CredentialSpec):
        import secrets as _random
        from netpolicy.credentials import CredentialError, Credentials
        self.spec = spec
        values = {name: read_secret(name, source) for name, source in spec.sources}
        self.placeholders = {
            name: f"sandlock-placeholder-{name.lower()}-{_random.token_hex(16)}"
            for name, _ in spec.env}
        try:
            self.credentials = Credentials(spec.rules, values, self.placeholders)
        except CredentialError as e:
            raise SandlockError(f"http_auth: {e}") from None
        self._values = tuple(values.values())

    def environment(self, env) -> dict:
        """Changes to the program's environment: placeholders set, and every variable
        that holds a secret (the sources' own, or any other) removed (value None)."""
        out: dict = {}
        for name, source in self.spec.sources:
            if source.startswith("env:"):
                out[os.fsencode(source[4:])] = None
        for key, value in env.items():
            if any(v in value for v in self._values if len(v) >= 4):
                out[key] = None
        for name, var in self.spec.env:
            out[os.fsencode(var)] = self.placeholders[name].encode()
        return out
