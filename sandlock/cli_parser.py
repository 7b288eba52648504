"""The `sandlock` command line's grammar: subcommands, options, help with examples, and
the errors a mistyped command gets (the usage of the subcommand in use, and the closest
valid option).

Built per start for the subcommand in use only (argparse set-up is a noticeable part of
every start); `sandlock completion` walks the whole tree.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__

EXAMPLES = {
    "run": """examples:
  sandlock run -- ls /usr                      system directories read-only, nothing else
  sandlock run -w . -- make                    the working directory writable
  sandlock run -r ~/data -t 60 -- python3 analyse.py
  sandlock run --allow example.com:443 -- curl https://example.com   that host only
  sandlock run --workdir . --dry-run -- sh -c 'sed -i s/a/b/ *.txt'   see, apply nothing
  sandlock run -v -- python3 app.py            print what the toolchain grants added
""",
    "net-run": """examples:
  sandlock net-run --allow api.github.com:443 -- gh repo list
  sandlock net-run --http-allow 'GET api.example.com/v1/*' -- python3 fetch.py
  sandlock net-run --policy policies/github-readonly.yaml -- ./agent-tool
  sandlock audit ~/.local/state/sandlock/net-run-audit.jsonl    what was denied
""",
    "pipe": """examples:
  sandlock pipe -r data -- cat data/in.csv ::: --allow :443 -- python3 upload.py
  sandlock pipe --pipefail -- false ::: -- cat      exit status 1, not cat's 0
""",
    "policy": """examples:
  sandlock policy check policies/github-readonly.yaml
  sandlock policy check my.yaml -- python3     also what running python3 would be granted
""",
    "audit": """examples:
  sandlock audit audit.jsonl             one line per denial, then the totals
  sandlock audit --summary audit.jsonl   the totals only
""",
    "completion": """examples:
  sandlock completion bash > ~/.local/share/bash-completion/completions/sandlock
  sandlock completion zsh > "${fpath[1]}/_sandlock"
  sandlock completion fish > ~/.config/fish/completions/sandlock.fish
""",
}


class Parser(argparse.ArgumentParser):
    """An unknown or mistyped option names the closest valid one, under the usage of the
    subcommand in use; the exit status is 125 (sandlock itself refused: nothing ran)."""

    def error(self, message: str):
        hint = ""
        if message.startswith("unrecognized arguments:"):
            words = message.split(":", 1)[1].split()
            flags = [w.split("=", 1)[0] for w in words if w.startswith("-")]
            options = [o for a in self._actions for o in a.option_strings]
            for flag in flags:
                import difflib
                close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
                if close:
                    hint += f"\n{self.prog}: {flag}: did you mean {close[0]}?"
        self.print_usage(sys.stderr)
        self.exit(125, f"{self.prog}: error: {message}{hint}\n")


def add_run_policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", metavar="FILE.yaml",
                   help="a YAML policy (version 1); the flags below add to it")
    p.add_argument("-p", "--profile", metavar="NAME",
                   help="a named profile (~/.config/sandlock/profiles/NAME.toml or .yaml); "
                        "the flags below add to it; its [program] runs when no command is "
                        "given")
    p.add_argument("-r", "--fs-read", action="append", default=[], metavar="PATH",
                   help="grant read (and execute) access beneath PATH")
    p.add_argument("-w", "--fs-write", action="append", default=[], metavar="PATH",
                   help="grant read/write access beneath PATH")
    p.add_argument("--fs-deny", action="append", default=[], metavar="PATH",
                   help="keep PATH inaccessible even beneath a granted directory")
    p.add_argument("--no-system", action="store_true",
                   help="do not grant the default read-only system directories "
                        "(/usr /bin /lib /etc /opt /proc ...) and standard devices")
    p.add_argument("--strict", action="store_true",
                   help="system directories only: do not grant the command's own "
                        "toolchain (pyenv, nvm, uv, ~/.local/bin ...) and ~/.gitconfig")
    p.add_argument("-i", "--interactive", action="store_true",
                   help="run on this terminal, in its foreground (job control, Ctrl-C, "
                        "window size); the default when stdin is a terminal")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print every path granted beyond the flags, and why, and what of "
                        "the user's files is protected")
    p.add_argument("--net-allow", "--allow", action="append", default=[], metavar="SPEC",
                   help="allow a destination: ':443', 'api.example.com:443', "
                        "'*.example.com', '10.0.0.0/8:5432', 'udp://1.1.1.1:53'")
    p.add_argument("--net-deny", "--deny", action="append", default=[], metavar="SPEC",
                   help="deny an address or CIDR even if an allow rule matches")
    p.add_argument("--net-allow-unix", action="append", default=[], metavar="PATH",
                   help="allow connecting to unix sockets beneath PATH ('*' for any)")
    p.add_argument("--net-allow-private", action="store_true",
                   help="let host rules reach private/loopback addresses they resolve to")
    p.add_argument("--dns-server", action="append", default=[], metavar="ADDR[:PORT]",
                   help="resolver for host rules (default: the system's)")
    p.add_argument("--http-allow", action="append", default=[], metavar="RULE",
                   help="allow HTTP requests: 'GET api.github.com/repos/*' (with a rule, "
                        "connects to HTTP ports go through the HTTP filter)")
    p.add_argument("--http-deny", action="append", default=[], metavar="RULE",
                   help="deny HTTP requests matching RULE (checked first)")
    p.add_argument("--http-port", action="append", default=[], type=int, metavar="PORT",
                   help="TCP ports the HTTP filter sees (default 80 and 443)")
    p.add_argument("--http-raw", action="append", default=[], metavar="SPEC",
                   help="relay TCP to this endpoint unfiltered although HTTP rules name its "
                        "host (e.g. 'db.internal:5432'); listed by `policy check`")
    p.add_argument("--http-upgrade", action="append", default=[], metavar="PROTOCOL",
                   help="allow a protocol switch through the HTTP filter: websocket, h2c, h2 "
                        "(prior knowledge) or connect; what follows is not inspected")
    p.add_argument("--http-ca", metavar="PEM",
                   help="intercept HTTPS with this CA (certificate, and key unless --http-key)")
    p.add_argument("--http-key", metavar="PEM", help="the private key of --http-ca")
    p.add_argument("--http-inject-ca", action="store_true",
                   help="intercept HTTPS (with the default CA unless --http-ca) and make "
                        "the sandbox trust it: SSL_CERT_FILE, CURL_CA_BUNDLE, ...")
    p.add_argument("--http-ca-out", metavar="FILE", help="write the CA certificate here")
    p.add_argument("--http-upstream-ca", metavar="PEM",
                   help="verify upstream HTTPS servers against this bundle (default: system)")
    p.add_argument("--credential", action="append", default=[], metavar="NAME=SOURCE",
                   help="a secret the HTTP filter adds to requests, never seen inside: "
                        "NAME=env:VAR, NAME=file:PATH, NAME=fd:N or NAME=cmd:COMMAND")
    p.add_argument("--credential-env", action="append", default=[], metavar="NAME=VAR",
                   help="the sandbox sees a placeholder for credential NAME in $VAR; the "
                        "filter swaps it for the secret on requests a --http-auth rule names")
    p.add_argument("--http-auth", action="append", default=[], metavar="RULE",
                   help="add a credential: 'METHOD host/path SCHEME NAME' with SCHEME "
                        "bearer, basic[:USER], header:Name, apikey:Name or query:param; "
                        "options replace|add-only, for=PROGRAM[,..], allow_cleartext, "
                        "swap=query,body")
    p.add_argument("--audit", metavar="FILE", help="append JSON Lines audit records here")
    p.add_argument("--report-only", action="store_true",
                   help="trial a policy: network, DNS, HTTP and policy_fn refusals are "
                        "recorded as would-deny and allowed (files stay enforced)")
    p.add_argument("--explain", action="store_true",
                   help="record each file access the policy refuses (path, access, the grant "
                        "that would allow it) in the audit log; costs a supervisor round trip "
                        "per open")
    p.add_argument("--audit-allowed", action="store_true",
                   help="record allowed network events too")
    p.add_argument("--net-allow-bind", action="append", default=[], metavar="PORTS",
                   help="allow TCP bind on PORTS ('8080', '8000-8010', '0' for ephemeral)")
    p.add_argument("--extra-deny-syscall", action="append", default=[], metavar="NAME",
                   help="deny another syscall (or group) with EPERM")
    p.add_argument("--extra-allow-syscall", action="append", default=[], metavar="GROUP",
                   help="allow a group denied by default (sysv_ipc, process_group)")
    p.add_argument("--keep-cap", action="append", default=[], metavar="CAP",
                   help="when started as root, keep this capability (default: none)")
    p.add_argument("-m", "--max-memory", metavar="SIZE",
                   help="the sandbox's processes together: at most SIZE resident (e.g. 512M); "
                        "past it an allocation fails, or every process is killed")
    p.add_argument("-P", "--max-processes", type=int, metavar="N",
                   help="at most N live processes (a fork past it fails with EAGAIN)")
    p.add_argument("--max-cpu", type=int, metavar="PERCENT",
                   help="CPU time of the whole sandbox, in percent of one core")
    p.add_argument("--cpu-cores", metavar="LIST",
                   help="the CPUs it may run on, e.g. 0,2-3")
    p.add_argument("-t", "--timeout", type=float, metavar="SECONDS",
                   help="kill the whole sandbox after SECONDS (exit status 124)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="set an environment variable")
    p.add_argument("--clean-env", action="store_true",
                   help="start from a minimal environment (PATH HOME TERM LANG ...)")
    p.add_argument("--cwd", metavar="DIR", help="working directory of the program")
    p.add_argument("--workspace-backend", choices=("auto", "overlay", "seccomp"),
                   help="how --workdir is kept private: overlay (kernel overlayfs in a "
                        "namespace of its own), seccomp (the supervisor), auto (default)")
    p.add_argument("--workdir", metavar="DIR",
                   help="copy-on-write workspace: the program's writes under DIR go to a "
                        "private layer, applied or discarded when it ends")
    p.add_argument("--fs-storage", metavar="DIR",
                   help="where the workspace's layer lives (default ~/.cache/sandlock/cow)")
    p.add_argument("--max-disk", metavar="SIZE", help="cap on the layer's size (e.g. 512M)")
    p.add_argument("--on-exit", choices=("commit", "abort", "keep"),
                   help="workspace outcome when the program exits 0 (default commit)")
    p.add_argument("--on-error", choices=("commit", "abort", "keep"),
                   help="workspace outcome otherwise (default abort)")
    p.add_argument("--dry-run", action="store_true",
                   help="with --workdir: print what the program changed, then discard it")
    p.add_argument("--no-coredump", action="store_true", help="no core dumps")
    p.add_argument("--name", help="a name for the sandbox (in errors and logs)")
    p.add_argument("--allow-degraded", action="store_true",
                   help="run even if the kernel lacks features; lists what is lost")


_built: dict = {}


def build(only: str | None = None) -> argparse.ArgumentParser:
    """The CLI parser; with `only`, just that subcommand (argparse set-up is a noticeable
    part of every start, and a run needs only its own options). Built once per process
    (the CLI service parses many command lines; parsing leaves a parser unchanged)."""
    if only not in _built:
        _built[only] = _build(only)
    return _built[only]


def _build(only: str | None) -> argparse.ArgumentParser:
    parser = Parser(
        prog="sandlock", description="Run commands in a lightweight unprivileged sandbox.",
        epilog="`sandlock COMMAND --help` shows each command's options and examples.")
    parser.add_argument("--version", action="version", version=f"sandlock {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    parser.subcommands = sub.choices  # name -> its parser (errors are told under it)
    wanted = (lambda name: only is None or only == name)
    if wanted("run"):
        run = sub.add_parser("run", help="run a command in a sandbox",
                             usage="sandlock run [options] -- COMMAND [ARG...]",
                             epilog=EXAMPLES["run"], formatter_class=_Formatter)
        add_run_policy_args(run)
        run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    if wanted("net-run"):
        _add_net_run(sub)
    if wanted("pipe"):
        _add_pipe(sub)
    if wanted("policy"):
        pol = sub.add_parser("policy", help="policy files", epilog=EXAMPLES["policy"],
                             formatter_class=_Formatter)
        pol_sub = pol.add_subparsers(dest="policy_command", required=True, parser_class=Parser)
        pol_check = pol_sub.add_parser("check", help="validate a policy and print its rules",
                                       epilog=EXAMPLES["policy"], formatter_class=_Formatter)
        pol_check.add_argument("file")
        pol_check.add_argument("cmd", nargs=argparse.REMAINDER,
                               help="-- COMMAND: also the toolchain grants it would get")
    if wanted("audit"):
        audit = sub.add_parser("audit", help="summarise an audit log",
                               epilog=EXAMPLES["audit"], formatter_class=_Formatter)
        audit.add_argument("file")
        audit.add_argument("--top", type=int, default=10,
                           help="how many entries each summary table shows")
        audit.add_argument("--summary", action="store_true",
                           help="only the totals, not one line per denial")
    if wanted("learn"):
        learn = sub.add_parser("learn", help="run a command once and write the smallest "
                                             "policy it needs",
                               usage="sandlock learn [-p BASE.yaml] [-o POLICY.yaml] -- CMD",
                               description="Reads are observed (secrets stay hidden), "
                                           "writes land in a copy-on-write layer that is "
                                           "discarded, the network runs in report-only "
                                           "mode; then the policy is written (stdout, or "
                                           "-o), each line saying what needed it.")
        learn.add_argument("-p", "--policy", metavar="BASE.yaml",
                           help="a policy to start from (its DNS servers, limits ...)")
        learn.add_argument("-o", "--output", metavar="POLICY.yaml")
        learn.add_argument("-t", "--timeout", type=float, metavar="SECONDS")
        learn.add_argument("cmd", nargs=argparse.REMAINDER)
    if wanted("why"):
        why = sub.add_parser("why", help="explain the denials of an audit log and what "
                                         "would allow each",
                             description="For each distinct denial: what was refused, the "
                                         "rule or default that decided, and the smallest "
                                         "change that would allow it, as a flag and as "
                                         "YAML. Default log: net-run's.")
        why.add_argument("file", nargs="?", metavar="AUDIT",
                         help="the audit log (default: "
                              "~/.local/state/sandlock/net-run-audit.jsonl)")
        why.add_argument("--json", action="store_true", help="one JSON object per denial")
        why.add_argument("--last", type=int, metavar="N",
                         help="only the last N records of the log")
    if wanted("workspace"):
        ws = sub.add_parser("workspace", help="a copy-on-write layer left by --on-exit keep "
                                              "(or by a crash during a commit)")
        ws.add_argument("action", choices=("diff", "commit", "abort"),
                        help="diff: list its changes; commit: apply them to the workdir "
                             "(finishes an interrupted commit); abort: discard the layer")
        ws.add_argument("layer", help="the layer directory (printed when it was kept)")
    if wanted("certs"):
        certs = sub.add_parser(
            "certs", help="the local CA used to intercept HTTPS",
            description="init: create the CA in the certificate store (once); path: print "
                        "the CA certificate's path; export: print the CA certificate (PEM). "
                        "The store is $SANDLOCK_CERTS_DIR, else ~/.local/share/sandlock/certs; "
                        "its private key is never readable inside a sandbox.")
        certs.add_argument("action", choices=("init", "path", "export"))
    if only is None:  # listed for --help and completion; `sandlock mcp ...` goes to
        # sandlock.mcp.cli before this parser (its options are its own)
        sub.add_parser("mcp", help="an MCP server whose tools run each call in a sandbox "
                                   "(sandlock mcp --help)", add_help=False)
        sub.add_parser("mcp-wrap", help="run a third-party stdio MCP server confined by a "
                                        "policy (sandlock mcp-wrap --help)", add_help=False)
    if wanted("profile"):
        prof = sub.add_parser("profile", help="named profiles (~/.config/sandlock/profiles)")
        prof_sub = prof.add_subparsers(dest="profile_command", required=True,
                                       parser_class=Parser)
        prof_sub.add_parser("list", help="the profiles there are")
        show = prof_sub.add_parser("show", help="a profile's policy, checked")
        show.add_argument("name")
    if wanted("ps"):
        ps = sub.add_parser("ps", help="list this user's running sandboxes",
                            description="Name, main pid, uptime and command of every "
                                        "sandbox of this user that is still running.")
        ps.add_argument("--json", action="store_true", help="one JSON object per line")
    if wanted("inspect"):
        ins = sub.add_parser("inspect", help="the effective policy of a running sandbox")
        ins.add_argument("target", metavar="NAME", help="its name, or its pid")
        fmt = ins.add_mutually_exclusive_group()
        fmt.add_argument("--toml", action="store_true", help="as a TOML profile")
        fmt.add_argument("--json", action="store_true", help="as JSON")
    if wanted("kill"):
        kill = sub.add_parser("kill", help="end a running sandbox (every process of it)")
        kill.add_argument("target", metavar="NAME", help="its name, or its pid")
        kill.add_argument("-s", "--signal", default="TERM",
                          help="TERM (default: the sandbox's tree is stopped, then killed) "
                               "or KILL")
    if wanted("completion"):
        comp = sub.add_parser("completion", help="print a shell completion script",
                              epilog=EXAMPLES["completion"], formatter_class=_Formatter)
        comp.add_argument("shell", choices=("bash", "zsh", "fish"))
    if wanted("service"):
        svc = sub.add_parser("service", help="the per-user CLI service that makes `run`, "
                             "`net-run` and `pipe` start in milliseconds (docs/cli.md)")
        svc_sub = svc.add_subparsers(dest="action", required=True, parser_class=Parser)
        svc_run = svc_sub.add_parser("run", help="serve in this process until idle "
                                     "(the C client starts it on demand)")
        svc_run.add_argument("--idle", type=float, default=600.0, metavar="SECONDS",
                             help="exit after this long without a request (default 600)")
        svc_run.add_argument("--log", action="store_true",
                             help="write errors to service.log in the service's directory")
        svc_sub.add_parser("status", help="whether a service runs, and its pid")
        svc_sub.add_parser("stop", help="stop the service (running sandboxes go on)")
    if wanted("check"):
        check = sub.add_parser("check", help="report what this kernel supports")
        check.add_argument("--allow-degraded", action="store_true",
                           help="succeed when Landlock is present even if features are missing")
    return parser


def _add_net_run(sub) -> None:
    net = sub.add_parser(
        "net-run", help="run an agent tool under a network policy",
        usage="sandlock net-run [--policy F] [--allow SPEC] [--deny SPEC] [--audit FILE] "
              "[options] -- COMMAND [ARG...]",
        description="System directories read-only, the working directory writable (not "
                    "when it is $HOME or /), the command's own toolchain readable, the user's "
                    "secrets (~/.ssh, ~/.aws, ~/.netrc, ...) hidden and startup files kept, "
                    "network as the policy says, every denial in the audit log.",
        epilog=EXAMPLES["net-run"], formatter_class=_Formatter)
    add_run_policy_args(net)
    net.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")


def _add_pipe(sub) -> None:
    pipe = sub.add_parser(
        "pipe", help="run a pipeline whose stages have their own policies",
        usage="sandlock pipe [-t SECONDS] [stage options] -- CMD... ::: [stage options] -- CMD...",
        description="Stages are separated by ':::'; each takes the options of `sandlock run` "
                    "(its own --policy, -r, -w, --net-allow ...). Stage N's stdout feeds stage "
                    "N+1's stdin through a kernel pipe. -t/--timeout (first stage's) bounds the "
                    "whole pipeline. Exit status: the last stage's, or with --pipefail the "
                    "last non-zero one (as bash's `set -o pipefail`).",
        epilog=EXAMPLES["pipe"], formatter_class=_Formatter)
    pipe.add_argument("--pipefail", action="store_true",
                      help="exit with the last non-zero status of any stage")
    pipe.add_argument("stages", nargs=argparse.REMAINDER)




class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Examples keep their layout."""
