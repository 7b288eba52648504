"""`sandlock` command line: run, check.

Exit status of `sandlock run` is the program's; 128+N when it died of signal N; 124 on
timeout (as timeout(1)); 125 when sandlock itself refused or failed (bad policy, old kernel),
in which case nothing ran.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

EXIT_TIMEOUT = 124
EXIT_SANDLOCK = 125


def _say(text: str) -> None:
    """A line on stderr for a person. Messages quote what a sandbox chose (paths, hosts,
    argv), so control characters and escape sequences are shown escaped, never sent."""
    from netpolicy.text import printable
    print(f"sandlock: {printable(text)}", file=sys.stderr)


def _add_run_policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", metavar="FILE.yaml",
                   help="a YAML policy (version 1); the flags below add to it")
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
    p.add_argument("--audit", metavar="FILE", help="append JSON Lines audit records here")
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


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The CLI parser; with `only`, just that subcommand (argparse set-up is a noticeable
    part of every start, and a run needs only its own options)."""
    parser = argparse.ArgumentParser(
        prog="sandlock", description="Run commands in a lightweight unprivileged sandbox.")
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = (lambda name: only is None or only == name)
    if wanted("run"):
        run = sub.add_parser("run", help="run a command in a sandbox",
                             usage="sandlock run [options] -- COMMAND [ARG...]")
        _add_run_policy_args(run)
        run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    if wanted("net-run"):
        _add_net_run(sub)
    if wanted("pipe"):
        _add_pipe(sub)
    if wanted("policy"):
        pol = sub.add_parser("policy", help="policy files")
        pol_sub = pol.add_subparsers(dest="policy_command", required=True)
        pol_check = pol_sub.add_parser("check", help="validate a policy and print its rules")
        pol_check.add_argument("file")
    if wanted("audit"):
        audit = sub.add_parser("audit", help="summarise an audit log")
        audit.add_argument("file")
        audit.add_argument("--top", type=int, default=10,
                           help="how many entries each summary table shows")
        audit.add_argument("--summary", action="store_true",
                           help="only the totals, not one line per denial")
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
        description="System directories read-only, the working directory writable, "
                    "credentials (~/.ssh, ~/.aws, ~/.config/gcloud, ~/.netrc, ...) denied, "
                    "network as the policy says, every denial in the audit log.")
    _add_run_policy_args(net)
    net.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")


def _add_pipe(sub) -> None:
    pipe = sub.add_parser(
        "pipe", help="run a pipeline whose stages have their own policies",
        usage="sandlock pipe [-t SECONDS] [stage options] -- CMD... ::: [stage options] -- CMD...",
        description="Stages are separated by ':::'; each takes the options of `sandlock run` "
                    "(its own --policy, -r, -w, --net-allow ...). Stage N's stdout feeds stage "
                    "N+1's stdin through a kernel pipe. -t/--timeout (first stage's) bounds the "
                    "whole pipeline. Exit status: the last stage's.")
    pipe.add_argument("stages", nargs=argparse.REMAINDER)


def _flag_fields(a) -> dict:
    from .errors import PolicyError
    env = {}
    for item in a.env:
        k, sep, v = item.partition("=")
        if not sep:
            raise PolicyError(f"--env {item!r}: expected NAME=VALUE")
        env[k] = v
    return {
        "fs_readable": a.fs_read, "fs_writable": a.fs_write, "fs_denied": a.fs_deny,
        "net_allow": a.net_allow, "net_deny": a.net_deny, "net_allow_bind": a.net_allow_bind,
        "net_allow_unix": a.net_allow_unix, "dns_servers": a.dns_server,
        "net_allow_private": a.net_allow_private or None,
        "http_allow": a.http_allow, "http_deny": a.http_deny, "http_ports": a.http_port or None,
        "http_upgrades": a.http_upgrade or None, "http_raw": a.http_raw or None,
        "http_ca": a.http_ca, "http_key": a.http_key,
        "http_inject_ca": a.http_inject_ca or None, "http_ca_out": a.http_ca_out,
        "http_upstream_ca": a.http_upstream_ca,
        "audit_log": a.audit, "audit_allowed": a.audit_allowed or None,
        "extra_deny_syscalls": a.extra_deny_syscall,
        "extra_allow_syscalls": a.extra_allow_syscall,
        "keep_capabilities": a.keep_cap or None, "env": env or None,
        "clean_env": a.clean_env or None, "cwd": a.cwd, "no_coredump": a.no_coredump or None,
        "name": a.name, "allow_degraded": a.allow_degraded or None,
        "workdir": a.workdir, "fs_storage": a.fs_storage, "max_disk": a.max_disk,
        "workspace_backend": a.workspace_backend,
        **({"on_exit": "abort", "on_error": "abort"} if a.dry_run else
           {k: v for k, v in (("on_exit", a.on_exit), ("on_error", a.on_error)) if v}),
    }


def _sandbox_from_args(a, net_run: bool = False, cmd=None):
    """Policy file (if any) + flags; `run` and `net-run` differ only in their defaults.
    Both protect the user's files (home_policy) and grant the command's own toolchain
    (sandlock.toolchain) unless --strict; -v prints what that added, and why."""
    from .policy_file import load_policy, merge_fields, system_fields
    from .sandbox import Sandbox
    fields, system, timeout = {}, not a.no_system, a.timeout
    if a.policy:
        loaded = load_policy(a.policy)
        fields, system = loaded.fields, system and loaded.system
        timeout = timeout if timeout is not None else loaded.timeout
    base = dict(system_fields()) if system else {}
    base["protect_user_files"] = True
    notes = []
    if system and not a.strict and cmd:
        from .toolchain import toolchain_grants
        env = dict(os.environ)
        env.update(fields.get("env") or {})
        env.update(dict(item.partition("=")[::2] for item in a.env))
        grants = toolchain_grants(cmd[0], env, a.cwd or fields.get("cwd") or os.getcwd())
        base = merge_fields(base, {"fs_readable": [g.path for g in grants]})
        notes += [f"read {g.path} ({g.why})" for g in grants]
    if net_run:
        cwd = os.path.realpath(a.cwd or fields.get("cwd") or os.getcwd())
        home = os.path.realpath(os.path.expanduser("~"))
        if cwd in (home, "/"):
            _say(f"note: the working directory {cwd} is {'your home' if cwd == home else '/'}"
                 f": net-run does not make it writable (pass -w {cwd} to allow that)")
        else:
            base = merge_fields(base, {"fs_writable": [cwd]})
        if not (a.audit or fields.get("audit_log")):
            fields = merge_fields(fields, {"audit_log": _default_audit_path()})
    merged = merge_fields(merge_fields(base, fields), _flag_fields(a))
    sb = Sandbox(**merged)
    if getattr(a, "verbose", False):
        for note in notes:
            _say(note)
        for note in _protection_notes(sb.policy):
            _say(note)
    return sb, timeout


def _protection_notes(policy) -> list[str]:
    plan = policy.protection
    if plan is None:
        return []
    how = {"mounts": "kernel mounts in the sandbox's own namespace",
           "landlock": "Landlock rules and the supervisor (no namespace here)"}
    out = [f"protecting the user's files by {how.get(policy.protect_mode, '?')}"]
    out += [f"hidden {p}" for p in plan.hidden]
    out += [f"read-only {p}" for p in plan.readonly]
    if plan.guarded:
        out.append(f"never created: {len(plan.guarded)} startup/config paths "
                   f"(e.g. {plan.guarded[0]}), .envrc/.vscode/.idea and .git hooks")
    from .protect import notice
    extra = notice(plan, policy.protect_mode)
    if extra:
        out.append(f"note: {extra}")
    return out


def _default_audit_path() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    directory = os.path.join(state, "sandlock")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.path.join(directory, "net-run-audit.jsonl")


class _Foreground:
    """Give the terminal to the sandbox's process group while it runs (so interactive
    programs can read it), and take it back afterwards."""

    def __init__(self, pgid: int):
        self.fd = -1
        try:
            if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                self.fd = 0
        except OSError:
            pass
        if self.fd >= 0:
            self._swap(pgid)

    def _swap(self, pgid: int) -> None:
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(self.fd, pgid)
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, old)

    def restore(self) -> None:
        if self.fd >= 0:
            self._swap(os.getpgrp())


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM ends the sandbox like Ctrl-C does


def _run(a, net_run: bool = False) -> int:
    from .errors import SandlockError
    from .sandbox import CommandNotFound, StdioMode
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        _say("error: no command given (usage: sandlock run [options] -- CMD)")
        return EXIT_SANDLOCK
    try:
        sb, timeout = _sandbox_from_args(a, net_run, cmd)
        for lost in sb.degradations:
            _say(f"warning: degraded: {lost}")
        proc = sb.popen(cmd, StdioMode.INHERIT, StdioMode.INHERIT, StdioMode.INHERIT)
    except CommandNotFound as e:
        _say(f"{e}")
        return 127
    except SandlockError as e:
        _say(f"error: {e}")
        return EXIT_SANDLOCK
    if a.dry_run and proc.workspace is None:
        proc.kill()
        proc.close()
        _say("error: --dry-run needs --workdir (or a policy's workspace)")
        return EXIT_SANDLOCK
    if proc.exec_error:
        _say(f"{proc.exec_error}")
    fg = _Foreground(proc.pid)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = proc.wait(timeout=timeout)
        status = code if code >= 0 else 128 - code
    except TimeoutError:
        proc.kill()
        proc.wait()
        _say(f"timed out after {timeout:g}s; the sandbox was killed")
        status = EXIT_TIMEOUT
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
        status = 130
    finally:
        fg.restore()
        proc.close()
    if net_run:
        _net_run_summary(sb)
    if proc.workspace is not None:
        _workspace_summary(proc.workspace, a.dry_run)
    return status


def _workspace_summary(ws, dry_run: bool) -> None:
    from .cow import table
    if dry_run:
        print(table(ws.changes))
        _say(f"dry run: {ws.layer.lower} was left untouched")
    else:
        done = {"commit": "applied to", "abort": "discarded, not applied to",
                "keep": "kept for inspection, not applied to"}[ws.action.value]
        where = (f" (layer: {ws.layer.root}; `sandlock workspace diff|commit|abort` it)"
                 if ws.action.value == "keep" else "")
        _say(f"{len(ws.changes)} change(s) {done} {ws.layer.lower}{where}")
    if ws.error:
        _say(f"workspace: {ws.error}")


def _net_run_summary(sb) -> None:
    audit = sb.audit
    denied = audit.denied if audit is not None else 0
    where = f"; audit log: {audit.path}" if audit is not None else ""
    _say(f"{denied} network request(s) denied{where}")


def _pipe(tokens: list[str]) -> int:
    from .errors import SandlockError
    from .pipeline import Pipeline
    parser = _parser("run")
    segments, current = [], []
    for token in tokens:
        if token == ":::":
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    stages, timeout = [], None
    try:
        for seg in segments:
            args = parser.parse_args(["run", *seg])
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                _say("error: a pipeline stage has no command "
                      "(stage: [options] -- CMD ...)")
                return EXIT_SANDLOCK
            sb, stage_timeout = _sandbox_from_args(args, cmd=cmd)
            timeout = timeout if timeout is not None else stage_timeout
            stages.append(sb.cmd(cmd))
        result = Pipeline(stages).run(stdout=1, stdin=0, timeout=timeout)
    except SandlockError as e:
        _say(f"error: {e}")
        return EXIT_SANDLOCK
    for i, r in enumerate(result.stages):
        sys.stderr.buffer.write(r.stderr)
        if r.error:
            _say(f"stage {i + 1}: {r.error}")
    if result.reason.name == "TIMEOUT":
        return EXIT_TIMEOUT
    return result.exit_code if result.signal < 0 else 128 + result.signal


def _policy_check(a) -> int:
    from .errors import SandlockError
    from .policy_file import load_policy, merge_fields, system_fields
    from .sandbox import Sandbox
    try:
        loaded = load_policy(a.file)
        sb = Sandbox(**merge_fields(system_fields() if loaded.system else {}, loaded.fields))
    except SandlockError as e:
        _say(f"error: {e}")
        return EXIT_SANDLOCK
    p = sb.policy
    print(f"{a.file}: valid (version 1){' — ' + loaded.name if loaded.name else ''}")
    rows = [("read", p.fs_readable), ("write", p.fs_writable), ("deny", p.fs_denied),
            ("net allow", [r.spec for r in p.endpoints.allow] or ["(none: no network)"]),
            ("net deny", [r.spec for r in p.endpoints.deny]),
            ("tcp bind", sorted(p.tcp_bind.ports) if not p.tcp_bind.any_port else ["*"]),
            ("unix sockets", p.unix_allow), ("dns servers", p.dns_servers or
                                             (["(system)"] if p.endpoints.hostnames else [])),
            ("http allow", [r.spec for r in p.http.allow] if p.http else []),
            ("http deny", [r.spec for r in p.http.deny] if p.http else []),
            ("http ports", sorted(p.http_ports)),
            ("audit log", [p.audit_log] if p.audit_log else [])]
    if p.workspace is not None:
        ws = p.workspace
        rows.append(("workdir", [f"{ws.workdir} (copy-on-write: a private layer in "
                                 f"{ws.storage}"
                                 + (f", at most {ws.max_disk} bytes" if ws.max_disk else "")
                                 + ")"]))
        rows.append(("outcome", [f"exit 0: {loaded.fields.get('on_exit', 'commit')}; "
                                 f"otherwise: {loaded.fields.get('on_error', 'abort')}"]))
    for label, values in rows:
        if values:
            print(f"  {label:13} " + "\n  {:13} ".format("").join(str(v) for v in values))
    enforcement = ("Landlock only (port rules)" if not p.net_supervised
                   else "supervisor decides destinations; Landlock bounds TCP ports")
    print(f"  {'network':13} {enforcement}")
    if p.endpoints.hostnames and not p.endpoints.allow_private:
        print(f"  {'ssrf':13} host rules never reach private/loopback/metadata addresses")
    if loaded.timeout:
        print(f"  {'timeout':13} {loaded.timeout:g}s")
    from .policy_report import http_report
    report = http_report(p)
    for note in report.notes:
        print(f"  {'note':13} {note}")
    for error in report.errors:
        print(f"  {'error':13} {error}")
    return EXIT_SANDLOCK if report.errors else 0


def _audit(a) -> int:
    from netpolicy.audit import summarize
    try:
        print(summarize(a.file, a.top, lines=not a.summary))
    except OSError as e:
        _say(f"error: {a.file}: {e.strerror}")
        return EXIT_SANDLOCK
    return 0


def _check(a) -> int:
    from .features import FULL_LANDLOCK_ABI, degradations, detect
    f = detect()
    print(f"kernel {os.uname().release}")
    for name, present, purpose in f.report():
        print(f"  [{'ok' if present else '--'}] {name:28} {purpose}")
    lost = degradations(f)
    if not lost:
        print("all protections available")
        return 0
    for item in lost:
        print(f"missing: {item}")
    if a.allow_degraded and f.landlock_abi >= 1:
        print("usable with --allow-degraded (the protections above are lost)")
        return 0
    print(f"sandlock needs Landlock ABI {FULL_LANDLOCK_ABI} (Linux 6.12+), seccomp user "
          f"notification, pidfd_getfd and fchmodat2; run with --allow-degraded to accept less")
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pipe"] and not set(argv[1:2]) & {"-h", "--help"}:
        return _pipe(argv[1:])  # stages carry `run` options, parsed stage by stage
    first = argv[0] if argv else None
    known = ("run", "net-run", "pipe", "policy", "audit", "certs", "check", "workspace")
    args = _parser(first if first in known else None).parse_args(argv)
    if args.command in ("run", "net-run"):
        return _run(args, net_run=args.command == "net-run")
    if args.command == "policy":
        return _policy_check(args)
    if args.command == "audit":
        return _audit(args)
    if args.command == "certs":
        return _certs(args)
    if args.command == "workspace":
        return _workspace(args)
    return _check(args)


def _workspace(a) -> int:
    from . import cow
    try:
        layer = cow.open_layer(a.layer)
        if a.action == "diff":
            if cow.interrupted(a.layer):
                _say("a commit of this layer was interrupted; `sandlock workspace "
                      "commit` finishes it")
            print(cow.table(cow.diff(layer)))
        elif a.action == "commit":
            changes = cow.diff(layer) if not cow.interrupted(a.layer) else None
            cow.commit(layer, changes)
            _say(f"committed to {layer.lower}")
        else:
            layer.discard()
            _say(f"discarded {a.layer}")
    except (OSError, ValueError) as e:
        _say(f"error: {a.layer}: {e}")
        return EXIT_SANDLOCK
    return 0


def _certs(a) -> int:
    from netpolicy.tls_intercept import BASENAME, default_certs_dir, open_store
    directory = default_certs_dir()
    cert = directory / f"{BASENAME}-ca-cert.pem"
    if a.action == "init" or not cert.exists():
        if a.action != "init":
            _say(f"error: no CA in {directory}; run `sandlock certs init`")
            return EXIT_SANDLOCK
        existed = cert.exists()
        try:
            open_store(directory)
        except OSError as e:
            _say(f"error: {directory}: {e.strerror}")
            return EXIT_SANDLOCK
        print(f"{'existing' if existed else 'created'} CA: {cert} "
              f"(private key: {directory / (BASENAME + '-ca.pem')}, mode 0600)")
        return 0
    if a.action == "path":
        print(cert)
    else:
        sys.stdout.write(cert.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
