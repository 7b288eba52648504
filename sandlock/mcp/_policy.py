"""Deny-by-default policies for Python tool functions (upstream Sandlock's
`policy_for_tool` and `capabilities_from_mcp_tool`, same names and arguments).

A tool with no capabilities gets: the system directories and the Python installation
read-only, the workspace readable, /dev/null and friends, a private TMPDIR, a clean
environment, the user's files protected, no network (the cloud metadata endpoint denied
outright, which also has every connect judged and its denial recorded in the Result) and
no other writes. Capabilities
are Sandbox fields; lists add to those defaults (a capability grants, it never takes the
interpreter away), scalars replace. Differences from upstream, all fail-closed: an
unknown capability is an error, not ignored; `clean_env` cannot be turned off (pass
variables with the `env` capability); and capabilities read from an MCP tool's
annotations can only grant, never waive a protection (see NOT_FROM_ANNOTATIONS).
"""

from __future__ import annotations

import os
import site
import sys
from dataclasses import fields
from typing import Any, Mapping, Sequence

from ..errors import PolicyError

_PREFIX = "sandlock:"
# Fields an MCP server's own annotations may never set: they waive protections or run
# code in this process, which a tool description from a server cannot be trusted with.
NOT_FROM_ANNOTATIONS = frozenset({
    "disable", "allow_degraded", "keep_capabilities", "uid", "gid", "protect_user_files",
    "clean_env", "policy_fn", "policy_fn_timeout", "policy_fn_events", "init_fn", "work_fn",
    "extra_allow_syscalls", "credentials", "credential_env", "http_auth", "http_ca",
    "http_key", "http_ca_out", "fs_storage", "workdir", "cwd", "name"})


def _fields() -> frozenset:
    from ..sandbox import Sandbox
    return frozenset(f.name for f in fields(Sandbox) if f.init)


def interpreter_readable() -> list[str]:
    """What the sandboxed worker reads to start this Python and import installed packages
    (not the user's home, not sandlock's source tree)."""
    paths = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    try:
        paths.extend(site.getsitepackages())
    except AttributeError:
        pass
    return [p for p in dict.fromkeys(os.path.realpath(p) for p in paths) if os.path.isdir(p)]


def policy_for_tool(*, workspace: str = "/tmp/sandlock",
                    capabilities: Mapping[str, Any] | None = None,
                    extra_readable: Sequence[str] = ()):
    """A Sandbox for one tool: the defaults above plus `capabilities` (Sandbox field ->
    value), e.g. {"fs_writable": [workspace], "net_allow": ["api.example.com:443"],
    "env": {"KEY": "value"}, "max_memory": "256M"}."""
    from ..policy import system_denied, system_devices, system_readable
    from ..policy_file import merge_fields
    from ..sandbox import Sandbox
    from .toolpolicy import METADATA
    known = _fields()
    caps = dict(capabilities or {})
    for key, value in caps.items():
        if key not in known:
            raise PolicyError(f"capabilities: unknown capability {key!r} (a Sandbox field, "
                              f"e.g. fs_writable, net_allow, env, max_memory)")
        if key == "clean_env" and value is not True:
            raise PolicyError("capabilities: clean_env is always on for tools (pass "
                              "variables with the env capability)")
    readable = [p for p in (workspace, *interpreter_readable(), *extra_readable)
                if os.path.exists(p)]
    base = {"fs_readable": system_readable() + readable, "fs_writable": system_devices(),
            "fs_denied": system_denied(), "clean_env": True, "private_tmp": True,
            "protect_user_files": True, "net_deny": list(METADATA),
            "cwd": workspace if os.path.isdir(workspace) else "/"}
    merged = merge_fields(base, caps)
    merged["clean_env"] = True
    return Sandbox(**merged)


def capabilities_from_mcp_tool(tool: Any) -> dict[str, Any]:
    """Capabilities an MCP tool declares with `sandlock:FIELD` keys in its annotations or
    its `_meta` (standard hints such as readOnlyHint grant nothing). What a server declares
    is a request: fields in NOT_FROM_ANNOTATIONS and unknown fields are left out."""
    known = _fields() - NOT_FROM_ANNOTATIONS
    caps: dict[str, Any] = {}
    for source in (_annotations(tool), getattr(tool, "meta", None) or {}):
        if not isinstance(source, Mapping):
            continue
        for key, value in source.items():
            if isinstance(key, str) and key.startswith(_PREFIX) and \
                    key[len(_PREFIX):] in known:
                caps[key[len(_PREFIX):]] = value
    return caps


def _annotations(tool: Any) -> dict[str, Any]:
    ann = getattr(tool, "annotations", None)
    if ann is None:
        return {}
    if isinstance(ann, Mapping):
        return dict(ann)
    if hasattr(ann, "model_dump"):  # pydantic: extra keys (sandlock:...) are kept
        return ann.model_dump(exclude_none=True, by_alias=True)
    return {k: v for k, v in vars(ann).items() if v is not None}
