"""`sandlock` command line: run, check.

Exit status of `sandlock run` is the program's; 128+N when it died of signal N; 124 on
timeout (as timeout(1)); 125 when sandlock itself refused or failed (bad policy, old kernel),
in which case nothing ran.
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_TIMEOUT = 124
EXIT_SANDLOCK = 125
# In a CLI service child: (sandbox, timeout, lines, notes) built ahead for these
# arguments, if still what they build (service/prepared.py), else None.
_prepared = None


def _say(text: str) -> None:
    """A line on stderr for a person. Messages quote what a sandbox chose (paths, hosts,
    argv), so control characters and escape sequences are shown escaped, never sent."""
    from netpolicy.text import printable
    lines = text.split("\n")
    prefix = lines[0].split(": ", 1)[0] + ": " if lines[0].startswith(("error: ",
                                                                      "warning: ")) else ""
    for i, line in enumerate(lines):
        lead = prefix if i and prefix and not line.startswith(prefix) else ""
        print(f"sandlock: {lead}{printable(line)}", file=sys.stderr)


# Sandbox fields -> the flag a user types for them (errors name what the user wrote).
FIELD_FLAGS = {
    "fs_readable": "-r/--fs-read", "fs_writable": "-w/--fs-write", "fs_denied": "--fs-deny",
    "net_allow": "--allow", "net_deny": "--deny", "net_allow_bind": "--net-allow-bind",
    "net_allow_unix": "--net-allow-unix", "dns_servers": "--dns-server",
    "http_allow": "--http-allow", "http_deny": "--http-deny", "http_ports": "--http-port",
    "http_upgrades": "--http-upgrade", "http_raw": "--http-raw", "http_ca": "--http-ca",
    "http_key": "--http-key", "http_ca_out": "--http-ca-out",
    "http_upstream_ca": "--http-upstream-ca", "audit_log": "--audit",
    "extra_deny_syscalls": "--extra-deny-syscall",
    "extra_allow_syscalls": "--extra-allow-syscall", "keep_capabilities": "--keep-cap",
    "cwd": "--cwd", "workdir": "--workdir", "fs_storage": "--fs-storage",
    "max_disk": "--max-disk", "on_exit": "--on-exit", "on_error": "--on-error",
    "workspace_backend": "--workspace-backend", "env": "--env", "name": "--name",
    "net_allow/net_deny": "--allow/--deny",
    "max_memory": "-m/--max-memory", "max_processes": "-P/--max-processes",
    "max_cpu": "--max-cpu", "cpu_cores": "--cpu-cores",
    "credentials": "--credential", "credential_env": "--credential-env",
    "http_auth": "--http-auth",
}


def _check_flag_paths(a) -> None:
    """Paths given as flags must exist: one line naming the flag and the path as typed."""
    from .errors import PolicyError
    problems = []
    for field, values in (("fs_readable", a.fs_read), ("fs_writable", a.fs_write),
                          ("cwd", [a.cwd] if a.cwd else []),
                          ("workdir", [a.workdir] if a.workdir else []),
                          ("http_ca", [a.http_ca] if a.http_ca else []),
                          ("http_key", [a.http_key] if a.http_key else []),
                          ("http_upstream_ca", [a.http_upstream_ca] if a.http_upstream_ca
                           else [])):
        for v in values:
            if not os.path.lexists(os.path.expanduser(v)):
                problems.append(f"{FIELD_FLAGS[field]} {v}: does not exist")
    for v in a.fs_deny:
        if not os.path.lexists(os.path.expanduser(v)):
            problems.append(f"--fs-deny {v}: does not exist, so there is nothing to deny; "
                            f"check the spelling, or drop the flag (a path no grant covers "
                            f"is unreachable anyway)")
    if problems:
        raise PolicyError("\n".join(problems))


def flag_named(message: str, a, file_fields: dict) -> str:
    """A policy error about a field the flags set (and no policy file did), told with the
    flag's name."""
    field, sep, rest = message.partition(":")
    head = field.split(" ", 1)[0]
    if head == "net_allow/net_deny":  # which list held the spec the message quotes
        spec = field.split(" ", 1)[1].strip("'\"") if " " in field else ""
        head = "net_deny" if spec in (a.net_deny or []) else "net_allow"
        field = head + field[len("net_allow/net_deny"):]
    flag = FIELD_FLAGS.get(head)
    if flag is None or any(f in file_fields for f in head.split("/")):
        return message
    return flag + field[len(head):] + sep + rest


def _flag_fields(a) -> dict:
    from .errors import PolicyError
    _check_flag_paths(a)
    def pairs(flag, items, form):
        out = {}
        for item in items:
            k, sep, v = item.partition("=")
            if not sep or not k:
                raise PolicyError(f"{flag} {item!r}: expected {form}")
            out[k] = v
        return out
    env = pairs("--env", a.env, "NAME=VALUE")
    credentials = pairs("--credential", a.credential, "NAME=env:VAR, NAME=file:PATH or "
                                                       "NAME=cmd:COMMAND")
    credential_env = pairs("--credential-env", a.credential_env, "NAME=VAR")
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
        "credentials": credentials or None, "credential_env": credential_env or None,
        "http_auth": a.http_auth or None,
        "audit_log": a.audit, "audit_allowed": a.audit_allowed or None,
        "explain": a.explain or None, "report_only": a.report_only or None,
        "extra_deny_syscalls": a.extra_deny_syscall,
        "extra_allow_syscalls": a.extra_allow_syscall,
        "keep_capabilities": a.keep_cap or None, "env": env or None,
        "clean_env": a.clean_env or None, "cwd": a.cwd, "no_coredump": a.no_coredump or None,
        "name": a.name, "allow_degraded": a.allow_degraded or None,
        "workdir": a.workdir, "fs_storage": a.fs_storage, "max_disk": a.max_disk,
        "workspace_backend": a.workspace_backend,
        "max_memory": a.max_memory, "max_processes": a.max_processes,
        "max_cpu": a.max_cpu, "cpu_cores": a.cpu_cores,
        **({"on_exit": "abort", "on_error": "abort"} if a.dry_run else
           {k: v for k, v in (("on_exit", a.on_exit), ("on_error", a.on_error)) if v}),
    }


def _getcwd() -> str | None:
    """The working directory, or None when it has been removed (the command still runs
    there, as it would outside the sandbox)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


def _fields_from_args(a, net_run: bool, cmd, toolchains: list | None = None
                      ) -> tuple[dict, dict, float | None, list, list]:
    """The Sandbox fields the arguments make: the policy file (if any), the flags, the
    system view and the command's own toolchain (sandlock.toolchain) unless --strict.
    Returns (fields, the policy file's fields, timeout, lines to tell now, -v notes). It
    only reads files (a CLI service may compute it ahead: service/prepared.py) — except
    for net-run's first call, which makes its default audit log's directory. The
    toolchain.Toolchains consulted, if any, with the grants it gave, is appended to
    `toolchains`."""
    from .policy_file import load_policy, merge_fields, system_fields
    fields, system, timeout = {}, not a.no_system, a.timeout
    if a.policy and getattr(a, "profile", None):
        from .errors import PolicyError
        raise PolicyError("--policy and -p/--profile: give one of them")
    if a.policy:
        loaded = load_policy(a.policy)
        fields, system = loaded.fields, system and loaded.system
        timeout = timeout if timeout is not None else loaded.timeout
    elif getattr(a, "profile", None):
        from .profiles import read_profile
        prof = read_profile(a.profile)
        fields = prof.fields
        system = system and (prof.system or prof.path.endswith(".toml"))
        timeout = timeout if timeout is not None else prof.timeout
    base = dict(system_fields()) if system else {}
    base["protect_user_files"] = True
    said, notes = [], []
    if system and not a.strict and cmd:
        from .toolchain import Toolchains
        env = dict(os.environ)
        env.update(fields.get("env") or {})
        env.update(dict(item.partition("=")[::2] for item in a.env))
        chains = Toolchains(env, a.cwd or fields.get("cwd") or _getcwd())
        grants = chains.grants(cmd[0])
        if toolchains is not None:
            toolchains.append((chains, grants))
        base = merge_fields(base, {"fs_readable": [g.path for g in grants]})
        notes += [f"read {g.path} ({g.why})" for g in grants]
    if net_run:
        cwd = a.cwd or fields.get("cwd") or _getcwd()
        cwd = cwd and os.path.realpath(cwd)
        home = os.path.realpath(os.path.expanduser("~"))
        if cwd is None:
            said.append("note: the working directory no longer exists: net-run makes no "
                        "directory writable for it")
        elif cwd in (home, "/"):
            said.append(f"note: the working directory {cwd} is "
                        f"{'your home' if cwd == home else '/'}: net-run does not make it "
                        f"writable (pass -w {cwd} to allow that)")
        else:
            base = merge_fields(base, {"fs_writable": [cwd]})
        base["private_tmp"] = True  # a TMPDIR of its own, not the host's /tmp
        if not (a.audit or fields.get("audit_log")):
            fields = merge_fields(fields, {"audit_log": _default_audit_path()})
    merged = merge_fields(merge_fields(base, fields), _flag_fields(a))
    return merged, fields, timeout, said, notes


def _sandbox_from_args(a, net_run: bool = False, cmd=None):
    """The Sandbox of `run`'s or `net-run`'s arguments (they differ only in their
    defaults), and the run's timeout. Both protect the user's files (home_policy); -v
    prints what the toolchain grants added, and why. In a CLI service child, a sandbox
    built ahead from the same arguments is taken if nothing it was built from changed."""
    ready = _prepared(a, net_run, cmd) if _prepared is not None else None
    if ready is not None:
        sb, timeout, said, notes = ready
        for line in said:
            _say(line)
    else:
        from .errors import PolicyError
        from .sandbox import Sandbox
        merged, fields, timeout, said, notes = _fields_from_args(a, net_run, cmd)
        for line in said:
            _say(line)
        try:
            sb = Sandbox(**merged)
        except PolicyError as e:
            raise PolicyError(flag_named(str(e), a, fields)) from None
    if getattr(a, "verbose", False):
        for note in notes:
            _say(note)
        for note in _protection_notes(sb.policy) + _tmp_notes(sb.policy):
            _say(note)
    return sb, timeout


def _tmp_notes(policy) -> list[str]:
    if not policy.private_tmp:
        return []
    if policy.private_shm:
        return ["a private TMPDIR, and a private /dev/shm"]
    from .policy import _shm_users
    from .private_tmp import shm_refusal
    why = shm_refusal(policy.fs_writable, _shm_users(policy.fs_readable, policy.fs_denied,
                                                     policy.workspace))
    return [f"a private TMPDIR; no private /dev/shm ({why}): "
            f"POSIX semaphores and shared memory (multiprocessing's locks, queues and "
            f"pools) fail there unless it is granted"]


def _protection_notes(policy) -> list[str]:
    plan = policy.protection
    if plan is None:
        return []
    how = {"mounts": "kernel mounts in the sandbox's own namespace",
           "landlock": "Landlock rules and the supervisor (no namespace here)"}
    from .protect import mode, notice
    way = policy.protect_mode or mode()  # not probed for a plan with nothing to enforce
    out = [f"protecting the user's files by {how[way]}"]
    out += [f"hidden {p}" for p in plan.hidden]
    out += [f"read-only {p}" for p in plan.readonly]
    if plan.guarded:
        out.append(f"never created: {len(plan.guarded)} startup/config paths "
                   f"(e.g. {plan.guarded[0]}), .envrc/.vscode/.idea and .git hooks")
    extra = notice(plan, way)
    if extra:
        out.append(f"note: {extra}")
    return out


def _default_audit_path() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    directory = os.path.join(state, "sandlock")
    if not os.path.isdir(directory):  # a build ahead looks, never makes (service/prepared)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as e:
            from .errors import SandlockError
            raise SandlockError(f"net-run's audit log: cannot make {directory} "
                                f"({e.strerror}): pass --audit FILE, or set XDG_STATE_HOME "
                                f"to a directory you may write") from None
    return os.path.join(directory, "net-run-audit.jsonl")


class _HungUp(KeyboardInterrupt):
    """SIGHUP (the terminal closed, the session ended): the sandbox ends as with SIGTERM,
    what the run made goes with it (its private TMPDIR), and the status is 129."""


_ending: list[int] = []  # the ending signal taken, once one was


def _interrupt(signum, frame):
    """SIGTERM ends the sandbox like Ctrl-C does; SIGHUP too. Once: another one meanwhile
    (systemd sends SIGTERM then SIGHUP; Ctrl-C then SIGTERM) finds the run ending, and
    would only cut its cleanup short (review)."""
    if _ending:
        return
    _ending.append(signum)
    raise _HungUp if signum == signal.SIGHUP else KeyboardInterrupt


def _ending_signals() -> None:
    """SIGTERM and SIGHUP end the sandbox through the run's own cleanup, from before its
    start on (a default action would end this process with the sandbox's private TMPDIR
    left in the caller's); SIGINT, Ctrl-C, as it did (KeyboardInterrupt), and with them
    one at a time. One its caller ignores (nohup, a background job) stays ignored, here and
    in the program, which is started with the caller's dispositions (launch.py)."""
    _ending.clear()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


def _run(a, net_run: bool = False) -> int:
    from .errors import SandlockError
    from .sandbox import CommandNotFound, StdioMode
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd and getattr(a, "profile", None):
        from .profiles import read_profile
        try:
            cmd = read_profile(a.profile).program
        except SandlockError as e:
            _say(f"error: {e}")
            return EXIT_SANDLOCK
    if not cmd:
        _say("error: no command given (usage: sandlock run [options] -- CMD)")
        return EXIT_SANDLOCK
    if getattr(a, "interactive", False) and not os.isatty(0):
        _say("error: -i/--interactive: stdin is not a terminal")
        return EXIT_SANDLOCK
    _ending_signals()
    try:
        sb, timeout = _sandbox_from_args(a, net_run, cmd)
        for lost in sb.degradations:
            _say(f"warning: degraded: {lost}")
        for note in sb.notices:
            _say(f"note: {note}")
        proc = sb.popen(cmd, StdioMode.INHERIT, StdioMode.INHERIT, StdioMode.INHERIT,
                        register=False, only_run=True)
    except CommandNotFound as e:
        _say(f"{e}")
        return 127
    except SandlockError as e:
        _say(f"error: {e}")
        return EXIT_SANDLOCK
    except KeyboardInterrupt as e:  # before the program ran (popen let go of what it made)
        return 128 + signal.SIGHUP if isinstance(e, _HungUp) else 130
    if a.dry_run and proc.workspace is None:
        proc.kill()
        proc.close()
        _say("error: --dry-run needs --workdir (or a policy's workspace)")
        return EXIT_SANDLOCK
    if proc.exec_error:
        _say(f"{proc.exec_error}")
    from .terminal import Foreground
    fg = Foreground(proc.root)  # the root's process group: the program starts in it
    try:
        code = _wait_code(sb, proc, cmd, timeout)
        status = code if code >= 0 else 128 - code
    except TimeoutError:
        proc.kill()
        proc.wait_code()
        _say(f"timed out after {timeout:g}s; the sandbox was killed")
        status = EXIT_TIMEOUT
    except KeyboardInterrupt as e:
        proc.kill()
        proc.wait_code()
        status = 128 + signal.SIGHUP if isinstance(e, _HungUp) else 130
    finally:
        fg.restore()
        proc.close()
    if sb.policy.report_only:
        net = sb._net
        n = (net.would_deny if net is not None else 0) + proc.would_deny
        where = f"; `sandlock why {sb.audit.path}`" if sb.audit is not None else \
            " (add --audit FILE to keep them)"
        _say(f"REPORT-ONLY: refusals by the network rules and the policy_fn were let "
             f"through; {n} request(s) WOULD HAVE BEEN DENIED{where} (files, unix sockets "
             f"and malformed requests stay enforced)")
    elif net_run:
        _net_run_summary(sb)
    else:
        _denials_hint(sb, proc)
    if proc.workspace is not None:
        _workspace_summary(proc.workspace, a.dry_run)
    return status


# A program still running this long after its start is entered in the registry of running
# sandboxes (`sandlock ps`, `inspect`, `kill`); one that ended sooner never is, which saves
# a short command the entry's file (0.3-0.5 ms of a warm call through the service).
REGISTER_AFTER = 0.005


def _wait_code(sb, proc, cmd, timeout: float | None) -> int:
    """proc.wait_code(timeout), registering the sandbox once REGISTER_AFTER has passed."""
    first = REGISTER_AFTER if timeout is None else min(REGISTER_AFTER, timeout)
    try:
        return proc.wait_code(timeout=first)
    except TimeoutError:
        if timeout is not None and timeout <= first:
            raise
    sb._register(proc, cmd)
    return proc.wait_code(timeout=None if timeout is None else timeout - first)


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
    hint = f" (`sandlock why {audit.path}` says what would allow each)" if denied else ""
    _say(f"{denied} network request(s) denied{where}{hint}")


def _denials_hint(sb, proc) -> None:
    """After `run`: where the run's denials are explained (net-run says it itself)."""
    audit = sb.audit
    if audit is not None and audit.denied:
        _say(f"{audit.denied} denied: `sandlock why {audit.path}` says what would allow each")
        return
    denials = [d for d in proc.denials if d.get("protocol") == "file"]
    if not denials:  # (why, and json with it: ~1.5 ms of an in-process run's imports)
        return
    from .why import explain
    files = explain(denials)
    for e in files[:5]:  # --explain without --audit: the few first, here
        fix = e.get("fix")
        _say(f"denied {e['denied']}" + (f" (allow with {fix['flag']}" + (
            f"; {fix['note']}" if fix.get("note") else "") + ")" if fix else ""))
    if len(files) > 5:
        _say(f"... {len(files) - 5} more: pass --audit FILE and run `sandlock why FILE`")


def _pipe(tokens: list[str]) -> int:
    from .errors import SandlockError
    from .pipeline import Pipeline
    from .cli_parser import build
    parser = build("run")
    pipefail = tokens[:1] == ["--pipefail"]
    tokens = tokens[1:] if pipefail else tokens
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
            args, extras = parser.parse_known_args(["run", *seg])
            if extras:  # under `run`'s usage (a stage's options), with the closest option
                parser.subcommands["run"].error(f"unrecognized arguments: {' '.join(extras)}")
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                _say("error: a pipeline stage has no command "
                      "(stage: [options] -- CMD ...)")
                return EXIT_SANDLOCK
            sb, stage_timeout = _sandbox_from_args(args, cmd=cmd)
            timeout = timeout if timeout is not None else stage_timeout
            stages.append(sb.cmd(cmd))
        result = Pipeline(stages, single=True).run(stdout=1, stdin=0, timeout=timeout)
    except SandlockError as e:
        _say(f"error: {e}")
        return EXIT_SANDLOCK
    for i, r in enumerate(result.stages):
        sys.stderr.buffer.write(r.stderr)
        if r.error:
            _say(f"stage {i + 1}: {r.error}")
    if result.reason.name == "TIMEOUT":
        return EXIT_TIMEOUT
    statuses = [r.exit_code if r.signal < 0 else 128 + r.signal for r in result.stages]
    if pipefail:  # bash's `set -o pipefail`: the last stage that failed
        return next((code for code in reversed(statuses) if code != 0), 0)
    return statuses[-1]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pipe"] and not set(argv[1:2]) & {"-h", "--help"}:
        return _pipe(argv[1:])  # stages carry `run` options, parsed stage by stage
    if argv[:1] in (["mcp"], ["mcp-wrap"]):
        from .mcp.cli import main as mcp_main  # the optional `mcp` extra, imported lazily
        return mcp_main(argv)
    from .cli_parser import build
    first = argv[0] if argv else None
    known = ("run", "net-run", "pipe", "policy", "audit", "certs", "check", "workspace",
             "completion", "ps", "inspect", "kill", "profile", "why", "learn", "service")
    parser = build(first if first in known else None)
    args, extras = parser.parse_known_args(argv)
    if extras:  # told under the usage of the subcommand in use, with the closest option
        sub = parser.subcommands.get(getattr(args, "command", None), parser)
        sub.error(f"unrecognized arguments: {' '.join(extras)}")
    if args.command in ("run", "net-run"):
        return _run(args, net_run=args.command == "net-run")
    if args.command == "learn":
        from .learn import main as learn
        return learn(args)
    from . import cli_tools
    return {"policy": cli_tools.policy_check, "audit": cli_tools.audit,
            "certs": cli_tools.certs, "workspace": cli_tools.workspace,
            "completion": cli_tools.completion, "check": cli_tools.check,
            "ps": cli_tools.ps, "inspect": cli_tools.inspect,
            "kill": cli_tools.kill, "profile": cli_tools.profile,
            "service": cli_tools.service,
            "why": cli_tools.why}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
