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


def _add_run_policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-r", "--fs-read", action="append", default=[], metavar="PATH",
                   help="grant read (and execute) access beneath PATH")
    p.add_argument("-w", "--fs-write", action="append", default=[], metavar="PATH",
                   help="grant read/write access beneath PATH")
    p.add_argument("--fs-deny", action="append", default=[], metavar="PATH",
                   help="keep PATH inaccessible even beneath a granted directory")
    p.add_argument("--no-system", action="store_true",
                   help="do not grant the default read-only system directories "
                        "(/usr /bin /lib /etc /opt /proc ...) and standard devices")
    p.add_argument("--net-allow", action="append", default=[], metavar="SPEC",
                   help="allow TCP connect, port-only form: ':443', ':80,443', '*:8000-8010'")
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
    p.add_argument("--no-coredump", action="store_true", help="no core dumps")
    p.add_argument("--name", help="a name for the sandbox (in errors and logs)")
    p.add_argument("--allow-degraded", action="store_true",
                   help="run even if the kernel lacks features; lists what is lost")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandlock", description="Run commands in a lightweight unprivileged sandbox.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a command in a sandbox",
                         usage="sandlock run [options] -- COMMAND [ARG...]")
    _add_run_policy_args(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    check = sub.add_parser("check", help="report what this kernel supports")
    check.add_argument("--allow-degraded", action="store_true",
                       help="succeed when Landlock is present even if features are missing")
    return parser


def _sandbox_from_args(a):
    from .errors import PolicyError
    from .policy import system_denied, system_devices, system_readable
    from .sandbox import Sandbox
    env = {}
    for item in a.env:
        k, sep, v = item.partition("=")
        if not sep:
            raise PolicyError(f"--env {item!r}: expected NAME=VALUE")
        env[k] = v
    readable = list(a.fs_read)
    writable = list(a.fs_write)
    denied = list(a.fs_deny)
    if not a.no_system:
        readable = system_readable() + readable
        # Devices: readable and writable as files; their metadata never changes (supervisor).
        writable = system_devices() + writable
        denied = system_denied() + denied
    return Sandbox(
        fs_readable=readable, fs_writable=writable, fs_denied=denied,
        net_allow=a.net_allow or None, net_allow_bind=a.net_allow_bind or None,
        extra_deny_syscalls=a.extra_deny_syscall or None,
        extra_allow_syscalls=a.extra_allow_syscall or None,
        keep_capabilities=a.keep_cap or None, env=env or None, clean_env=a.clean_env,
        cwd=a.cwd, no_coredump=a.no_coredump, name=a.name, allow_degraded=a.allow_degraded)


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


def _run(a) -> int:
    from .errors import SandlockError
    from .sandbox import StdioMode
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        print("sandlock: error: no command given (usage: sandlock run [options] -- CMD)",
              file=sys.stderr)
        return EXIT_SANDLOCK
    try:
        sb = _sandbox_from_args(a)
        for lost in sb.degradations:
            print(f"sandlock: warning: degraded: {lost}", file=sys.stderr)
        proc = sb.popen(cmd, StdioMode.INHERIT, StdioMode.INHERIT, StdioMode.INHERIT)
    except SandlockError as e:
        msg = str(e)
        if "command not found" in msg:
            print(f"sandlock: {msg}", file=sys.stderr)
            return 127
        print(f"sandlock: error: {msg}", file=sys.stderr)
        return EXIT_SANDLOCK
    if proc._exec_error:
        print(f"sandlock: {proc._exec_error}", file=sys.stderr)
    fg = _Foreground(proc.pid)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = proc.wait(timeout=a.timeout)
    except TimeoutError:
        proc.kill()
        proc.wait()
        print(f"sandlock: timed out after {a.timeout:g}s; the sandbox was killed",
              file=sys.stderr)
        return EXIT_TIMEOUT
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
        return 130
    finally:
        fg.restore()
        proc.close()
    return code if code >= 0 else 128 - code


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
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    return _check(args)


if __name__ == "__main__":
    sys.exit(main())
