"""Sandlock and MCP: tools that run sandboxed, per call, deny by default.

- `McpSandbox`, `policy_for_tool`, `capabilities_from_mcp_tool` (upstream Sandlock's API):
  Python tool functions, each call in a fresh sandbox derived from declared capabilities.
  Importable without the `mcp` SDK.
- `sandlock mcp` (cli.py, server.py, tools.py): an MCP server whose built-in tools (shell,
  python, read_file, write_file, list_files, web_fetch; changes/commit/discard with --cow)
  run each call in a fresh sandbox under a per-tool YAML policy (toolpolicy.py), denials
  returned as structured content (denials.py). Needs `pip install 'sandlock[mcp]'`.
- `sandlock mcp-wrap` (wrap.py): a third-party stdio MCP server confined by a policy.

See docs/mcp.md.
"""

from ._policy import capabilities_from_mcp_tool, policy_for_tool
from ._sandbox import McpSandbox, ToolError

__all__ = ["McpSandbox", "ToolError", "policy_for_tool", "capabilities_from_mcp_tool"]
