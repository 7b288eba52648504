"""Named profiles: `~/.config/sandlock/profiles/NAME.toml` in upstream's sectioned schema,
or `NAME.yaml` in ours (sandlock.policy_file).

    [program]      exec, args, env, cwd, uid, gid, clean_env, no_coredump, no_huge_pages
    [filesystem]   read, write, deny, chroot, mount, on_exit, on_error
    [network]      allow, deny, allow_bind, deny_bind, port_remap
    [http]         ports, allow, deny
    [syscalls]     extra_allow, extra_deny
    [limits]       memory, processes, open_files, cpu, disk, gpu_devices, cpu_cores, num_cpus
    [config]       http_ca, http_key, http_inject_ca, http_ca_out, fs_storage, workdir
    [determinism]  random_seed, time_start, deterministic_dirs, no_randomize_memory

Every key maps to the `Sandbox` field of the same meaning (`limits.memory` is
`max_memory`). Unknown sections and keys, and keys outside a section, are refused with the
file and line; `${HOME}` and a leading `~` are expanded in paths. `[program].exec` and
`args` are not policy: `sandlock run -p NAME` runs them when no command is given. Fields
whose mechanism this version lacks (chroot, mount, port_remap, determinism, GPUs) are
refused by the Sandbox as everywhere else, never ignored.
"""

from __future__ import annotations

import os
import re

from .errors import PolicyError

# section -> key -> Sandbox field (None: handled specially)
SCHEMA = {
    "program": {"exec": None, "args": None, "env": "env", "cwd": "cwd", "uid": "uid",
                "gid": "gid", "clean_env": "clean_env", "no_coredump": "no_coredump",
                "no_huge_pages": "no_huge_pages"},
    "filesystem": {"read": "fs_readable", "write": "fs_writable", "deny": "fs_denied",
                   "read_write": None,
                   "chroot": "chroot", "mount": "fs_mount", "on_exit": "on_exit",
                   "on_error": "on_error"},
    "network": {"allow": "net_allow", "deny": "net_deny", "allow_bind": "net_allow_bind",
                "deny_bind": "net_deny_bind", "port_remap": "port_remap"},
    "http": {"ports": "http_ports", "allow": "http_allow", "deny": "http_deny"},
    "syscalls": {"extra_allow": "extra_allow_syscalls", "extra_deny": "extra_deny_syscalls"},
    "limits": {"memory": "max_memory", "processes": "max_processes",
               "open_files": "max_open_files", "cpu": "max_cpu", "disk": "max_disk",
               "gpu_devices": "gpu_devices", "cpu_cores": "cpu_cores", "num_cpus": "num_cpus"},
    "config": {"http_ca": "http_ca", "http_key": "http_key",
               "http_inject_ca": "http_inject_ca", "http_ca_out": "http_ca_out",
               "fs_storage": "fs_storage", "workdir": "workdir"},
    "determinism": {"random_seed": "random_seed", "time_start": "time_start",
                    "deterministic_dirs": "deterministic_dirs",
                    "no_randomize_memory": "no_randomize_memory"},
}
PATHS = {"fs_readable", "fs_writable", "fs_denied", "cwd", "http_ca", "http_key", "read_write",
         "http_ca_out", "fs_storage", "workdir", "chroot"}
LISTS = {"args", "read_write", "fs_readable", "fs_writable", "fs_denied", "fs_mount", "net_allow",
         "net_deny", "net_allow_bind", "net_deny_bind", "http_ports", "http_allow",
         "http_deny", "extra_allow_syscalls", "extra_deny_syscalls", "gpu_devices",
         "cpu_cores"}


def profiles_dir():
    """~/.config/sandlock/profiles (from $HOME, as upstream's CLI and SDK agree; not
    $XDG_CONFIG_HOME), as a Path."""
    from pathlib import Path
    return Path(os.environ.get("HOME") or "/tmp") / ".config" / "sandlock" / "profiles"


def list_profiles() -> list[str]:
    d = str(profiles_dir())
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return sorted({n.rsplit(".", 1)[0] for n in names
                   if n.endswith((".toml", ".yaml", ".yml"))
                   and os.path.isfile(os.path.join(d, n))})


def profile_path(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise PolicyError(f"profile {name!r}: a name, not a path")
    d = str(profiles_dir())
    for ext in (".toml", ".yaml", ".yml"):
        path = os.path.join(d, name + ext)
        if os.path.isfile(path):
            return path
    raise PolicyError(f"profile not found: {os.path.join(d, name)}.toml (sandlock profile "
                      f"list shows what there is)")


class Profile:
    """A profile's Sandbox fields and program (exec, args)."""

    def __init__(self, path: str, fields: dict, program: list[str], timeout=None,
                 system: bool = False):
        self.path, self.fields, self.program = path, fields, program
        self.timeout, self.system = timeout, system


def read_profile(name_or_path: str) -> Profile:
    path = name_or_path if "/" in name_or_path else profile_path(name_or_path)
    if path.endswith((".yaml", ".yml")):
        from .policy_file import load_policy
        loaded = load_policy(path)
        return Profile(path, loaded.fields, [], loaded.timeout, loaded.system)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    return Profile(path, *parse_toml(text, path))


def parse_toml(text: str, source: str = "<string>") -> tuple[dict, list[str]]:
    """(Sandbox fields, [exec, *args]) from profile text; PolicyError names file:line."""
    import tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{source}: TOML parse error: {e}") from None
    fields: dict = {}
    program: list[str] = []
    errors = []
    for section, body in data.items():
        if section not in SCHEMA:
            where = _line(text, section, None)
            if not isinstance(body, dict):
                errors.append(f"{source}:{where}: unknown field `{section}`: a key outside "
                              f"any section (profiles are sectioned: "
                              f"{', '.join(f'[{s}]' for s in SCHEMA)})")
            else:
                errors.append(f"{source}:{where}: unknown field `{section}`: not a section "
                              f"(expected one of {', '.join(SCHEMA)})")
            continue
        for key, value in body.items():
            where = f"{source}:{_line(text, section, key)}: [{section}].{key}"
            field = SCHEMA[section].get(key, "?")
            if field == "?":
                errors.append(f"{where}: unknown field `{key}` (expected one of "
                              f"{', '.join(SCHEMA[section])})")
                continue
            try:
                value = _check(field or key, value)
            except PolicyError as e:
                errors.append(f"{where}: {e}")
                continue
            if key == "exec":
                program[:0] = [value]
            elif key == "args":
                program += value
            elif key == "read_write":
                fields["fs_readable"] = fields.get("fs_readable", []) + value
                fields["fs_writable"] = fields.get("fs_writable", []) + value
            elif field in ("fs_readable", "fs_writable"):
                fields[field] = value + fields.get(field, [])
            elif field == "fs_mount":
                try:
                    rw, ro = _mounts(value)
                except PolicyError as e:
                    errors.append(f"{where}: {e}")
                    continue
                fields.update({k: v for k, v in (("fs_mount", rw), ("fs_mount_ro", ro)) if v})
            else:
                fields[field] = value
    prog_body = data.get("program", {})
    if isinstance(prog_body, dict) and ("uid" in prog_body) != ("gid" in prog_body):
        errors.append(f"{source}:{_line(text, 'program', 'uid' if 'uid' in prog_body else 'gid')}"
                      f": program.uid and program.gid must both be set")
    if errors:
        raise PolicyError("\n".join(errors))
    prog = data.get("program", {})
    if isinstance(prog, dict) and "args" in prog and "exec" not in prog:
        raise PolicyError(f"{source}:{_line(text, 'program', 'args')}: program.args: "
                          f"given without program.exec")
    return fields, program


def _mounts(specs) -> tuple[dict, dict]:
    """["VIRTUAL:HOST[:ro|:rw]", ...] -> (read-write, read-only) {virtual: host}."""
    rw, ro = {}, {}
    for spec in specs:
        body, read_only = spec, False
        if spec.endswith(":ro"):
            body, read_only = spec[:-3], True
        elif spec.endswith(":rw"):
            body = spec[:-3]
        virt, colon, host = body.partition(":")
        if not colon or not virt or not host:
            raise PolicyError(f"invalid mount spec {spec!r}; expected \"VIRTUAL:HOST[:ro]\"")
        if virt in rw or virt in ro:
            raise PolicyError(f"{virt} is mounted more than once")
        (ro if read_only else rw)[virt] = _expand(host)
    return rw, ro


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(path: str) -> str:
    """${VAR} from the environment (an unset one is an error) and a leading ~."""
    def var(m):
        value = os.environ.get(m[1])
        if value is None:
            raise PolicyError(f"${{{m[1]}}} is not set")
        return value
    return os.path.expanduser(_VAR.sub(var, path))


BOOLS = {"clean_env", "no_coredump", "no_huge_pages", "port_remap", "deterministic_dirs",
         "no_randomize_memory"}
INTS = {"uid", "gid", "max_processes", "max_open_files", "max_cpu", "num_cpus",
        "random_seed"}


def _check(field: str, value):
    if field in BOOLS and not isinstance(value, bool):
        raise PolicyError(f"expected true or false, got {value!r}")
    if field in INTS and (isinstance(value, bool) or not isinstance(value, int)):
        raise PolicyError(f"expected an integer, got {value!r}")
    if field in LISTS:
        if not isinstance(value, list):
            raise PolicyError(f"expected a list, got {value!r}")
        if field in PATHS:
            value = [_expand(str(v)) for v in value]
        if field == "net_allow_bind" and "*" in value and len(value) > 1:
            raise PolicyError("the wildcard \"*\" allows every port: list no ports with it")
        return value
    if field in PATHS or field == "exec":
        if not isinstance(value, str):
            raise PolicyError(f"expected a path, got {value!r}")
        return _expand(value)
    if field == "env":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise PolicyError("expected a table of strings")
        return value
    if field == "http_inject_ca":
        if isinstance(value, list):
            return [_expand(str(v)) for v in value]
        return value
    if field in ("on_exit", "on_error"):
        if value not in ("commit", "abort", "keep"):
            raise PolicyError(f"expected \"commit\", \"abort\" or \"keep\", got {value!r}")
        from .sandbox import BranchAction
        return BranchAction(value)
    return value


def _line(text: str, section: str, key: str | None) -> int:
    """The line of `key` in `[section]` (or of the section), for error messages."""
    lines = text.splitlines()
    start = 0
    for i, line in enumerate(lines):
        if re.match(rf"\s*\[\s*{re.escape(section)}\s*\]", line):
            start = i
            if key is None:
                return i + 1
            break
    name = key if key is not None else section
    for i in range(start, len(lines)):
        if re.match(rf"\s*\"?{re.escape(name)}\"?\s*=", lines[i]):
            return i + 1
    return start + 1


def load_profile(name: str):
    """The Sandbox a named profile describes (upstream: `sandlock.load_profile`)."""
    return _sandbox(read_profile(name))


def _sandbox(p: Profile):
    from .sandbox import Sandbox
    fields = p.fields
    if p.system:  # a YAML policy with `filesystem.system` (its default)
        from .policy_file import merge_fields, system_fields
        fields = merge_fields(system_fields(), p.fields)
    try:
        return Sandbox(**fields)
    except PolicyError as e:
        raise PolicyError(f"{p.path}: {e}") from None


def policy_from_toml(text: str, source: str = "<string>"):
    """The Sandbox a profile's text describes (upstream's name); errors name `source`."""
    from .sandbox import Sandbox
    fields = parse_toml(text, source)[0]
    try:
        return Sandbox(**fields)
    except PolicyError as e:
        raise PolicyError(f"{source}: {e}") from None


def load_profile_path(path):
    """The Sandbox of the profile file at `path` (TOML, or a YAML policy)."""
    return _sandbox(read_profile(os.fspath(path) if "/" in os.fspath(path)
                                 else os.path.join(".", os.fspath(path))))


def merge_cli_overrides(policy, overrides: dict):
    """A new Sandbox: list fields of `overrides` appended to the profile's, the others
    replacing them (upstream's)."""
    import dataclasses
    merged = {}
    for key, value in overrides.items():
        current = getattr(policy, key, None)
        merged[key] = (list(current) + list(value)
                       if isinstance(current, (list, tuple)) and isinstance(value, list)
                       else value)
    return dataclasses.replace(policy, **merged)


# -- the other way: fields as a TOML profile (`sandlock inspect --toml`) -------------------

def to_toml(fields: dict) -> str:
    """Fields as a profile; those with no place in the schema follow as comments."""
    where = {f: (s, k) for s, keys in SCHEMA.items() for k, f in keys.items() if f}
    sections: dict[str, list[str]] = {}
    rest = []
    for field, value in sorted(fields.items()):
        if field == "max_memory" or field == "max_disk":
            value = str(value)
        if field in where and _tomlable(value):
            s, k = where[field]
            sections.setdefault(s, []).append(f"{k} = {_toml_value(value)}")
        else:
            rest.append(f"# {field} = {value!r}")
    out = []
    for s in SCHEMA:
        if s in sections:
            out.append(f"[{s}]")
            out += sections[s]
            out.append("")
    if rest:
        out.append("# not in the TOML profile schema (sandlock's own fields):")
        out += rest
    return "\n".join(out) + "\n"


def _tomlable(value) -> bool:
    if isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                   for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    return False


def _toml_value(value) -> str:
    import json
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is JSON's string syntax
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}"
                                for k, v in value.items()) + " }"
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"
