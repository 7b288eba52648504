"""One tool call in a fresh sandbox: bounded time, bounded output, and its denials.

Every call gets a Sandbox of its own, built from the tool's policy, and an audit log of its
own (in the server's private directory), so that the records of this call, and only
those, can be returned to the client; they are then appended to the audit log the policy
names, if any, unchanged (same schema as every other sandlock audit log). Output past
`max_output` bytes per stream is read and dropped (the call is never blocked by a full
pipe) and the result says it was truncated. At the deadline the whole sandbox is killed.
"""

from __future__ import annotations

import json
import os
import selectors
import tempfile
import threading
import time
from dataclasses import dataclass, field

from ..errors import SandlockError

MAX_OUTPUT = 1 << 20        # bytes kept of each of stdout and stderr
MAX_RECORDS = 200           # audit records kept for one call's result
DRAIN = 2.0                 # seconds to read what is left once the sandbox was killed


@dataclass
class CallOutcome:
    exit_code: int
    success: bool
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    error: str | None                 # what the sandbox reported (timeout, exec error)
    denials: list = field(default_factory=list)    # structured, see denials.py
    changes: list = field(default_factory=list)    # cow Change objects (workdir runs)
    refused: list = field(default_factory=list)    # (Change, why) never applied


_live: set = set()          # the Processes of calls in progress (kill_all at shutdown)
_live_lock = threading.Lock()


def kill_all() -> None:
    """End every sandbox of a call in progress (the server is shutting down)."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        proc.kill()


class CallError(SandlockError):
    """The sandbox could not be started (bad policy for this call, missing command)."""


class Auditor:
    """The server's private directory for per-call audit logs, and the audit logs that
    policies name (each opened once, shared by every call that writes to it)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sandlock-mcp-")
        self._logs: dict[tuple[str, bool], object] = {}
        self._lock = threading.Lock()
        self._n = 0

    def call_log(self, tool: str) -> str:
        with self._lock:
            self._n += 1
            return os.path.join(self.dir, f"{tool}-{self._n}.jsonl")

    def open(self, path: str, allowed: bool):
        """The AuditLog at `path` (its directory made, 0700, if missing); OSError if it
        cannot be opened."""
        from netpolicy.audit import AuditLog
        with self._lock:
            log = self._logs.get((path, allowed))
            if log is None:
                os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
                log = self._logs[(path, allowed)] = AuditLog(path, allowed)
            return log

    def forward(self, path: str, allowed: bool, records: list[dict]) -> None:
        log = self.open(path, allowed)
        for rec in records:
            log.record(**rec)

    def close(self) -> None:
        import shutil
        with self._lock:
            for log in self._logs.values():
                log.close()
            self._logs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def run(fields: dict, argv: list[str], *, tool: str, source: str, auditor: Auditor,
        timeout: float, input: bytes | None = None,
        max_output: int = MAX_OUTPUT) -> CallOutcome:
    """Run `argv` in a new Sandbox(**fields); never raises for what the program did (that
    is in the outcome), raises CallError when nothing could run."""
    from ..errors import PolicyError
    from ..sandbox import CommandNotFound, Sandbox, StdioMode
    from . import denials
    fields = dict(fields)
    wanted_log = fields.get("audit_log")
    allowed = bool(fields.get("audit_allowed"))
    call_log = auditor.call_log(tool)
    fields["audit_log"] = call_log
    try:
        sb = Sandbox(**fields)
        proc = sb.popen(argv, stdin=StdioMode.PIPED if input else StdioMode.NULL,
                        stdout=StdioMode.PIPED, stderr=StdioMode.PIPED)
    except CommandNotFound as e:
        _read_records(call_log)
        raise CallError(f"{e} (in the {tool} tool's sandbox)") from None
    except PolicyError as e:
        _read_records(call_log)
        raise CallError(f"{tool}'s policy ({source}): {e}") from None
    except SandlockError as e:
        _read_records(call_log)
        raise CallError(f"{tool}: the sandbox could not start: {e}") from None
    try:
        result, out, err, truncated, timed_out = finish(proc, input, timeout, max_output)
    finally:
        records = _read_records(call_log)
    found = denials.collect(records, result.denials, tool, source, fields.get("name"))
    if wanted_log:  # the call's records, then the supervisor's other refusals
        auditor.forward(wanted_log, allowed, records + [
            d["record"] for d in found if d["decided_by"] == "supervisor"])
    return CallOutcome(exit_code=result.exit_code, success=result.success, stdout=out,
                       stderr=err, truncated=truncated, timed_out=timed_out,
                       error=result.error, denials=found, changes=list(result.changes),
                       refused=list(getattr(result.workspace, "refused", []) or []))


def finish(proc, input: bytes | None, timeout: float, max_output: int = MAX_OUTPUT):
    """Run a started Process to its end within `timeout` seconds: (Result, stdout, stderr,
    truncated, timed_out). The process is closed in every case."""
    deadline = time.monotonic() + timeout
    with _live_lock:
        _live.add(proc)
    try:
        out, err, truncated, timed_out = _communicate(proc, input, deadline, max_output)
        # Both pipes closed: the program may still run (it closed them); until the deadline.
        result = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        timed_out = timed_out or result.reason.name == "TIMEOUT"
    finally:
        with _live_lock:
            _live.discard(proc)
        proc.close()
    return result, out, err, truncated, timed_out


def _communicate(proc, input: bytes | None, deadline: float, cap: int):
    """Feed stdin, read stdout and stderr (at most `cap` bytes kept of each) until both
    end or the deadline passes; then the sandbox is killed and what is left drained."""
    sinks = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    order = list(sinks)
    truncated = timed_out = False
    sel = selectors.DefaultSelector()
    for fd in sinks:
        sel.register(fd, selectors.EVENT_READ)
    pending = memoryview(input or b"")
    stdin = proc.stdin
    if stdin is not None:
        os.set_blocking(stdin.fileno(), False)
        sel.register(stdin.fileno(), selectors.EVENT_WRITE)
    open_fds = set(sinks)
    stop_at = deadline
    try:
        while open_fds:
            now = time.monotonic()
            if now >= stop_at:
                if timed_out or stop_at != deadline:
                    break  # drained as long as we wait after a kill
                timed_out = True
                proc.time_out()
                stop_at = now + DRAIN
                continue
            for key, _ in sel.select(stop_at - now):
                fd = key.fd
                if stdin is not None and fd == stdin.fileno():
                    try:
                        n = os.write(fd, pending[:65536])
                        pending = pending[n:]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        stdin.close()
                        stdin = None
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                sink = sinks[fd]
                room = cap - len(sink)
                if room < len(chunk):
                    truncated = True
                sink += chunk[:max(room, 0)]
    finally:
        sel.close()
        if stdin is not None:
            stdin.close()
    return bytes(sinks[order[0]]), bytes(sinks[order[1]]), truncated, timed_out


def _read_records(path: str) -> list[dict]:
    """The call's audit records (a bounded number), and the file removed."""
    records = []
    try:
        with open(path, "rb") as f:
            for line in f:
                if len(records) >= MAX_RECORDS * 5:
                    break
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    records.append(rec)
    except FileNotFoundError:
        return []
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return records
