"""`sandlock mcp-wrap [--policy P.yaml] [run options] -- SERVER COMMAND...`: a third-party
stdio MCP server confined by a policy.

The server is started exactly as `sandlock run` starts a program (the same policy file,
options, system and toolchain grants, user-file protection and exit statuses: the
server's own, 124 on timeout, 125 when sandlock refused to start it), with its stdin,
stdout and stderr being this process's: the client's protocol reaches the server and its
answers reach the client byte for byte, with nothing of sandlock's on stdout (sandlock's
own notes go to stderr, which an MCP client treats as the server's log). Two differences
from `run`, both fail-closed: the environment is cleaned (an untrusted server gets PATH,
HOME, TERM, LANG and the like, plus what the policy's `process.env` or `--env` name; an
API key it needs belongs in a credential rule, which keeps the key out of the sandbox),
and options that would write to stdout or take the terminal (`--dry-run`, `-i`) are
refused.
"""

from __future__ import annotations

import sys

USAGE = """usage: sandlock mcp-wrap [--policy FILE.yaml] [run options] -- SERVER COMMAND...

Run a stdio MCP server confined by a policy: the protocol passes through unchanged on
stdin/stdout, stderr is the server's, its exit status is returned. Every option of
`sandlock run` applies (sandlock run --help); the environment is always cleaned (name
variables with --env or the policy's process.env; secrets belong in credentials).

example (an MCP client's server command):
  sandlock mcp-wrap --policy policies/mcp-wrap.yaml -- python3 -m some_mcp_server
"""


def main(argv: list[str]) -> int:
    from ..cli import EXIT_SANDLOCK, _run, _say
    from ..cli_parser import build
    head = argv[:argv.index("--")] if "--" in argv else argv
    if {"-h", "--help"} & set(head):
        sys.stderr.write(USAGE)
        return 0
    if "--" not in argv:
        _say("error: mcp-wrap: no server command (usage: sandlock mcp-wrap [--policy P.yaml] "
             "-- COMMAND...)")
        return EXIT_SANDLOCK
    parser = build("run")
    args, extras = parser.parse_known_args(["run", *argv])
    if extras:
        _say(f"error: mcp-wrap: unrecognized arguments: {' '.join(extras)}")
        return EXIT_SANDLOCK
    for flag, on in (("--dry-run", args.dry_run), ("-i/--interactive", args.interactive)):
        if on:
            _say(f"error: mcp-wrap: {flag} is not for an MCP server (stdout and stdin carry "
                 f"the protocol)")
            return EXIT_SANDLOCK
    args.clean_env = True
    _audit_dir(args)
    return _run(args)


def _audit_dir(args) -> None:
    """The directory of the audit log is made (0700) if missing, as `net-run` does for its
    own: a policy naming ~/.local/state/sandlock/x.jsonl works on a fresh machine."""
    import os
    from ..errors import SandlockError
    path = args.audit
    if path is None and args.policy:
        from ..policy_file import load_policy
        try:
            path = load_policy(args.policy).fields.get("audit_log")
        except SandlockError:
            return  # reported, with everything else, when run() reads the policy
    if path:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(os.path.expanduser(path))),
                        mode=0o700, exist_ok=True)
        except OSError:
            pass  # run() says why the log cannot be opened
