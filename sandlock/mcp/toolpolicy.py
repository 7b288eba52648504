"""Each `sandlock mcp` tool's policy: its defaults, and what a YAML policy adds to them.

Two forms, in the policy file schema of sandlock.policy_file:

- one file (`--policy FILE`): the usual sections at the top apply to every tool, and a
  `tools:` mapping adds a section per tool (tool name -> a policy body without `version`):

      version: 1
      audit: {file: ~/.local/state/sandlock/mcp.jsonl}   # every tool
      tools:
        shell: {limits: {memory: 1G}}
        web_fetch:
          network: {allow: ["docs.python.org:443"]}
          workspace_access: none

- a directory (`--policy-dir DIR`): `DIR/<tool>.yaml`, each a whole policy file for one
  tool; a tool without a file keeps its defaults; any other *.yaml there is an error.

Defaults, deny by default: the system directories read-only, the workspace readable (and
writable for shell, python and write_file; web_fetch has no workspace at all), no network,
a clean environment, a private TMPDIR, the user's files protected, the cloud metadata
endpoint denied outright (with a deny rule, the supervisor judges every connect, so that
every network denial is audited and returned to the client). A section adds to them
as a policy file adds to `sandlock run`: lists extend, scalars replace. One key of its own:
`workspace_access: none|read|write`. Refused in a tool section, with file:line: `workspace:`
(the workspace is `--workspace`/`--cow`), `process.cwd` (tools run in the workspace),
`process.clean_env: false` (a tool never inherits the server's environment: name variables
in `process.env`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import PolicyError

TOOLS = ("shell", "python", "read_file", "write_file", "list_files", "web_fetch")
ACCESS = ("none", "read", "write")
DEFAULT_ACCESS = {"shell": "write", "python": "write", "write_file": "write",
                  "read_file": "read", "list_files": "read", "web_fetch": "none"}
DEFAULT_TIMEOUT = 60.0
METADATA = ("169.254.169.254", "[fd00:ec2::254]")  # cloud metadata, denied to every tool
MAX_TIMEOUT = 3600.0


@dataclass
class ToolPolicy:
    """What one tool's calls run under: Sandbox fields (without the workspace grant, which
    the server adds), the per-call timeout, the workspace access, and where it came from."""
    tool: str
    fields: dict = field(default_factory=dict)
    system: bool = True
    timeout: float = DEFAULT_TIMEOUT
    access: str = "read"
    source: str = "defaults"   # "FILE" or "FILE (tools.NAME)": where a denial's fix goes

    def sandbox_fields(self, workspace: str | None) -> dict:
        """Sandbox keyword arguments for one call in `workspace` (None: no workspace)."""
        from ..policy_file import merge_fields, system_fields
        base = dict(system_fields()) if self.system else {}
        base.update(clean_env=True, private_tmp=True, protect_user_files=True,
                    net_deny=list(METADATA),  # also: every connect is judged and audited
                    explain=True)  # file refusals come back as denials too
        if workspace is not None and self.access != "none":
            key = "fs_writable" if self.access == "write" else "fs_readable"
            base = merge_fields(base, {key: [workspace]})
        fields = merge_fields(base, self.fields)
        fields["clean_env"] = True
        fields["cwd"] = workspace if workspace is not None and self.access != "none" else "/"
        fields["name"] = f"{fields.get('name') or 'mcp'}-{self.tool}"  # in audit records
        return fields


def defaults(timeout: float = DEFAULT_TIMEOUT) -> dict[str, ToolPolicy]:
    return {t: ToolPolicy(t, timeout=timeout, access=DEFAULT_ACCESS[t]) for t in TOOLS}


def load(policy: str | None, policy_dir: str | None,
         timeout: float = DEFAULT_TIMEOUT) -> dict[str, ToolPolicy]:
    """Every tool's policy from `--policy FILE` or `--policy-dir DIR` (or the defaults).
    All errors of all files are reported at once, one line each (file:line: key: problem)."""
    if policy and policy_dir:
        raise PolicyError("--policy and --policy-dir: give one of them")
    out = defaults(timeout)
    if policy:
        _load_file(policy, out)
    elif policy_dir:
        _load_dir(policy_dir, out)
    return out


# --- the YAML ------------------------------------------------------------------------------

def _compose(path: str):
    from ..policy_file import compose
    return compose(path)


def _where(path: str, node, key: str | None = None) -> str:
    return f"{path}:{node.start_mark.line + 1}" + (f": {key}" if key else "")


class _Section:
    """One policy body (a file's top, a `tools.NAME` mapping or a DIR/NAME.yaml), read
    with sandlock.policy_file's own checks so that keys, types and errors are the same."""

    def __init__(self, path: str, prefix: str = ""):
        from ..policy_file import LoadedPolicy
        self.path = path
        self.prefix = prefix  # "tools.shell." inside a file's tools: mapping
        self.loaded = LoadedPolicy(path)
        self.seen: dict = {}
        self.access: str | None = None

    def key(self, knode, vnode, errors: list[str]) -> None:
        import yaml
        from ..policy_file import _top_key  # one reader of policy bodies: same checks
        key = knode.value if isinstance(knode, yaml.ScalarNode) else "?"
        full = self.prefix + key
        if key == "workspace_access":
            value = vnode.value if isinstance(vnode, yaml.ScalarNode) else None
            if value not in ACCESS:
                errors.append(f"{_where(self.path, vnode, full)}: expected one of "
                              f"{', '.join(ACCESS)}, got {value!r}")
            self.access = value
            return
        if key == "workspace":
            errors.append(f"{_where(self.path, knode, full)}: not in a tool's policy (the "
                          f"workspace is sandlock mcp's --workspace, copy-on-write with --cow)")
            return
        if key == "process" and isinstance(vnode, yaml.MappingNode):
            for sk, sv in vnode.value:
                if sk.value == "cwd":
                    errors.append(f"{_where(self.path, sk, full + '.cwd')}: not in a tool's "
                                  f"policy (tools run in the workspace)")
                elif sk.value == "clean_env" and isinstance(sv, yaml.ScalarNode) and \
                        yaml.safe_load(yaml.serialize(sv)) is not True:
                    errors.append(f"{_where(self.path, sv, full + '.clean_env')}: tools "
                                  f"always start with a clean environment (name variables "
                                  f"in process.env)")
        before = len(errors)
        try:
            _top_key(self.path, self.loaded, self.seen, knode, vnode, errors)
        except PolicyError as e:
            errors.append(str(e))
        if self.prefix:  # name the section: "f.yaml:7: network.alow" -> "tools.x.network.alow"
            for i in range(before, len(errors)):
                lines = []
                for line in errors[i].split("\n"):
                    head, sep, rest = line.partition(": ")
                    lines.append(f"{head}{sep}{self.prefix}{rest}" if sep else line)
                errors[i] = "\n".join(lines)


def _load_file(path: str, out: dict[str, ToolPolicy]) -> None:
    import yaml
    root = _compose(path)
    errors: list[str] = []
    base = _Section(path)
    tools_node = None
    for knode, vnode in root.value:
        key = knode.value if isinstance(knode, yaml.ScalarNode) else None
        if key == "tools":
            if tools_node is not None:
                errors.append(f"{_where(path, knode, 'tools')}: duplicate key")
            tools_node = vnode
        elif key == "workspace_access":
            errors.append(f"{_where(path, knode, key)}: belongs in a tool's section "
                          f"(tools.NAME.workspace_access)")
        else:
            base.key(knode, vnode, errors)
    if "version" not in base.seen:
        errors.append(f"{path}:1: missing 'version: 1'")
    sections: dict[str, _Section] = {}
    if tools_node is not None:
        if not isinstance(tools_node, yaml.MappingNode):
            errors.append(f"{_where(path, tools_node, 'tools')}: expected a mapping of tool "
                          f"names ({', '.join(TOOLS)}) to policy sections")
        else:
            for tnode, body in tools_node.value:
                name = tnode.value if isinstance(tnode, yaml.ScalarNode) else "?"
                if name not in TOOLS:
                    errors.append(f"{_where(path, tnode, 'tools.' + str(name))}: unknown tool "
                                  f"(expected one of {', '.join(TOOLS)})")
                    continue
                if name in sections:
                    errors.append(f"{_where(path, tnode, 'tools.' + name)}: duplicate key")
                    continue
                section = sections[name] = _Section(path, f"tools.{name}.")
                if body is None or (isinstance(body, yaml.ScalarNode) and body.value == ""):
                    continue  # `shell:` alone: the defaults
                if not isinstance(body, yaml.MappingNode):
                    errors.append(f"{_where(path, body, 'tools.' + name)}: expected a mapping "
                                  f"(a policy section)")
                    continue
                for knode, vnode in body.value:
                    if isinstance(knode, yaml.ScalarNode) and knode.value in ("version",
                                                                               "tools"):
                        errors.append(f"{_where(path, knode, f'tools.{name}.{knode.value}')}:"
                                      f" only at the top of the file")
                        continue
                    section.key(knode, vnode, errors)
    if errors:
        raise PolicyError("\n".join(errors))
    for tool, policy in out.items():
        _apply(policy, base, f"{path}")
        if tool in sections:
            _apply(policy, sections[tool], f"{path} (tools.{tool})")


def _load_dir(directory: str, out: dict[str, ToolPolicy]) -> None:
    import yaml
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        raise PolicyError(f"--policy-dir {directory}: {e.strerror}") from None
    errors: list[str] = []
    found = {}
    for name in names:
        stem, ext = os.path.splitext(name)
        if ext not in (".yaml", ".yml"):
            continue
        path = os.path.join(directory, name)
        if stem not in TOOLS:
            errors.append(f"{path}: not a tool's policy (expected {', '.join(TOOLS)} "
                          f"+ .yaml)")
            continue
        if stem in found:
            errors.append(f"{path}: a second policy for {stem} (also {found[stem].path})")
            continue
        try:
            root = _compose(path)
        except PolicyError as e:
            errors.append(str(e))
            continue
        section = found[stem] = _Section(path)
        for knode, vnode in root.value:
            if isinstance(knode, yaml.ScalarNode) and knode.value == "tools":
                errors.append(f"{_where(path, knode, 'tools')}: a --policy-dir file is one "
                              f"tool's policy (tools: belongs in a --policy file)")
                continue
            section.key(knode, vnode, errors)
        if "version" not in section.seen:
            errors.append(f"{path}:1: missing 'version: 1'")
    if not found and not errors:
        raise PolicyError(f"--policy-dir {directory}: no tool policy in it (expected "
                          f"{', '.join(t + '.yaml' for t in TOOLS)})")
    if errors:
        raise PolicyError("\n".join(errors))
    for tool, section in found.items():
        _apply(out[tool], section, section.path)


def _apply(policy: ToolPolicy, section: _Section, source: str) -> None:
    from ..policy_file import merge_fields
    loaded = section.loaded
    if not (loaded.fields or section.access or loaded.timeout or not loaded.system):
        return
    policy.fields = merge_fields(policy.fields, loaded.fields)
    policy.system = policy.system and loaded.system
    if loaded.timeout is not None:
        if loaded.timeout > MAX_TIMEOUT:
            raise PolicyError(f"{source}: process.timeout: at most {MAX_TIMEOUT:g} seconds "
                              f"for a tool call")
        policy.timeout = loaded.timeout
    if section.access is not None:
        policy.access = section.access
    policy.source = source


# --- `sandlock policy check` of a per-tool file --------------------------------------------

def is_tool_policy(path: str) -> bool:
    """Whether `path` is a per-tool policy file (a `tools:` mapping at its top): what
    `sandlock policy check` hands to `report` instead of reading it as one policy."""
    import yaml
    try:
        root = _compose(path)
    except PolicyError:
        return False
    return any(isinstance(k, yaml.ScalarNode) and k.value == "tools" for k, _ in root.value)


def report(path: str) -> list[str]:
    """Lines for `sandlock policy check FILE` of a per-tool file: every error (PolicyError,
    as `load` raises it), or each tool's effective grants beyond the system directories,
    built as `sandlock mcp` builds them (the workspace shown as WORKSPACE)."""
    from ..sandbox import Sandbox
    policies = load(path, None)
    lines = [f"{path}: valid (version 1) — per-tool policies for `sandlock mcp`"]
    for tool, policy in policies.items():
        try:
            sb = Sandbox(**policy.sandbox_fields(None))
        except PolicyError as e:
            raise PolicyError(f"{path}: tools.{tool}: {e}") from None
        p = sb.policy
        net = [r.spec for r in p.endpoints.allow if r.spec not in METADATA] or ["(none)"]
        http = [r.spec for r in p.http.allow] if p.http else []
        lines.append(f"  {tool:11} workspace {policy.access}; network {', '.join(net)}"
                     + (f"; http {', '.join(http)}" if http else "")
                     + f"; timeout {policy.timeout:g}s"
                     + (f"; audit {p.audit_log}" if p.audit_log else ""))
    return lines
