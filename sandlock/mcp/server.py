"""The MCP server of `sandlock mcp` (the official `mcp` SDK, 2.x, low-level Server): lists
the tools of a ToolBox and runs each call on a worker thread, a few at a time. stdio, or
streamable HTTP on a loopback address (DNS-rebinding protection on: Host and Origin must
name the loopback) unless --allow-remote says otherwise."""

from __future__ import annotations

import ipaddress

from .tools import Reply, ToolBox

CONCURRENT_CALLS = 4


def build(toolbox: ToolBox, name: str = "sandlock"):
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel.server import Server

    limiter = anyio.CapacityLimiter(CONCURRENT_CALLS)
    tools = [types.Tool(name=n, description=d, input_schema=s)
             for n, d, s in toolbox.definitions()]

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx, params):
        # abandon_on_cancel: a server shutting down does not wait for calls in progress
        # (their sandboxes are then killed: runner.kill_all).
        reply: Reply = await anyio.to_thread.run_sync(
            toolbox.call, params.name, params.arguments, limiter=limiter,
            abandon_on_cancel=True)
        return types.CallToolResult(content=[types.TextContent(text=reply.text)],
                                    structured_content=reply.data, is_error=reply.is_error)

    where = toolbox.workspace + (" (copy-on-write: changes, commit, discard)"
                                 if toolbox.staging is not None else "")
    return Server(name, version=_version(),
                  instructions=(f"Each tool call runs in a fresh sandlock sandbox under that "
                                f"tool's policy. Workspace: {where}. Denials come back as "
                                f"structured content (denials: what, why, how to allow)."),
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _version() -> str:
    from .. import __version__
    return __version__


async def serve_stdio(server) -> None:
    from mcp.server.stdio import stdio_server
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int):
    """The HTTP socket, bound now: a port in use is an error before anything serves, and
    with port 0 the port chosen is known."""
    import socket
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_http(server, sock, host: str) -> None:
    """Streamable HTTP at http://HOST:PORT/mcp on the bound socket `sock`. On a loopback
    address the SDK's DNS rebinding protection is on (a web page cannot reach it through
    a name of its own)."""
    import uvicorn
    app = server.streamable_http_app(host=host if is_loopback(host) else "0.0.0.0")
    config = uvicorn.Config(app, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=5)
    await uvicorn.Server(config).serve(sockets=[sock])
