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
PATHS = {"fs_readable", "fs_writable", "fs_denied", "cwd", "http_ca", "http_key",
         "http_ca_out", "fs_storage", "workdir", "chroot"}
LISTS = {"args", "fs_readable", "fs_writable", "fs_denied", "fs_mount", "net_allow",
         "net_deny", "net_allow_bind", "net_deny_bind", "http_ports", "http_allow",
         "http_deny", "extra_allow_syscalls", "extra_deny_syscalls", "gpu_devices",
         "cpu_cores"}


def profiles_dir() -> str:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(
        os.environ.get("HOME") or "/tmp", ".config")
    return os.path.join(config, "sandlock", "profiles")


def list_profiles() -> list[str]:
    d = profiles_dir()
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
    d = profiles_dir()
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
        raise PolicyError(f"{source}: not valid TOML ({e})") from None
    fields: dict = {}
    program: list[str] = []
    errors = []
    for section, body in data.items():
        if section not in SCHEMA:
            where = _line(text, section, None)
            if not isinstance(body, dict):
                errors.append(f"{source}:{where}: {section}: a key outside any section "
                              f"(profiles are sectioned: {', '.join(f'[{s}]' for s in SCHEMA)})")
            else:
                errors.append(f"{source}:{where}: [{section}]: unknown section (expected "
                              f"one of {', '.join(SCHEMA)})")
            continue
        for key, value in body.items():
            where = f"{source}:{_line(text, section, key)}: {section}.{key}"
            field = SCHEMA[section].get(key, "?")
            if field == "?":
                errors.append(f"{where}: unknown key (expected one of "
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
            else:
                fields[field] = value
    if errors:
        raise PolicyError("\n".join(errors))
    prog = data.get("program", {})
    if isinstance(prog, dict) and "args" in prog and "exec" not in prog:
        raise PolicyError(f"{source}:{_line(text, 'program', 'args')}: program.args: "
                          f"given without program.exec")
    return fields, program


def _expand(path: str) -> str:
    home = os.environ.get("HOME") or os.path.expanduser("~")
    path = path.replace("${HOME}", home)
    return os.path.expanduser(path)


def _check(field: str, value):
    if field in LISTS:
        if not isinstance(value, list):
            raise PolicyError(f"expected a list, got {value!r}")
        if field in PATHS:
            value = [_expand(str(v)) for v in value]
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
        return value
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
    from .sandbox import Sandbox
    p = read_profile(name)
    if p.system:  # a YAML policy with `filesystem.system` (its default)
        from .policy_file import merge_fields, system_fields
        return Sandbox(**merge_fields(system_fields(), p.fields))
    return Sandbox(**p.fields)


def policy_from_toml(text: str, source: str = "<string>"):
    from .sandbox import Sandbox
    return Sandbox(**parse_toml(text, source)[0])


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
