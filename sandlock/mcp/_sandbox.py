"""McpSandbox: Python tool functions run per call in a sandbox derived from the
capabilities each declares (upstream Sandlock's class: same names, arguments and return
values).

    mcp = McpSandbox(workspace="/tmp/agent")
    mcp.add_tool("read_file", read_fn)                                  # read-only
    mcp.add_tool("write_file", write_fn, capabilities={"fs_writable": ["/tmp/agent"]})
    text = await mcp.call_tool("write_file", {"path": "out.txt", "content": "hi"})

Each call starts a fresh interpreter (this one, isolated: -I) in a new sandbox under the
tool's policy (`policy_for_tool`), imports the tool's module and calls the function with
the JSON arguments; the return value comes back as a string (a str as is, anything else
as JSON). A failure (an exception, a timeout, a non-zero exit) raises ToolError, a
RuntimeError carrying the exit code, stderr and the sandbox's denials. Each call is bounded
by its timeout (default 30 s; None means MAX_TIMEOUT) and its output by runner.MAX_OUTPUT.

Tools of another MCP server (`add_mcp_session`) are forwarded to that server, as
upstream does: they run in that server's process, which this class does not confine. Their
declared capabilities are what `get_policy` returns, to inspect; to enforce a policy on such
a server, start it under `sandlock mcp-wrap --policy P.yaml -- CMD`.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections import namedtuple
from typing import Any, Callable

from ._policy import capabilities_from_mcp_tool, policy_for_tool

MAX_TIMEOUT = 3600.0
_Entrypoint = namedtuple("_Entrypoint", "module qualname syspath")


class ToolError(RuntimeError):
    """A sandboxed tool call failed: exit_code, stderr, timed_out, denials."""

    def __init__(self, message: str, exit_code: int = -1, stderr: str = "",
                 timed_out: bool = False, denials: list | None = None):
        super().__init__(message)
        self.exit_code, self.stderr, self.timed_out = exit_code, stderr, timed_out
        self.denials = list(denials or [])


def _resolve_entrypoint(name: str, func: Callable) -> _Entrypoint:
    """An importable (module, qualname, directory) for a top-level function; lambdas,
    methods and nested functions cannot be imported by name in a fresh interpreter."""
    qualname = getattr(func, "__qualname__", getattr(func, "__name__", ""))
    if qualname == "<lambda>" or "<locals>" in qualname or "." in qualname or not qualname:
        raise ValueError(f"cannot sandbox {name!r}: the tool must be a top-level function of "
                         f"an importable module (got {qualname or func!r})")
    try:
        file = inspect.getfile(func)
    except TypeError as exc:
        raise ValueError(f"cannot sandbox {name!r}: its source file is unknown ({exc})") \
            from None
    module = func.__module__
    if module == "__main__":
        module = os.path.splitext(os.path.basename(file))[0]
    return _Entrypoint(module, qualname, os.path.dirname(os.path.abspath(file)))


class _LocalTool:
    __slots__ = ("name", "func", "description", "capabilities", "input_schema")

    def __init__(self, name, func, description, capabilities, input_schema):
        self.name, self.func, self.description = name, func, description
        self.capabilities, self.input_schema = capabilities, input_schema


class McpSandbox:
    """Sandboxed tool execution for agents: deny by default, each tool declares what it
    needs. `workspace`: the directory tools can read (writes need fs_writable);
    `timeout`: each call's default limit in seconds."""

    def __init__(self, *, workspace: str = "/tmp/sandlock", timeout: float | None = 30.0):
        self._workspace = workspace
        self._timeout = timeout
        self._local_tools: dict[str, _LocalTool] = {}
        self._local_policies: dict = {}
        self._local_entrypoints: dict[str, _Entrypoint] = {}
        self._mcp_tools: dict[str, Any] = {}
        self._mcp_tool_session: dict[str, Any] = {}
        self._mcp_policies: dict = {}

    def add_tool(self, name: str, func: Callable, *, description: str = "",
                 capabilities: dict[str, Any] | None = None,
                 input_schema: dict[str, Any] | None = None) -> None:
        """Register a top-level function of an import-safe module as a tool. Its module's
        directory is readable to its calls; `capabilities` are Sandbox fields
        (policy_for_tool); a parameter named `workspace` receives the workspace."""
        entry = _resolve_entrypoint(name, func)
        policy = policy_for_tool(workspace=self._workspace, capabilities=capabilities,
                                 extra_readable=[entry.syspath])
        self._local_tools[name] = _LocalTool(name, func, description, dict(capabilities or {}),
                                             input_schema or {"type": "object",
                                                              "properties": {}})
        self._local_entrypoints[name] = entry
        self._local_policies[name] = policy

    async def add_mcp_session(self, session: Any) -> None:
        """Add the tools of an MCP server (a ClientSession). Their calls are forwarded to
        it (not confined here: see the module's note); `sandlock:*` keys of a tool's
        annotations or _meta are read as its declared capabilities."""
        result = await session.list_tools()
        for tool in getattr(result, "tools", result):
            self._mcp_tools[tool.name] = tool
            self._mcp_tool_session[tool.name] = session
            self._mcp_policies[tool.name] = policy_for_tool(
                workspace=self._workspace, capabilities=capabilities_from_mcp_tool(tool))

    @property
    def tools(self) -> dict[str, Any]:
        return {**self._local_tools, **self._mcp_tools}

    def tool_definitions_openai(self) -> list[dict[str, Any]]:
        """The tools in OpenAI's function-calling format."""
        out = [{"type": "function", "function": {"name": n, "description": t.description,
                                                  "parameters": t.input_schema}}
               for n, t in self._local_tools.items()]
        for name, tool in self._mcp_tools.items():
            fn: dict[str, Any] = {"name": name}
            if getattr(tool, "description", None):
                fn["description"] = tool.description
            schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)
            if schema is not None:
                fn["parameters"] = schema
            out.append({"type": "function", "function": fn})
        return out

    def get_policy(self, tool_name: str):
        """The Sandbox a tool's calls run in (for an MCP server's tool: its declared one)."""
        if tool_name in self._local_policies:
            return self._local_policies[tool_name]
        if tool_name in self._mcp_policies:
            return self._mcp_policies[tool_name]
        raise KeyError(f"Unknown tool: {tool_name!r}")

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None, *,
                        timeout: float | None = None) -> str:
        """Call a tool: a local one in a fresh sandbox, an MCP server's one on its server."""
        args = dict(arguments or {})
        limit = timeout if timeout is not None else self._timeout
        limit = MAX_TIMEOUT if limit is None else min(float(limit), MAX_TIMEOUT)
        if name in self._local_tools:
            import asyncio
            return await asyncio.get_running_loop().run_in_executor(
                None, self._call_local, name, args, limit)
        if name in self._mcp_tools:
            result = await self._mcp_tool_session[name].call_tool(name, args)
            content = getattr(result, "content", None)
            if content:
                return "\n".join(item.text for item in content if hasattr(item, "text"))
            return str(result)
        raise KeyError(f"Unknown tool: {name!r}")

    def _call_local(self, name: str, args: dict, timeout: float) -> str:
        from ..sandbox import StdioMode
        from . import denials, runner
        entry = self._local_entrypoints[name]
        try:
            spec = json.dumps({"module": entry.module, "qualname": entry.qualname,
                               "syspath": entry.syspath, "workspace": self._workspace,
                               "args": args}).encode()
        except (TypeError, ValueError) as e:
            raise ToolError(f"Sandboxed tool {name!r}: arguments are not JSON: {e}") from None
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")) as f:
            worker = f.read()
        proc = self._local_policies[name].popen(
            [sys.executable, "-I", "-c", worker], stdin=StdioMode.PIPED,
            stdout=StdioMode.PIPED, stderr=StdioMode.PIPED)
        result, out, err, _, timed_out = runner.finish(proc, spec, timeout)
        found = denials.collect([], result.denials, name, "capabilities")
        stderr = err.decode(errors="replace")
        if timed_out:
            raise ToolError(f"Sandboxed tool {name!r} timed out after {timeout:g}s",
                            result.exit_code, stderr, True, found)
        if not result.success:
            raise ToolError(f"Sandboxed tool {name!r} failed (exit {result.exit_code}): "
                            f"{stderr[-4000:]}", result.exit_code, stderr, False, found)
        try:
            value = json.loads(out)["result"]
        except (ValueError, KeyError, TypeError):
            raise ToolError(f"Sandboxed tool {name!r} returned no result: "
                            f"{stderr[-4000:]}", result.exit_code, stderr, False, found) \
                from None
        return value if isinstance(value, str) else json.dumps(value)
