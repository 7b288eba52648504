"""YAML policy files (schema version 1) -> Sandbox keyword arguments.

Every error names the file, the line and the key: unknown keys, wrong types and bad
endpoint specs are refused before anything runs. Relative paths are taken relative to the
current directory and `~` is expanded, as a shell would for the same paths on the CLI.

    version: 1
    name: github-readonly
    filesystem: {system: true, read: [...], write: [...], deny: [...], protect: true}
    network: {allow: [...], deny: [...], bind: [...], unix: [...], allow_private: false}
    dns: {servers: ["127.0.0.53"]}
    http: {allow: ["GET api.github.com/repos/*", {methods: [GET], host: x, path: /a/*}],
           deny: [...], ports: [80, 443]}
    audit: {file: audit.jsonl, allowed: false}
    process: {env: {K: V}, clean_env: false, cwd: ., timeout: 60}
    syscalls: {deny: [...], allow: [sysv_ipc]}
    limits: {memory: 512M, processes: 64, cpu: 50, cpu_cores: "0-3", open_files: 1024}
    workspace: {workdir: ., storage: ~/.cache/sandlock/cow, max_disk: 1G,
                on_exit: commit, on_error: abort, backend: auto}

`filesystem.protect` (default true): the user's secrets are hidden and persistence
vectors kept under every grant (sandlock.home_policy); paths named in a grant are exempt.
"""

from __future__ import annotations

import os

from .errors import PolicyError

STR, BOOL, NUM, STRLIST, PORTLIST, STRMAP = "string", "boolean", "number", "list of strings", \
    "list of ports", "mapping of strings"
RULELIST = "list of HTTP rules (strings or mappings)"
SIZE = "size (e.g. 512M, or a number of bytes)"
AUTHLIST = "list of auth rules (strings or mappings)"
CREDENTIALS = "mapping of credential names to sources (env:VAR, file:PATH, cmd:COMMAND)"

# section -> key -> (type, Sandbox field or None for keys handled specially)
SCHEMA = {
    "version": NUM,
    "name": STR,
    "mode": STR,   # "enforce" (default) or "report": report_only
    "filesystem": {"system": (BOOL, None), "read": (STRLIST, "fs_readable"),
                   "write": (STRLIST, "fs_writable"), "deny": (STRLIST, "fs_denied"),
                   "protect": (BOOL, "protect_user_files")},
    "network": {"allow": (STRLIST, "net_allow"), "deny": (STRLIST, "net_deny"),
                "bind": (PORTLIST, "net_allow_bind"), "unix": (STRLIST, "net_allow_unix"),
                "allow_private": (BOOL, "net_allow_private")},
    "dns": {"servers": (STRLIST, "dns_servers")},
    "http": {"allow": (RULELIST, "http_allow"), "deny": (RULELIST, "http_deny"),
             "ports": (PORTLIST, "http_ports"), "upgrades": (STRLIST, "http_upgrades"),
             "raw": (STRLIST, "http_raw"),
             "ca": (STR, "http_ca"),
             "key": (STR, "http_key"), "inject_ca": (BOOL, "http_inject_ca"),
             "ca_out": (STR, "http_ca_out"), "upstream_ca": (STR, "http_upstream_ca"),
             "auth": (AUTHLIST, "http_auth")},
    "credentials": CREDENTIALS,
    "audit": {"file": (STR, "audit_log"), "allowed": (BOOL, "audit_allowed"),
              "explain": (BOOL, "explain")},
    "process": {"env": (STRMAP, "env"), "clean_env": (BOOL, "clean_env"),
                "cwd": (STR, "cwd"), "timeout": (NUM, None)},
    "workspace": {"workdir": (STR, "workdir"), "storage": (STR, "fs_storage"),
                  "max_disk": (SIZE, "max_disk"), "on_exit": (STR, "on_exit"),
                  "on_error": (STR, "on_error"), "backend": (STR, "workspace_backend")},
    "limits": {"memory": (SIZE, "max_memory"), "processes": (NUM, "max_processes"),
               "cpu": (NUM, "max_cpu"), "cpu_cores": (STR, "cpu_cores"),
               "open_files": (NUM, "max_open_files")},
    "syscalls": {"deny": (STRLIST, "extra_deny_syscalls"),
                 "allow": (STRLIST, "extra_allow_syscalls")},
}
PATH_FIELDS = {"fs_readable", "fs_writable", "fs_denied", "net_allow_unix", "cwd", "audit_log",
               "workdir", "fs_storage",
               "http_ca", "http_key", "http_ca_out", "http_upstream_ca"}


class LoadedPolicy:
    """Sandbox keyword arguments, plus what is not a Sandbox field (system, timeout)."""

    def __init__(self, path: str):
        self.path = path
        self.fields: dict = {}
        self.system = True
        self.timeout: float | None = None
        self.name: str | None = None


def _where(path, node, key=None) -> str:
    line = node.start_mark.line + 1
    return f"{path}:{line}" + (f": {key}" if key else "")


def _scalar(node, kind, path, key):
    import yaml
    if not isinstance(node, yaml.ScalarNode):
        raise PolicyError(f"{_where(path, node, key)}: expected a {kind}")
    value = yaml.safe_load(yaml.serialize(node))
    ok = {STR: isinstance(value, str), BOOL: isinstance(value, bool),
          SIZE: isinstance(value, (str, int)) and not isinstance(value, bool),
          NUM: isinstance(value, (int, float)) and not isinstance(value, bool)}[kind]
    if not ok:
        raise PolicyError(f"{_where(path, node, key)}: expected a {kind}, got {value!r}")
    return value


def _value(node, kind, path, key):
    import yaml
    if kind in (STR, BOOL, NUM, SIZE):
        return _scalar(node, kind, path, key)
    if kind in (STRLIST, PORTLIST):
        if not isinstance(node, yaml.SequenceNode):
            raise PolicyError(f"{_where(path, node, key)}: expected a {kind}")
        items = []
        for item in node.value:
            if kind == PORTLIST:
                v = yaml.safe_load(yaml.serialize(item)) if isinstance(item, yaml.ScalarNode) \
                    else None
                if not isinstance(v, (int, str)) or isinstance(v, bool):
                    raise PolicyError(f"{_where(path, item, key)}: expected a port or range")
                items.append(v)
            else:
                items.append(_scalar(item, STR, path, key))
        return items
    if kind == RULELIST:
        from netpolicy.http_rules import HttpRuleError, parse_http_rule
        if not isinstance(node, yaml.SequenceNode):
            raise PolicyError(f"{_where(path, node, key)}: expected a {kind}")
        rules = []
        for item in node.value:
            rule = yaml.safe_load(yaml.serialize(item))
            if not isinstance(rule, (str, dict)):
                raise PolicyError(f"{_where(path, item, key)}: expected a rule string or "
                                  f"mapping, got {rule!r}")
            try:
                parse_http_rule(rule)
            except HttpRuleError as e:
                raise PolicyError(f"{_where(path, item, key)}: {e}") from None
            rules.append(rule)
        return rules
    if kind == AUTHLIST:
        from netpolicy.credentials import CredentialError, parse_auth_rule
        if not isinstance(node, yaml.SequenceNode):
            raise PolicyError(f"{_where(path, node, key)}: expected a {kind}")
        rules = []
        for item in node.value:
            rule = yaml.safe_load(yaml.serialize(item))
            try:
                parse_auth_rule(rule)
            except CredentialError as e:
                raise PolicyError(f"{_where(path, item, key)}: {e}") from None
            rules.append(rule)
        return rules
    if kind == STRMAP:
        if not isinstance(node, yaml.MappingNode):
            raise PolicyError(f"{_where(path, node, key)}: expected a {kind}")
        return {_scalar(k, STR, path, key): str(_scalar(v, STR, path, f"{key}.{k.value}"))
                for k, v in node.value}
    raise AssertionError(kind)


def _path(value: str) -> str:
    return os.path.abspath(os.path.expanduser(value))


def compose(path: str):
    """The policy file's YAML node tree (a mapping), or a PolicyError naming file:line."""
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PolicyError(f"{path}: {e.strerror}") from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise PolicyError(f"{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(root, yaml.MappingNode):
        raise PolicyError(f"{path}: a policy is a mapping with 'version: 1' at the top")
    return root


def load_policy(path: str) -> LoadedPolicy:
    """Read and check a policy file. Every error in it is reported at once, one line each
    (file:line: key: problem), as a PolicyError whose message holds them all."""
    root = compose(path)
    out = LoadedPolicy(path)
    errors: list[str] = []
    seen = {}
    for knode, vnode in root.value:
        try:
            _top_key(path, out, seen, knode, vnode, errors)
        except PolicyError as e:
            errors.append(str(e))
    if "version" not in seen:
        errors.append(f"{path}:1: missing 'version: 1'")
    if errors:
        raise PolicyError("\n".join(errors))
    out.fields.setdefault("protect_user_files", True)
    return out


def _top_key(path, out, seen, knode, vnode, errors) -> None:
    import yaml
    key = _scalar(knode, STR, path, "key")
    if key in seen:
        raise PolicyError(f"{_where(path, knode, key)}: duplicate key")
    seen[key] = vnode
    if key not in SCHEMA:
        raise PolicyError(f"{_where(path, knode, key)}: unknown key (expected one of "
                          f"{', '.join(SCHEMA)})")
    spec = SCHEMA[key]
    if spec == CREDENTIALS:
        _credentials(path, out, vnode)
        return
    if not isinstance(spec, dict):
        value = _scalar(vnode, spec, path, key)
        if key == "version" and value != 1:
            raise PolicyError(f"{_where(path, vnode, key)}: unsupported version {value} "
                              f"(this sandlock reads version 1)")
        if key == "name":
            out.name = value
            out.fields["name"] = value
        if key == "mode":
            if value not in ("enforce", "report"):
                raise PolicyError(f"{_where(path, vnode, key)}: expected enforce or report, "
                                  f"got {value!r}")
            out.fields["report_only"] = value == "report"
        return
    if not isinstance(vnode, yaml.MappingNode):
        raise PolicyError(f"{_where(path, vnode, key)}: expected a mapping")
    for sk_node, sv_node in vnode.value:
        try:
            _sub_key(path, out, key, spec, sk_node, sv_node)
        except PolicyError as e:
            errors.append(str(e))


def _credentials(path, out, node) -> None:
    """`credentials: {NAME: SOURCE}` or `{NAME: {source: SOURCE, env: VAR}}` (VAR then
    holds a placeholder inside). Sources are checked now; secrets are read at start."""
    import yaml

    from .credential_policy import _source
    if not isinstance(node, yaml.MappingNode):
        raise PolicyError(f"{_where(path, node, 'credentials')}: expected a {CREDENTIALS}")
    sources, env = {}, {}
    for knode, vnode in node.value:
        name = _scalar(knode, STR, path, "credentials")
        key = f"credentials.{name}"
        if isinstance(vnode, yaml.MappingNode):
            body = {_scalar(k, STR, path, key): (k, v) for k, v in vnode.value}
            unknown = set(body) - {"source", "env"}
            if unknown or "source" not in body:
                raise PolicyError(f"{_where(path, vnode, key)}: expected source: (and "
                                  f"optionally env:), got {', '.join(sorted(body))}")
            source = _scalar(body["source"][1], STR, path, f"{key}.source")
            if "env" in body:
                env[name] = _scalar(body["env"][1], STR, path, f"{key}.env")
        else:
            source = _scalar(vnode, STR, path, key)
        if source.startswith("file:"):
            source = "file:" + _path(source[5:])
        try:
            sources[name] = _source(name, source)
        except PolicyError as e:
            raise PolicyError(f"{_where(path, vnode, key)}: {str(e).split(': ', 2)[-1]}") \
                from None
    out.fields["credentials"] = sources
    if env:
        out.fields["credential_env"] = env


# Paths that must exist when the policy is loaded (a missing one is a mistake to report,
# not a rule that silently applies to nothing).
MUST_EXIST = {"fs_readable", "fs_writable", "fs_denied", "cwd", "workdir", "http_ca",
              "http_key", "http_upstream_ca"}


def _sub_key(path, out, key, spec, sk_node, sv_node) -> None:
    import yaml
    sub = _scalar(sk_node, STR, path, f"{key}.?")
    full = f"{key}.{sub}"
    if sub not in spec:
        raise PolicyError(f"{_where(path, sk_node, full)}: unknown key (expected one "
                          f"of {', '.join(key + '.' + s for s in spec)})")
    kind, field = spec[sub]
    value = _value(sv_node, kind, path, full)
    if field in PATH_FIELDS:
        value = [_path(v) if v != "*" else v for v in value] \
            if isinstance(value, list) else _path(value)
    if field in MUST_EXIST:
        items = sv_node.value if isinstance(sv_node, yaml.SequenceNode) else [sv_node]
        problems = [f"{_where(path, node, full)}: {v} does not exist"
                    for node, v in zip(items, value if isinstance(value, list) else [value])
                    if not os.path.lexists(v)]
        if problems:
            raise PolicyError("\n".join(problems))
    if field in ("net_allow_bind", "http_ports"):
        from .policy import parse_port_list
        problems = []
        for node, v in zip(sv_node.value, value):
            try:
                parse_port_list(str(v), full, str(v), allow_zero=field == "net_allow_bind")
            except PolicyError as e:
                problems.append(f"{_where(path, node, full)}: {str(e).split(': ', 1)[-1]}")
        if problems:
            raise PolicyError("\n".join(problems))
    if full == "filesystem.system":
        out.system = value
    elif full == "process.timeout":
        if value <= 0:
            raise PolicyError(f"{_where(path, sv_node, full)}: must be positive")
        out.timeout = float(value)
    else:
        out.fields[field] = value
    if field in ("net_allow", "net_deny"):
        _check_endpoints(path, sv_node, full, value)


def _check_endpoints(path, node, key, specs) -> None:
    from netpolicy.endpoint import EndpointError, parse_endpoint
    for item, spec in zip(node.value, specs):
        try:
            parse_endpoint(spec)
        except EndpointError as e:
            raise PolicyError(f"{_where(path, item, key)}: {e}") from None


LIST_FIELDS = ("fs_readable", "fs_writable", "fs_denied", "net_allow", "net_deny",
               "net_allow_bind", "net_allow_unix", "dns_servers", "extra_deny_syscalls",
               "extra_allow_syscalls", "http_allow", "http_deny", "http_ports",
               "http_upgrades", "http_raw", "http_auth")


# Booleans whose false is a choice, not "unset" (a policy file turning a default off).
EXPLICIT_FALSE = {"protect_user_files"}


def merge_fields(base: dict, extra: dict) -> dict:
    """`extra` adds to `base`: lists are concatenated, mappings merged, scalars replaced
    (when set). This is how CLI flags add to a policy file."""
    out = dict(base)
    for key, value in extra.items():
        if value is None:
            continue
        if key in LIST_FIELDS:
            out[key] = list(out.get(key) or []) + list(value)
        elif key in ("env", "credentials", "credential_env"):
            out[key] = {**(out.get(key) or {}), **value}
        elif value is not False or key not in out or key in EXPLICIT_FALSE:
            out[key] = value
    return out


def system_fields() -> dict:
    """The read-only system view `sandlock run` grants unless told otherwise."""
    from .policy import system_denied, system_devices, system_readable
    return {"fs_readable": system_readable(), "fs_writable": system_devices(),
            "fs_denied": system_denied()}
