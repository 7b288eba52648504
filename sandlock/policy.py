"""Validating a `Sandbox`'s fields into a normalised, immutable `Policy`.

This is the boundary where user input enters: every error names the field and the value.
Nothing here touches kernel state; it only reads the filesystem to resolve paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from netpolicy.decision import EndpointPolicy
from netpolicy.endpoint import EndpointError, parse_server

from .errors import PolicyError
from ._kernel.caps import CAP_NAMES

# What `sandlock run` grants when no -r is given: enough to run system programs.
SYSTEM_READABLE = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt", "/proc")
SYSTEM_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# Secrets a sandbox started as root could otherwise read (uid 0 owns them; no capability is
# needed). Files, not directories, so that /etc itself stays listable (see fs_rules).
SYSTEM_DENIED_GLOBS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-",
                       "/etc/sudoers", "/etc/sudoers.d/*", "/etc/ssh/ssh_host_*key",
                       "/etc/ssl/private/*", "/etc/security/opasswd")


def system_readable() -> list[str]:
    return [p for p in SYSTEM_READABLE if os.path.exists(p)]


def system_devices() -> list[str]:
    """Character devices every program may read and write (/dev/null and friends)."""
    return [p for p in SYSTEM_DEVICES if os.path.exists(p)]


def root_only_files() -> tuple[str, ...]:
    """Files under /etc and /usr/local/etc that belong to root and that others may not
    read (root_only.py: rescanned whenever the kernel reports a change there)."""
    from . import root_only
    return root_only.files()


def system_denied() -> list[str]:
    """Secrets of the system a sandbox must not read even where a grant covers them: the
    fixed list, and when started as root, every file there that only root may read."""
    import glob
    out = {p for pattern in SYSTEM_DENIED_GLOBS for p in glob.glob(pattern)}
    if os.geteuid() == 0:
        out.update(root_only_files())
    # a path beneath another denied one adds nothing
    return sorted(p for p in out if not any(p != q and p.startswith(q + "/") for q in out))


@dataclass(frozen=True)
class PortSet:
    """TCP ports for Landlock. `any_port` means the right is not restricted at all."""
    ports: frozenset[int] = frozenset()
    any_port: bool = False


@dataclass(frozen=True)
class Policy:
    endpoints: EndpointPolicy
    unix_allow: tuple[str, ...]      # socket paths (beneath) a connect may reach; "*" = any
    tcp_by_landlock: bool            # every TCP rule is port-only: Landlock alone decides
    net_supervised: bool             # connect/send go through the supervisor
    udp: bool                        # UDP sockets may be created (UDP rules or DNS)
    icmp: bool                       # ICMP ping sockets may be created
    dns_servers: tuple[str, ...]
    audit_log: str | None
    audit_allowed: bool
    fs_readable: tuple[str, ...]
    fs_writable: tuple[str, ...]
    fs_denied: tuple[str, ...]
    tcp_connect: PortSet
    tcp_bind: PortSet
    deny_syscalls: frozenset[str]
    keep_caps: int
    env: tuple[tuple[str, str], ...]
    clean_env: bool
    cwd: str | None
    max_open_files: int | None
    no_coredump: bool
    allow_degraded: object           # bool, or a frozenset of features.Protection
    name: str | None
    http: object = None              # netpolicy HttpPolicy, or None without HTTP rules
    http_ports: frozenset = frozenset()  # TCP ports whose connections the HTTP filter sees
    http_raw: object = None          # EndpointPolicy of endpoints relayed unfiltered
    http_upgrades: frozenset = frozenset()  # protocol switches allowed (not inspected after)
    intercept: object = None         # InterceptSpec when HTTPS is intercepted
    credentials: object = None       # credential_policy.CredentialSpec, or None
    policy_fn: object = None         # the runtime callback (sandlock.supervisor.runtime)
    policy_fn_timeout: float = 2.0
    runtime_events: frozenset = frozenset()  # event kinds it sees; empty without policy_fn
    workspace: object = None         # workspace_policy.Workspace (a copy-on-write workdir)
    private_tmp: bool = False        # a TMPDIR of its own per run (sandlock.private_tmp)
    private_shm: bool = False        # ... and a /dev/shm of its own (private_tmp.shm_refusal)
    write_excluded: tuple = ()       # paths writable grants must not cover (fs_rules)
    protection: object = None        # home_policy.HomePlan (protect_user_files), or None
    protect_mode: str = ""           # "mounts" or "landlock" (sandlock.protect); "" for an
    #                                  empty protection plan (nothing to enforce)
    limits: object = None            # sandlock.limits.Limits
    waived: frozenset = frozenset()  # features.Protection given up explicitly (disable=)
    explain: bool = False            # record refused file accesses (supervisor.explain)
    report_only: bool = False        # network/DNS/HTTP/policy_fn refusals recorded, allowed


# Fields that exist in the API but whose mechanism is not in this version. Setting one is an
# error rather than a silent no-op: a policy must never look stricter than it is.
_NOT_YET = {
    "net_deny_bind": "bind deny rules",
    "port_remap": "port remapping",
    "num_cpus": "a virtual CPU count",
    "random_seed": "determinism controls", "time_start": "determinism controls",
    "no_randomize_memory": "determinism controls", "no_huge_pages": "determinism controls",
    "deterministic_dirs": "determinism controls",
    "uid": "uid/gid mapping", "gid": "uid/gid mapping",
    "gpu_devices": "GPU access", "chroot": "a chroot view", "image": "OCI images",
    "fs_mount": "mounts into the sandbox's view", "fs_mount_ro": "mounts into the sandbox's view",
}


def reject_unimplemented(fields: dict) -> None:
    for key, mechanism in _NOT_YET.items():
        value = fields.get(key)
        if value not in (None, (), [], {}, False):
            raise PolicyError(f"{key}={value!r}: needs {mechanism}, which this version of "
                              f"sandlock does not implement; remove the field")


def _paths(field: str, values, must_exist: bool) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, (str, bytes, os.PathLike)):
        raise PolicyError(f"{field}: expected a list of paths, got the single value {values!r}")
    out = []
    for v in values:
        try:
            p = os.fsdecode(v)
        except TypeError:
            raise PolicyError(f"{field}: {v!r} is not a path") from None
        if not p or "\0" in p:
            raise PolicyError(f"{field}: {v!r} is not a valid path")
        real = os.path.realpath(p)
        if must_exist and not os.path.exists(real):
            raise PolicyError(f"{field}: {p} does not exist")
        out.append(real)
    return tuple(dict.fromkeys(out))


def _flag(value, field: str) -> bool:
    if value not in (None, True, False):
        raise PolicyError(f"{field}: expected true or false, got {value!r}")
    return bool(value)


def _name(value):
    """A sandbox's name: shown in `sandlock ps`, logs and errors (upstream's limits)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise PolicyError(f"name: expected a string, got {value!r}")
    if not value:
        raise PolicyError("name: must not be empty")
    if "\0" in value:
        raise PolicyError("name: must not contain NUL")
    if len(value.encode()) > 64:
        raise PolicyError("name: at most 64 bytes")
    return value


def _allow_degraded(value):
    """True/False, or the protections that may be missing on this kernel (upstream's
    list form: each still applies where the kernel has it)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise PolicyError(f"allow_degraded: expected true, false or a list of protections, "
                          f"got {value!r}")
    return parse_waived(value, "allow_degraded") if value else False


def parse_waived(values, field: str = "disable") -> frozenset:
    """disable=[Protection.X, ...] (or their names, or their numbers)."""
    from .features import Protection
    if values is None:
        return frozenset()
    if isinstance(values, (str, int)):
        values = [values]
    out = set()
    for v in values:
        try:
            if isinstance(v, str):
                out.add(Protection[v.upper()])
            else:
                out.add(Protection(v))
        except (KeyError, ValueError):
            raise PolicyError(f"{field}: {v!r} is not a protection (one of "
                              f"{', '.join(p.name for p in Protection)})") from None
    return frozenset(out)


def parse_ports(specs) -> list[int]:
    """Port specs (ints, or strings of ports and lo-hi ranges joined by commas, as in
    --net-allow-bind) as a sorted list of distinct ports; upstream Sandlock's helper.
    Raises PolicyError (a ValueError) on a bad spec."""
    ports: set[int] = set()
    for spec in specs:
        if isinstance(spec, bool) or not isinstance(spec, (int, str)):
            raise PolicyError(f"parse_ports: {spec!r} is not a port spec")
        if isinstance(spec, int):
            if not 0 <= spec <= 65535:
                raise PolicyError(f"parse_ports: port {spec} is outside 0-65535")
            ports.add(spec)
            continue
        result = parse_port_list(spec.replace(" ", ""), "parse_ports", spec, allow_zero=True)
        if result.any_port:
            raise PolicyError(f"parse_ports: {spec!r}: '*' names no port")
        ports |= result.ports
    return sorted(ports)


def parse_port(text: str, field: str, spec: str, allow_zero: bool = False) -> int:
    if not text.isdigit():
        raise PolicyError(f"{field} {spec!r}: {text!r} is not a port number")
    port = int(text)
    if not (0 if allow_zero else 1) <= port <= 65535:
        raise PolicyError(f"{field} {spec!r}: port {port} is outside 1-65535")
    return port


def parse_port_list(text: str, field: str, spec: str, allow_zero: bool = False) -> PortSet:
    """`443`, `80,443`, `8000-8010`, `*`. Mixing `*` with ports is an error."""
    items = [t.strip() for t in text.split(",")]
    if "*" in items:
        if len(items) > 1:
            raise PolicyError(f"{field} {spec!r}: '*' cannot be combined with other ports")
        return PortSet(any_port=True)
    ports: set[int] = set()
    for item in items:
        lo, sep, hi = item.partition("-")
        if sep:
            a = parse_port(lo, field, spec, allow_zero)
            b = parse_port(hi, field, spec, allow_zero)
            if a > b:
                raise PolicyError(f"{field} {spec!r}: range {item} is empty")
            ports.update(range(a, b + 1))
        else:
            ports.add(parse_port(item, field, spec, allow_zero))
    return PortSet(frozenset(ports))


def parse_endpoints(allow, deny, allow_private) -> EndpointPolicy:
    for field, specs in (("net_allow", allow), ("net_deny", deny)):
        if isinstance(specs, str):
            raise PolicyError(f"{field}: expected a list of endpoint specs, got {specs!r}")
    try:
        return EndpointPolicy.from_specs(allow or (), deny or (), bool(allow_private))
    except EndpointError as e:
        raise PolicyError(f"net_allow/net_deny {e}") from None
    except ValueError as e:
        raise PolicyError(str(e)) from None


def tcp_ports(endpoints: EndpointPolicy) -> PortSet:
    """The TCP ports any allow rule can reach: Landlock's connect rules. When every TCP rule
    is port-only this is the whole TCP policy; otherwise it is a kernel-enforced outer bound
    under the supervisor's per-address decisions."""
    ports: set[int] = set()
    for rule in endpoints.allow:
        if "tcp" in rule.protocols:
            if rule.ports is None:
                return PortSet(any_port=True)
            ports.update(rule.ports)
    return PortSet(frozenset(ports))


def parse_bind_ports(specs) -> PortSet:
    if specs is None:
        return PortSet()
    if isinstance(specs, (int, str)):
        specs = [specs]
    ports: set[int] = set()
    for spec in specs:
        parsed = parse_port_list(str(spec), "net_allow_bind", str(spec), allow_zero=True)
        if parsed.any_port:
            return parsed
        ports.update(parsed.ports)
    return PortSet(frozenset(ports))


def _unix_grants(values) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    out = []
    for v in values:
        p = os.fsdecode(v)
        if p == "*" or (p.startswith("@") and len(p) > 1):  # any, or an abstract name
            out.append(p)
            continue
        if not os.path.isabs(p):
            raise PolicyError(f"net_allow_unix: {p!r} must be an absolute path, an abstract "
                              f"name '@name', or '*'")
        out.append(os.path.realpath(p))
    return tuple(out)


def parse_caps(names) -> int:
    mask = 0
    for name in names or ():
        key = str(name).upper()
        if not key.startswith("CAP_"):
            key = "CAP_" + key
        if key not in CAP_NAMES:
            raise PolicyError(f"keep_capabilities: unknown capability {name!r}")
        mask |= 1 << CAP_NAMES.index(key)
    return mask


def parse_env(env) -> tuple[tuple[str, str], ...]:
    if env is None:
        return ()
    if not hasattr(env, "items"):
        raise PolicyError(f"env: expected a mapping of names to values, got {env!r}")
    out = []
    for k, v in env.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise PolicyError(f"env: {k!r} is not a valid variable name")
        if not isinstance(v, str) or "\0" in v:
            raise PolicyError(f"env {k}: value must be a string without NUL, got {v!r}")
        out.append((k, v))
    return tuple(out)


def parse_runtime(fields: dict, deny_syscalls: frozenset[str]):
    """(callback, timeout, event kinds) of policy_fn; (None, 2.0, ∅) without one."""
    fn = fields.get("policy_fn")
    timeout = fields.get("policy_fn_timeout", 2.0)
    events = fields.get("policy_fn_events")
    if fn is None:
        if events is not None:
            raise PolicyError("policy_fn_events: set without a policy_fn")
        return None, 2.0, frozenset()
    from .supervisor.runtime import EVENT_KINDS  # ~1-3 ms to import: only with a policy_fn
    if not callable(fn):
        raise PolicyError(f"policy_fn: expected a callable fn(event, ctx), got {fn!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not \
            0 < timeout <= 3600:
        raise PolicyError(f"policy_fn_timeout: expected seconds in (0, 3600], got {timeout!r}")
    if events is None:
        events = EVENT_KINDS
    if isinstance(events, str):
        raise PolicyError(f"policy_fn_events: expected a list, got {events!r}")
    for e in events:
        if e not in EVENT_KINDS:
            raise PolicyError(f"policy_fn_events: unknown event kind {e!r} (choose from "
                              f"{', '.join(EVENT_KINDS)})")
    return fn, float(timeout), frozenset(events)


@dataclass(frozen=True)
class InterceptSpec:
    """HTTPS interception: which CA, where its secrets are (denied to the sandbox), and
    what the sandbox is told (netpolicy.tls_intercept)."""
    ca: str | None            # the CA certificate (None: the default store's, on demand)
    key: str | None           # its private key, when not in the ca file
    upstream_ca: str | None   # bundle to verify upstream servers (None: system roots)
    certs_dir: str            # the default store (also holds our private temp files)
    inject: bool              # give the sandbox a bundle with our CA and the env vars
    ca_out: str | None        # write the CA certificate here
    public_dir: str           # where the injected bundle is written (readable)
    bundles: tuple = ()       # ((bundle path, its spliced copy), ...): shown in place


def parse_intercept(fields: dict, http) -> InterceptSpec | None:
    ca, key, inject, out, upstream = (fields.get("http_ca"), fields.get("http_key"),
                                      fields.get("http_inject_ca"), fields.get("http_ca_out"),
                                      fields.get("http_upstream_ca"))
    if not (ca or key or inject or out or upstream):
        return None
    if http is None:
        raise PolicyError("http_ca/http_inject_ca/http_ca_out: HTTPS interception needs "
                          "http_allow or http_deny rules")
    if key and not ca:
        raise PolicyError("http_key: given without http_ca")
    for name, value in (("http_ca", ca), ("http_key", key), ("http_upstream_ca", upstream)):
        if value is not None and not os.path.isfile(os.fsdecode(value)):
            raise PolicyError(f"{name}: {value} is not a file")
    from netpolicy.tls_intercept import default_certs_dir
    certs = str(default_certs_dir().resolve())
    real = (lambda v: os.path.realpath(os.fsdecode(v)) if v else None)
    public = os.path.join(os.path.dirname(certs), "ca-bundles")
    bundles = ()
    if isinstance(inject, (list, tuple)):
        bundles = _bundles(inject, public, (real(ca), real(key), certs))
        inject = False  # the bundles carry the CA where programs already look
    elif inject not in (None, True, False):
        raise PolicyError(f"http_inject_ca: expected true, false or a list of trust bundles, "
                          f"got {inject!r}")
    return InterceptSpec(real(ca), real(key), real(upstream), certs, bool(inject), real(out),
                         public, bundles)


def _bundles(paths, public: str, ca_key) -> tuple:
    """http_inject_ca=[bundle, ...]: each bundle is shown inside, in place, with the CA
    spliced in (a read-only bind of a copy in `public`, in the sandbox's own mount
    namespace). Where no namespace can be made that is refused, not approximated."""
    import hashlib
    out = []
    for p in paths:
        if not isinstance(p, (str, bytes, os.PathLike)):
            raise PolicyError(f"http_inject_ca: expected paths of trust bundles, got {p!r}")
        path = os.path.realpath(os.path.expanduser(os.fsdecode(p)))
        if not os.path.isfile(path):
            raise PolicyError(f"http_inject_ca: {os.fsdecode(p)} is not a file")
        tag = hashlib.sha256(repr((path, ca_key)).encode()).hexdigest()[:16]
        out.append((path, os.path.join(public, f"spliced-{tag}.pem")))
    if out:
        from . import protect
        if protect.mode() != "mounts":
            raise PolicyError("http_inject_ca: showing a bundle with the CA in place needs a "
                              "mount namespace, which this system refuses; use "
                              "http_inject_ca=True (programs are pointed at a bundle with the "
                              "CA through SSL_CERT_FILE, CURL_CA_BUNDLE, ...)")
        os.makedirs(public, mode=0o755, exist_ok=True)
        for _, spliced in out:
            # Exists from now on, and keeps its inode (NetState writes it in place): the
            # Landlock rule that lets the sandbox read it is on that inode (a bind mount's
            # root is judged by its own rules, not by the directory it covers).
            os.close(os.open(spliced, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    return tuple(out)


def parse_http(fields: dict):
    """(HttpPolicy or None, ports). Ports default to 80 and 443 (TLS is recognised by its
    first byte, and decided on its SNI)."""
    allow, deny, ports = (fields.get("http_allow"), fields.get("http_deny"),
                          fields.get("http_ports"))
    for name, value in (("http_allow", allow), ("http_deny", deny)):
        if isinstance(value, (str, bytes, dict)):
            raise PolicyError(f"{name}: expected a list of rules, got {value!r}")
    if not allow and not deny and not fields.get("http_auth"):
        if ports:
            raise PolicyError("http_ports: set without http_allow or http_deny rules")
        return None, frozenset()
    from netpolicy.http_rules import HttpPolicy, HttpRuleError
    # Credentials (http_auth) are added by the HTTP filter: it sees their connections even
    # without rules of its own (and then lets every request through to them).
    policy = HttpPolicy()
    for name, value in (("http_allow", allow), ("http_deny", deny)):
        try:
            rules = HttpPolicy.from_rules(value or (), ())
        except HttpRuleError as e:
            raise PolicyError(f"{name}: {e}") from None
        policy = HttpPolicy(policy.allow + (rules.allow if name == "http_allow" else ()),
                            policy.deny + (rules.allow if name == "http_deny" else ()))
    if ports is None:
        ports = (80, 443)
    if isinstance(ports, (str, bytes)) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in ports):
        raise PolicyError(f"http_ports: expected a list of ports 1-65535, got {ports!r}")
    return policy, frozenset(ports) | policy.ports()  # a port in a rule is an HTTP port


def parse_size(value, field: str) -> int | None:
    """512M, 2G, 1048576 -> bytes."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = str(value).strip().upper().removesuffix("B")
    try:
        if text and text[-1] in units:
            n = float(text[:-1]) * units[text[-1]]
        else:
            n = int(text)
    except ValueError:
        n = 0
    if isinstance(value, bool) or n <= 0:
        raise PolicyError(f"{field}: expected a size such as 512M, 2G or a number of bytes, "
                          f"got {value!r}")
    return int(n)


def parse_limits(fields: dict):
    from .limits import parse_limits as parse
    return parse(fields)


# The fields workspace_policy.parse_workspace and credential_policy.parse_credentials read
# (from here: each has nothing to parse without them, and is imported only with them).
WORKSPACE_FIELDS = ("workdir", "fs_storage", "max_disk", "workspace_backend")
CREDENTIAL_FIELDS = ("credentials", "credential_env", "http_auth")


def build_policy(fields: dict, deny_syscalls: frozenset[str]) -> Policy:
    """Validate the user's fields; `deny_syscalls` comes from sandlock.syscall_filter."""
    reject_unimplemented(fields)
    readable = _paths("fs_readable", fields.get("fs_readable"), must_exist=True)
    writable = _paths("fs_writable", fields.get("fs_writable"), must_exist=True)
    denied = _paths("fs_denied", fields.get("fs_denied"), must_exist=False)
    workspace, write_excluded = None, ()
    if any(fields.get(k) is not None for k in WORKSPACE_FIELDS):  # imported only then
        from .workspace_policy import parse_workspace
        workspace, readable, writable, denied, write_excluded = parse_workspace(
            fields, readable, writable, denied)
    from .fs_rules import is_beneath
    http, http_ports = parse_http(fields)
    if fields.get("http_auth") and not (fields.get("net_allow") or fields.get("http_allow")):
        raise PolicyError("http_auth: no destination is allowed (add net_allow or "
                          "http_allow for the hosts the credentials are for)")
    intercept = parse_intercept(fields, http)
    credentials = None
    if any(fields.get(k) for k in CREDENTIAL_FIELDS):  # imported only then
        from .credential_policy import denied_files, parse_credentials
        wd = (workspace.workdir,) if workspace is not None else ()
        credentials = parse_credentials(fields, intercept, writable + wd, is_beneath)
        denied += tuple(p for p in denied_files(credentials) if p not in denied)
    if intercept is not None:
        # The CA's private key (and the store's temporary leaf keys) are never readable
        # inside the sandbox; the injected bundle (public) is.
        denied += tuple(p for p in (intercept.certs_dir, intercept.key, intercept.ca)
                        if p and p not in denied)
        if intercept.inject:
            os.makedirs(intercept.public_dir, mode=0o755, exist_ok=True)
            readable += (intercept.public_dir,)
        readable += tuple(spliced for _, spliced in intercept.bundles)
    grants = readable + writable
    if os.geteuid() == 0:
        # Started as root, the sandbox is uid 0 without capabilities: it still owns
        # /etc/shadow & co. Those stay denied whenever a grant covers them.
        denied += tuple(d for d in system_denied() if d not in denied
                        and any(is_beneath(d, g) and d != g for g in grants))
    for d in denied:
        for g in grants:
            if is_beneath(g, d):
                raise PolicyError(f"fs_denied {d} contains the granted path {g}: "
                                  f"remove one of them")
    protection, protect_mode = None, ""
    protect = fields.get("protect_user_files")
    if protect not in (None, True, False):
        raise PolicyError(f"protect_user_files: expected true or false, got {protect!r}")
    if protect:
        from . import protect as _protect
        # A workdir is written through its layer: its tree is protected as a grant's is.
        wd = (workspace.workdir,) if workspace is not None else ()
        protection = _protect.user_plan(readable, writable + wd, denied)
        # Probed (a throwaway trampoline, ~1 ms) only for a plan with something to enforce
        protect_mode = _protect.mode() if not protection.empty else ""
        if protect_mode == "landlock":
            denied += tuple(h for h in protection.hidden if h not in denied)
    private_tmp = _private_tmp(fields.get("private_tmp"), workspace)
    private_shm = False
    if private_tmp:  # only then (private_tmp's imports: not on every policy's build)
        from .private_tmp import shm_refusal
        private_shm = shm_refusal(writable, _shm_users(readable, denied, workspace)) is None
    net_allow = list(fields.get("net_allow") or ())
    if http is not None and not net_allow and not isinstance(fields.get("net_allow"), str):
        # HTTP rules alone open their hosts on the HTTP ports (upstream's semantics); a
        # net_allow given narrows the destinations to itself instead.
        net_allow = list(http.endpoint_specs(tls=intercept is not None))
    endpoints = parse_endpoints(net_allow or fields.get("net_allow"), fields.get("net_deny"),
                                fields.get("net_allow_private"))
    http_raw = parse_endpoints(fields.get("http_raw"), (), False) if fields.get(
        "http_raw") else None
    if http_raw is not None and http is None:
        raise PolicyError("http_raw: set without http_allow or http_deny rules")
    unix_allow = _unix_grants(fields.get("net_allow_unix"))
    # With HTTP rules every TCP connect is seen: those to an HTTP port go to the filter.
    # Report-only: every connect is judged (and recorded) by the supervisor, none by
    # Landlock's port rules, which would refuse silently.
    report_only = _flag(fields.get("report_only"), "report_only")
    tcp_by_landlock = http is None and not endpoints.deny and not report_only and all(
        r.any_address for r in endpoints.allow if "tcp" in r.protocols)
    protocols = endpoints.protocols()
    dns_servers = tuple(fields.get("dns_servers") or ())
    for server in dns_servers:
        try:
            parse_server(server)
        except ValueError:
            raise PolicyError(f"dns_servers: {server!r} is not an address[:port]") from None
    audit_log = fields.get("audit_log")
    cwd = fields.get("cwd")
    if cwd is not None:
        cwd = os.fsdecode(cwd)
        if not os.path.isdir(cwd):
            raise PolicyError(f"cwd: {cwd} is not a directory")
        cwd = os.path.abspath(cwd)
    max_open_files = fields.get("max_open_files")
    if max_open_files is not None and (not isinstance(max_open_files, int)
                                       or max_open_files < 1):
        raise PolicyError(f"max_open_files: expected a positive integer, got {max_open_files!r}")
    udp = "udp" in protocols or bool(endpoints.hostnames) or report_only
    policy_fn, policy_fn_timeout, runtime_events = parse_runtime(fields, deny_syscalls)
    upgrades = fields.get("http_upgrades") or ()
    kinds = ("websocket", "h2c", "h2", "connect")
    if isinstance(upgrades, (str, bytes)) or any(u not in kinds for u in upgrades):
        raise PolicyError(f"http_upgrades: expected a list of {', '.join(kinds)} (what "
                          f"follows each is not inspected), got {upgrades!r}")
    if upgrades and http is None:
        raise PolicyError("http_upgrades: set without http_allow or http_deny rules")
    return Policy(
        endpoints=endpoints, unix_allow=unix_allow, tcp_by_landlock=tcp_by_landlock,
        # With an audit log every connect is judged by the supervisor, so that a refusal
        # is recorded (Landlock's own TCP refusals leave no trace).
        net_supervised="network" in runtime_events or bool(audit_log) or not (
            tcp_by_landlock and "*" in unix_allow and not udp and "icmp" not in protocols),
        udp=udp, icmp="icmp" in protocols or report_only, dns_servers=dns_servers,
        audit_log=os.path.abspath(audit_log) if audit_log else None,
        audit_allowed=bool(fields.get("audit_allowed")),
        fs_readable=readable, fs_writable=writable, fs_denied=denied,
        tcp_connect=PortSet(any_port=True) if report_only else tcp_ports(endpoints),
        tcp_bind=parse_bind_ports(fields.get("net_allow_bind")),
        deny_syscalls=deny_syscalls,
        keep_caps=parse_caps(fields.get("keep_capabilities")),
        env=parse_env(fields.get("env")),
        clean_env=bool(fields.get("clean_env")),
        cwd=cwd,
        max_open_files=max_open_files,
        no_coredump=bool(fields.get("no_coredump")),
        allow_degraded=_allow_degraded(fields.get("allow_degraded")),
        name=_name(fields.get("name")),
        http=http, http_ports=http_ports, intercept=intercept, http_raw=http_raw,
        http_upgrades=frozenset(upgrades), credentials=credentials,
        policy_fn=policy_fn, policy_fn_timeout=policy_fn_timeout,
        runtime_events=runtime_events,
        workspace=workspace, write_excluded=write_excluded,
        private_tmp=private_tmp, private_shm=private_shm,
        protection=protection, protect_mode=protect_mode,
        limits=parse_limits(fields),
        waived=parse_waived(fields.get("disable")),
        explain=_flag(fields.get("explain"), "explain"),
        report_only=report_only,
    )


def _shm_users(readable, denied, workspace) -> tuple:
    """The paths, besides writable grants, that a private /dev/shm would hide if they lay
    in the host's (private_tmp.shm_refusal)."""
    ws = (workspace.workdir, workspace.storage) if workspace is not None else ()
    return (*readable, *denied, *ws)


def _private_tmp(value, workspace) -> bool:
    if value is None:
        return workspace is not None  # on by default with a workdir
    if not isinstance(value, bool):
        raise PolicyError(f"private_tmp: expected true or false, got {value!r}")
    return value
