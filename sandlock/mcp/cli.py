"""`sandlock mcp` (an MCP server whose tools run sandboxed) and `sandlock mcp-wrap` (a
third-party stdio MCP server, confined). Exit status: 0 when the server ended normally
(stdin closed, Ctrl-C, SIGTERM), 125 when it could not start (a bad flag or policy, no
`mcp` SDK), 2 for a usage error; mcp-wrap returns the wrapped server's status."""

from __future__ import annotations

import argparse
import os
import signal

EXIT_SANDLOCK = 125


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sandlock mcp",
        description="An MCP server whose tools (shell, python, read_file, write_file, "
                    "list_files, web_fetch) each run in a fresh sandbox per call, under the "
                    "tool's policy. Denials come back to the client as structured content.",
        epilog="example: sandlock mcp --policy policies/mcp.yaml --workspace ~/project --cow")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--policy", metavar="FILE.yaml",
                       help="one policy file: its sections apply to every tool, and its "
                            "tools: mapping adds a section per tool")
    group.add_argument("--policy-dir", metavar="DIR",
                       help="a directory of per-tool policy files (shell.yaml, "
                            "web_fetch.yaml, ...)")
    p.add_argument("--workspace", metavar="DIR",
                   help="the directory the tools work in (default: the current directory; "
                        "never / or your home)")
    p.add_argument("--cow", action="store_true",
                   help="copy-on-write: calls change a staging copy; the tools changes, "
                        "commit and discard list, apply or drop what they changed")
    p.add_argument("--storage", metavar="DIR",
                   help="where --cow keeps its staging copy (default "
                        "~/.cache/sandlock/mcp)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", default=60.0,
                   help="a call's time limit unless its policy sets process.timeout "
                        "(default 60)")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                   help="stdio (default), or streamable HTTP at http://HOST:PORT/mcp")
    p.add_argument("--host", default="127.0.0.1",
                   help="HTTP address (default 127.0.0.1; another than loopback needs "
                        "--allow-remote)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000; 0: any)")
    p.add_argument("--allow-remote", action="store_true",
                   help="let --host be an address other hosts reach (the server has no "
                        "authentication: anyone who reaches it runs the tools)")
    return p


def main(argv: list[str]) -> int:
    from ..cli import _say
    if argv[:1] == ["mcp-wrap"]:
        from .wrap import main as wrap_main
        return wrap_main(argv[1:])
    a = _parser().parse_args(argv[1:])
    from ..errors import SandlockError
    try:
        return _serve(a)
    except SandlockError as e:
        _say(f"error: {e}")
        return EXIT_SANDLOCK


def _workspace(a) -> str:
    from ..errors import PolicyError
    workspace = os.path.realpath(os.path.expanduser(a.workspace or os.getcwd()))
    flag = f"--workspace {a.workspace}" if a.workspace else \
        f"the current directory ({workspace})"
    if not os.path.isdir(workspace):
        raise PolicyError(f"{flag}: not a directory")
    if workspace in ("/", os.path.realpath(os.path.expanduser("~"))):
        raise PolicyError(f"{flag}: is {'/' if workspace == '/' else 'your home'}; the tools' "
                          f"workspace must be a project directory (pass --workspace DIR)")
    return workspace


def _check_flags(a) -> None:
    from ..errors import PolicyError
    from .server import is_loopback
    from .toolpolicy import MAX_TIMEOUT
    if not 0 < a.timeout <= MAX_TIMEOUT:
        raise PolicyError(f"--timeout {a.timeout:g}: expected 0 < SECONDS <= {MAX_TIMEOUT:g}")
    if a.transport == "http":
        if not 0 <= a.port <= 65535:
            raise PolicyError(f"--port {a.port}: expected 0-65535")
        if not is_loopback(a.host) and not a.allow_remote:
            raise PolicyError(f"--host {a.host}: not a loopback address; the server has no "
                              f"authentication, so binding it where others reach it needs "
                              f"--allow-remote")
    elif a.host != "127.0.0.1" or a.port != 8000 or a.allow_remote:
        raise PolicyError("--host/--port/--allow-remote: only with --transport http")
    if a.storage and not a.cow:
        raise PolicyError("--storage: only with --cow")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _serve(a) -> int:
    from ..cli import _say
    from . import runner, server, toolpolicy
    from .tools import ToolBox, interpreter
    _check_flags(a)
    workspace = _workspace(a)
    policies = toolpolicy.load(a.policy, a.policy_dir, a.timeout)
    from ..errors import PolicyError, SandlockError
    from ..sandbox import Sandbox
    for tool, policy in policies.items():  # every tool's policy builds, or nothing starts
        try:  # (checked, not started: no secret is read here)
            Sandbox(**policy.sandbox_fields(workspace))
        except PolicyError as e:
            raise PolicyError(f"{tool}'s policy ({policy.source}): {e}") from None
    try:
        import mcp.server.lowlevel.server  # noqa: F401  (the optional extra)
    except ImportError:
        raise SandlockError("sandlock mcp needs the MCP SDK: pip install 'sandlock[mcp]' "
                            "(mcp>=2)") from None
    import anyio
    auditor = runner.Auditor()
    staging = sock = None
    try:
        for tool, policy in policies.items():  # opened now: a bad path stops the start
            path = policy.fields.get("audit_log")
            if path:
                try:
                    auditor.open(path, bool(policy.fields.get("audit_allowed")))
                except OSError as e:
                    raise PolicyError(f"{tool}'s policy ({policy.source}): audit.file: {path}: "
                                      f"{e.strerror}") from None
        if a.cow:
            from .. import cow
            from .staging import Staging
            storage = a.storage or os.path.join(os.path.dirname(cow.default_storage()), "mcp")
            staging = Staging(workspace, os.path.expanduser(storage), auditor, interpreter())
            staging.make()
        toolbox = ToolBox(workspace, policies, auditor, staging)
        mcp_server = server.build(toolbox)
        if a.transport == "http":
            try:
                sock = server.listen(a.host, a.port)
            except OSError as e:
                raise SandlockError(f"--host {a.host} --port {a.port}: {e.strerror}") from None
            host = f"[{a.host}]" if ":" in a.host and not a.host.startswith("[") else a.host
            _say(f"listening on http://{host}:{sock.getsockname()[1]}/mcp")
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            if sock is not None:
                anyio.run(server.serve_http, mcp_server, sock, a.host)
            else:
                anyio.run(server.serve_stdio, mcp_server)
        except KeyboardInterrupt:
            pass
        except BaseExceptionGroup as group:  # an interrupt inside a task group
            rest = group.subgroup(lambda e: not isinstance(e, KeyboardInterrupt))
            if rest is not None:
                raise rest from None
    finally:
        if sock is not None:
            sock.close()
        runner.kill_all()  # calls still running end now, not at their timeout
        if staging is not None:
            with staging.lock:  # no commit is cut short (bounded by its timeout)
                staging.close()
        auditor.close()
    return 0
