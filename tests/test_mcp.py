"""MCP: `sandlock mcp` (tools run per call in sandboxes), `sandlock mcp-wrap` (a stdio MCP
server confined) and McpSandbox, driven by the official SDK's own client against real
processes: the server as a subprocess (stdio, and streamable HTTP once), a real HTTP
server on loopback, a small MCP server written with the SDK. Each denial test shows the
forbidden effect did not happen, next to an allowed one that did."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

mcp = pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402

from sandlock import PolicyError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_PATH = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": ENV_PATH}


# -- fixtures: a web server, a workspace, a policy, servers driven through a portal ------

class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.hits.append(self.path)
        self.server.auth[self.path] = self.headers.get("Authorization")
        body = b"allowed body" if self.path.startswith("/allowed/") else b"secret body"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def web():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.hits, srv.auth = [], {}
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """ws/ (the workspace: hello.txt, private/key, link -> ../outside/secret.txt) and a
    sibling outside/ no tool is granted."""
    base = tmp_path_factory.mktemp("mcp")
    ws, outside = base / "ws", base / "outside"
    (ws / "private").mkdir(parents=True)
    outside.mkdir()
    (ws / "hello.txt").write_text("hello\n")
    (ws / "private" / "key").write_text("PRIVATE-KEY-TEXT\n")
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    os.symlink("../outside/secret.txt", ws / "link")
    return base


@pytest.fixture(scope="module")
def policy(tree, web):
    port = web.server_address[1]
    path = tree / "mcp.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        name: mcptest
        audit: {{file: {tree / 'audit.jsonl'}}}
        tools:
          read_file:
            filesystem: {{deny: [{tree / 'ws' / 'private'}]}}
          web_fetch:
            network: {{allow: ["127.0.0.1:{port}"]}}
            credentials: {{TOK: "env:MCP_TEST_TOKEN"}}
            http:
              allow: ["GET 127.0.0.1:{port}/allowed/*"]
              auth: ["GET 127.0.0.1/allowed/* bearer TOK allow_cleartext"]
        """))
    return path


class Client:
    """A ClientSession on a background event loop, called from the (sync) tests."""

    def __init__(self, portal, session):
        self.portal, self.session = portal, session

    def call(self, name, args=None):
        return self.portal.call(self.session.call_tool, name, args or {})

    def tools(self):
        return self.portal.call(self.session.list_tools).tools


TOKEN = "tok-" + os.urandom(8).hex()


@contextlib.asynccontextmanager
async def _stdio_session(args):
    params = StdioServerParameters(command=sys.executable, args=["-m", "sandlock", *args],
                                   env={"PYTHONPATH": ENV_PATH, "MCP_TEST_TOKEN": TOKEN})
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w, read_timeout_seconds=60) as s:
            await s.initialize()
            yield s


@contextlib.contextmanager
def connected(session_cm):
    from anyio.from_thread import start_blocking_portal
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(session_cm) as session:
            yield Client(portal, session)


@pytest.fixture(scope="module")
def server(tree, policy):
    with connected(_stdio_session(["mcp", "--policy", str(policy),
                                   "--workspace", str(tree / "ws")])) as client:
        yield client


def _data(result) -> dict:
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


# -- sandlock mcp over stdio ------------------------------------------------------------

def test_lists_its_tools(server):
    tools = {t.name: t for t in server.tools()}
    assert set(tools) == {"shell", "python", "read_file", "write_file", "list_files",
                          "web_fetch"}
    assert tools["shell"].input_schema["required"] == ["command"]


def test_shell_runs_in_the_workspace_and_its_network_denial_comes_back(server, tree, web):
    port = web.server_address[1]
    r = server.call("shell", {"command": "echo made > made.txt && cat hello.txt"})
    assert not r.is_error and _data(r)["stdout"] == "hello\n"
    assert (tree / "ws" / "made.txt").read_text() == "made\n"  # written in the workspace
    before = list(web.hits)
    r = server.call("python", {"code": textwrap.dedent(f"""\
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=5)
            print("connected")
        except OSError as e:
            print("refused", e.errno)
        """)})
    data = _data(r)
    assert "refused 13" in data["stdout"] and "connected" not in data["stdout"]
    assert web.hits == before  # nothing reached the server
    (denial,) = [d for d in data["denials"] if d["kind"] == "tcp"]
    assert denial["decided_by"] == "default:deny" and f"127.0.0.1:{port}" in denial["denied"]
    assert denial["allow_with"]["key"] == "network.allow"
    assert denial["allow_with"]["add"] == f"127.0.0.1:{port}"
    assert denial["allow_with"]["tool"] == "python"
    assert denial["record"]["decision"] == "deny"  # the audit log's own record
    # a file outside the workspace: Landlock refuses it to the shell (no read grant)
    r = server.call("shell", {"command": "cat ../outside/secret.txt"})
    assert r.is_error and "OUTSIDE-SECRET" not in _data(r)["stdout"]
    assert "Permission denied" in _data(r)["stderr"]
    # ... and the refusal comes back as a denial too (explain), with the grant to add
    (denial,) = [d for d in _data(r)["denials"] if d["kind"] == "file"]
    secret = str((tree / "outside" / "secret.txt").resolve())
    assert denial["denied"] == f"read {secret}" and denial["decided_by"] == "default:fs"
    assert denial["allow_with"]["key"] == "filesystem.read"
    assert denial["allow_with"]["add"] == secret


def test_web_fetch_allowed_url_and_refused_url(server, tree, web):
    port = web.server_address[1]
    r = server.call("web_fetch", {"url": f"http://127.0.0.1:{port}/allowed/page"})
    data = _data(r)
    assert not r.is_error and data["status"] == 200 and data["text"] == "allowed body"
    assert "/allowed/page" in web.hits
    assert web.auth["/allowed/page"] == f"Bearer {TOKEN}"  # added by the filter, outside
    r = server.call("shell", {"command": "env; cat /proc/self/environ"})
    assert TOKEN not in r.content[0].text and "MCP_TEST_TOKEN" not in r.content[0].text
    r = server.call("web_fetch", {"url": f"http://127.0.0.1:{port}/secret"})
    data = _data(r)
    assert r.is_error and data["status"] == 403 and "secret body" not in data["text"]
    assert "/secret" not in web.hits  # refused by the filter, never sent
    (denial,) = data["denials"]
    assert denial["kind"] == "http" and denial["denied"] == "GET 127.0.0.1/secret"
    assert denial["reason"] == f"no rule allows GET 127.0.0.1:{port}/secret"
    assert denial["allow_with"] == {"policy": f"{tree / 'mcp.yaml'} (tools.web_fetch)",
                                    "tool": "web_fetch", "key": "http.allow",
                                    "add": f"GET 127.0.0.1:{port}/secret"}
    # ... and the same record is in the policy's audit log
    records = [json.loads(line) for line in (tree / "audit.jsonl").read_text().splitlines()]
    assert any(rec.get("path") == "/secret" and rec["decision"] == "deny"
               and rec["sandbox"] == "mcptest-web_fetch" for rec in records)
    # no network grant at all for another port: refused, returned, nothing sent
    r = server.call("web_fetch", {"url": f"http://127.0.0.1:{port + 1 if port < 65535 else 1}/"})
    assert r.is_error and _data(r)["denials"][0]["kind"] == "tcp"


def test_file_tools_stay_in_the_workspace(server, tree):
    r = server.call("read_file", {"path": "hello.txt"})
    assert not r.is_error and _data(r)["text"] == "hello\n"
    for path, why in [("../outside/secret.txt", "'..'"), ("/etc/hostname", "absolute"),
                      ("link", "resolves outside the workspace")]:
        r = server.call("read_file", {"path": path})
        data = _data(r)
        assert r.is_error and why in data["denials"][0]["reason"], data
        assert data["denials"][0]["decided_by"] == "workspace"
        assert "OUTSIDE-SECRET" not in r.content[0].text
    # in the workspace but denied by read_file's policy: Landlock refuses, returned as such
    r = server.call("read_file", {"path": "private/key"})
    data = _data(r)
    assert r.is_error and data["errno"] == "EACCES" and "PRIVATE-KEY" not in r.content[0].text
    # the tool's own report (landlock), and explain's, which names the denied path's rule
    decided = {d["decided_by"] for d in data["denials"]}
    assert "landlock" in decided and f"fs_denied:{tree / 'ws' / 'private'}" in decided, decided
    records = [json.loads(line) for line in (tree / "audit.jsonl").read_text().splitlines()]
    logged = {(rec.get("access"), rec.get("path"), rec.get("rule")) for rec in records}
    assert {("read", "link", "workspace"), ("read", "../outside/secret.txt", "workspace"),
            ("read", str(tree / "ws" / "private" / "key"), "landlock")} <= logged
    r = server.call("write_file", {"path": "sub/new.txt", "content": "new\n"})
    assert not r.is_error and (tree / "ws" / "sub" / "new.txt").read_text() == "new\n"
    r = server.call("write_file", {"path": "../escape.txt", "content": "x"})
    assert r.is_error and not (tree / "escape.txt").exists()
    names = [e["name"] for e in _data(server.call("list_files", {}))["entries"]]
    assert {"hello.txt", "sub", "link"} <= set(names)


def test_bad_calls_are_tool_errors_and_timeouts_are_bounded(server):
    for name, args, msg in [("shell", {}, "missing argument 'command'"),
                            ("shell", {"command": 1}, "command: expected a string"),
                            ("shell", {"command": "true", "x": 1}, "unknown argument 'x'"),
                            ("nope", {}, "unknown tool 'nope'"),
                            ("web_fetch", {"url": "file:///etc/passwd"}, "url: an http")]:
        r = server.call(name, args)
        assert r.is_error and msg in r.content[0].text, (name, r.content[0].text)
    start = time.monotonic()
    r = server.call("python", {"code": "while True: pass", "timeout": 1})
    assert r.is_error and _data(r)["timed_out"] and time.monotonic() - start < 8
    assert not server.call("shell", {"command": "true"}).is_error  # the server lives on


# -- policies -------------------------------------------------------------------------

def test_policy_file_errors_name_file_line_and_key(tmp_path):
    from sandlock.mcp import toolpolicy
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ntools:\n  shel: {}\n  web_fetch:\n    network: {alow: [x]}\n"
                   "    workspace: {workdir: .}\n  shell:\n    process: {clean_env: false}\n"
                   "    workspace_access: all\n")
    with pytest.raises(PolicyError) as e:
        toolpolicy.load(str(bad), None)
    lines = str(e.value).splitlines()
    assert f"{bad}:3: tools.shel: unknown tool" in lines[0]
    assert any(f"{bad}:5: tools.web_fetch.network.alow: unknown key" in x for x in lines)
    assert any(f"{bad}:6: tools.web_fetch.workspace: not in a tool's policy" in x
               for x in lines)
    assert any(f"{bad}:8: tools.shell.process.clean_env: tools always start" in x
               for x in lines)
    assert any(f"{bad}:9: tools.shell.workspace_access: expected one of none, read, write"
               in x for x in lines)
    d = tmp_path / "dir"
    d.mkdir()
    (d / "web_fetch.yaml").write_text("version: 1\nnetwork: {allow: ['example.org:443']}\n")
    got = toolpolicy.load(None, str(d))
    assert got["web_fetch"].fields["net_allow"] == ["example.org:443"]
    assert got["shell"].fields == {} and got["shell"].access == "write"
    (d / "shel.yaml").write_text("version: 1\n")
    with pytest.raises(PolicyError, match="shel.yaml: not a tool's policy"):
        toolpolicy.load(None, str(d))


def test_shipped_policy_loads(tmp_path):
    from sandlock.mcp import toolpolicy
    got = toolpolicy.load(os.path.join(ROOT, "policies", "mcp.yaml"), None)
    assert got["web_fetch"].fields["net_allow"] and got["web_fetch"].access == "none"


def test_cli_refuses_before_anything_runs(tmp_path):
    for args, msg in [(["--transport", "http", "--host", "0.0.0.0"], "needs --allow-remote"),
                      (["--workspace", "/"], "is /"),
                      (["--policy", str(tmp_path / "none.yaml")], "No such file")]:
        r = subprocess.run([sys.executable, "-m", "sandlock", "mcp", *args], env=_env(),
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert r.returncode == 125 and msg in r.stderr, (args, r.stderr)


# -- streamable HTTP ---------------------------------------------------------------------

def test_streamable_http_on_loopback(tree):
    from mcp.client.streamable_http import streamable_http_client
    proc = subprocess.Popen([sys.executable, "-m", "sandlock", "mcp", "--transport", "http",
                             "--port", "0", "--workspace", str(tree / "ws")], env=_env(),
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()  # "sandlock: listening on http://127.0.0.1:N/mcp"
        assert "listening on http://127.0.0.1:" in line, line
        url = line.split("listening on ", 1)[1].strip()

        @contextlib.asynccontextmanager
        async def session():
            async with streamable_http_client(url) as (r, w):
                async with ClientSession(r, w, read_timeout_seconds=60) as s:
                    await s.initialize()
                    yield s
        with connected(session()) as client:
            assert "shell" in {t.name for t in client.tools()}
            r = client.call("shell", {"command": "cat hello.txt"})
            assert not r.is_error and _data(r)["stdout"] == "hello\n"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stderr.close()


# -- copy-on-write workspace -------------------------------------------------------------

def test_cow_workspace_changes_commit_discard(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("v1\n")
    args = ["mcp", "--workspace", str(ws), "--cow", "--storage", str(tmp_path / "store")]
    with connected(_stdio_session(args)) as client:
        assert {"changes", "commit", "discard"} <= {t.name for t in client.tools()}
        client.call("shell", {"command": "echo v2 > keep.txt"})
        client.call("write_file", {"path": "new.txt", "content": "new\n"})
        assert (ws / "keep.txt").read_text() == "v1\n" and not (ws / "new.txt").exists()
        r = client.call("read_file", {"path": "keep.txt"})  # the calls see their changes
        assert _data(r)["text"] == "v2\n"
        changes = {c["path"]: c["action"] for c in _data(client.call("changes"))["changes"]}
        assert changes == {"keep.txt": "modified", "new.txt": "added"}
        assert not _data(client.call("discard"))["denials"]
        assert _data(client.call("changes"))["changes"] == []
        assert _data(client.call("read_file", {"path": "keep.txt"}))["text"] == "v1\n"
        client.call("shell", {"command": "echo v3 > keep.txt && rm -f gone.txt && "
                              "mkdir -p d && echo x > d/x.txt"})
        r = client.call("commit")
        assert not r.is_error, r.content[0].text
        assert (ws / "keep.txt").read_text() == "v3\n" and (ws / "d" / "x.txt").exists()
        # a conflict: the workspace changed under the staging copy; nothing is applied
        client.call("shell", {"command": "echo v4 > keep.txt && echo y > other.txt"})
        (ws / "keep.txt").write_text("edited by the user\n")
        r = client.call("commit")
        assert r.is_error and _data(r)["conflicts"][0]["path"] == "keep.txt"
        assert (ws / "keep.txt").read_text() == "edited by the user\n"
        assert not (ws / "other.txt").exists()
    assert not os.listdir(tmp_path / "store")  # the staging copy is gone with the server


# -- mcp-wrap ------------------------------------------------------------------------------

WRAPPED = """\
from mcp.server.mcpserver import MCPServer

server = MCPServer("files")


@server.tool()
def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return f"ERR {e.errno} {e.strerror}"


server.run()
"""


def test_mcp_wrap_confines_a_third_party_server(tmp_path):
    allowed, forbidden = tmp_path / "allowed", tmp_path / "forbidden"
    allowed.mkdir()
    forbidden.mkdir()
    (allowed / "a.txt").write_text("ALLOWED-TEXT")
    (forbidden / "f.txt").write_text("FORBIDDEN-TEXT")
    (tmp_path / "srv").mkdir()
    script = tmp_path / "srv" / "server.py"
    script.write_text(WRAPPED)
    pol = tmp_path / "wrap.yaml"
    pol.write_text(f"version: 1\nfilesystem: {{read: [{tmp_path / 'srv'}, {allowed}]}}\n")
    args = ["mcp-wrap", "--policy", str(pol), "--", sys.executable, str(script)]
    with connected(_stdio_session(args)) as client:
        assert [t.name for t in client.tools()] == ["read"]
        r = client.call("read", {"path": str(allowed / "a.txt")})
        assert not r.is_error and r.content[0].text == "ALLOWED-TEXT"
        r = client.call("read", {"path": str(forbidden / "f.txt")})
        assert r.content[0].text == "ERR 13 Permission denied"
    # unchanged bytes through stdin/stdout, and the exit status of the server
    r = subprocess.run([sys.executable, "-m", "sandlock", "mcp-wrap", "--", "sh", "-c",
                        "cat; printf 'x\\0y'; exit 7"], input=b'{"jsonrpc":"2.0"}\n',
                       env=_env(), capture_output=True, timeout=30)
    assert r.returncode == 7 and r.stdout == b'{"jsonrpc":"2.0"}\nx\0y', r.stderr


# -- McpSandbox (the Python API) --------------------------------------------------------

TOOLS_MODULE = """\
import os


def read_text(path, *, workspace):
    with open(os.path.join(workspace, path)) as f:
        return f.read()


def write_text(path, content, *, workspace):
    print("noise on the tool's stdout")
    with open(os.path.join(workspace, path), "w") as f:
        f.write(content)
    return {"written": len(content)}


def connect(port):
    import socket
    socket.create_connection(("127.0.0.1", port), timeout=5)
    return "connected"
"""


def test_mcp_sandbox_runs_tools_with_declared_capabilities(tmp_path, web):
    import asyncio
    import importlib.util
    from sandlock.mcp import (McpSandbox, ToolError, capabilities_from_mcp_tool,
                              policy_for_tool)
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "mcptools_t.py").write_text(TOOLS_MODULE)
    spec = importlib.util.spec_from_file_location("mcptools_t", tmp_path / "mod" /
                                                  "mcptools_t.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["mcptools_t"] = module
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "in.txt").write_text("input")
    box = McpSandbox(workspace=str(ws), timeout=20)
    box.add_tool("read", module.read_text)
    box.add_tool("write_ro", module.write_text)
    box.add_tool("write", module.write_text, capabilities={"fs_writable": [str(ws)]})
    box.add_tool("connect", module.connect)

    async def calls():
        assert await box.call_tool("read", {"path": "in.txt"}) == "input"
        with pytest.raises(ToolError, match="Permission denied"):
            await box.call_tool("write_ro", {"path": "out.txt", "content": "x"})
        assert not (ws / "out.txt").exists()
        assert json.loads(await box.call_tool("write", {"path": "out.txt",
                                                        "content": "xy"})) == {"written": 2}
        assert (ws / "out.txt").read_text() == "xy"
        before = list(web.hits)
        with pytest.raises(ToolError) as e:
            await box.call_tool("connect", {"port": web.server_address[1]})
        assert "PermissionError" in e.value.stderr and web.hits == before
        (denial,) = e.value.denials
        assert denial["denied"].startswith("connect (pid ")
        assert denial["reason"] == f"no rule allows tcp 127.0.0.1:{web.server_address[1]}"
    asyncio.run(calls())
    assert box.get_policy("read").clean_env is True
    assert [d["name"] for d in [f["function"] for f in box.tool_definitions_openai()]] == \
        ["read", "write_ro", "write", "connect"]
    with pytest.raises(PolicyError, match="unknown capability 'fs_writeable'"):
        policy_for_tool(workspace=str(ws), capabilities={"fs_writeable": [str(ws)]})
    with pytest.raises(PolicyError, match="clean_env is always on"):
        policy_for_tool(workspace=str(ws), capabilities={"clean_env": False})
    import mcp_types
    tool = mcp_types.Tool(name="t", input_schema={"type": "object"},
                          _meta={"sandlock:net_allow": ["api.test:443"],
                                 "sandlock:disable": ["signal_scope"], "other": 1})
    assert capabilities_from_mcp_tool(tool) == {"net_allow": ["api.test:443"]}
