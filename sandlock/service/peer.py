"""Who may have the CLI service run a command, and with what process attributes: a
single-threaded process of this user that is confined no more than the service itself,
whose attributes are read from the kernel, never taken from what it says.

The service runs what a client asks with the service's own credentials, namespaces,
capabilities and confinement, so a client must not be able to obtain more through it than
it holds. A client is served only if, at the moment it is checked, it is alive (a pidfd
taken from the connection, SO_PEERPIDFD: the pid cannot have been reused), it has exactly
one task (Landlock domains, seccomp filters and no_new_privs belong to a thread: in a
process of several, /proc/PID/status shows only the leader's, which may be the one thread
not confined) and that task has the service's uids, gids and groups, the same namespaces,
the same root directory (a chroot), the same capability sets, the same LSM label,
no_new_privs and seccomp state. A process
under any seccomp filter or with no_new_privs set — every Landlock domain of an
unprivileged process, every Sandlock sandbox, bubblewrap, most agent sandboxes — is told
to fall back, and the client then runs the in-process CLI, which nests inside whatever
confines it. Not seen here: a Landlock domain that a process with CAP_SYS_ADMIN entered
without no_new_privs (the kernel offers no way to ask), and cgroup membership (the
sandbox runs in the service's cgroup).

A command is run only for a process that runs the sandlock client itself (its executable
has the client's bytes): a program that connects on behalf of another — a sandbox's
supervisor performs a sandboxed connect() to a granted unix socket itself, so the
connection carries the supervisor's credentials, not the sandbox's — is not the client,
and the client only ever connects for itself. (`sandlock service status|stop` may come
from the Python CLI.)

What the command inherits from the caller (resource limits, scheduling policy, nice value,
CPU affinity, umask, I/O priority, OOM score adjustment, execution domain, ignored and
blocked signals)
is read here from the client process itself, in the same window as the checks: a client
cannot ask for more than it has.

A check that cannot be made (a /proc file unreadable) refuses.
"""

from __future__ import annotations

import _signal
import os
import resource
import signal
import socket
import struct

from .._kernel import procattr

SO_PEERPIDFD = 77  # Linux 6.5
NAMESPACES = ("mnt", "pid", "net", "user", "uts", "ipc", "cgroup", "time")
STATUS_FIELDS = ("Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp", "Seccomp_filters",
                 "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                 "Speculation_Store_Bypass", "SpeculationIndirectBranch")
RLIMITS = 16  # RLIM_NLIMITS


def _status(pid: int | str) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        lines = dict(line.rstrip("\n").split(":", 1) for line in f if ":" in line)
    return {k: " ".join(v.split()) for k, v in lines.items()}


def _label(pid: int | str) -> bytes:
    try:
        with open(f"/proc/{pid}/attr/current", "rb") as f:
            return f.read()
    except OSError:
        return b""  # no LSM that labels processes: the same for everyone


def _root(pid: int | str) -> tuple[int, int]:
    """The process's root directory (chroot): a jailed caller must not be served outside
    its jail."""
    st = os.stat(f"/proc/{pid}/root")
    return st.st_dev, st.st_ino


def _namespaces(pid: int | str) -> tuple:
    out = []
    for ns in NAMESPACES:
        try:
            out.append(os.stat(f"/proc/{pid}/ns/{ns}").st_ino)
        except FileNotFoundError:
            out.append(None)  # a namespace kind this kernel lacks
    return tuple(out)


def _signals(mask_hex: str) -> set[int]:
    mask = int(mask_hex, 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


# The identities (device, inode, size, mtime, ctime) of files found to hold the client's
# bytes: an executable with one of them is the client without reading it again (the
# static client is ~0.8 MB). A file changed in place has another ctime; one replaced,
# another inode.
CLIENT_FILES: set[tuple] = set()


def _identity(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def know_client(path: str, client: bytes | None) -> None:
    """Remember `path` if it holds the client's bytes (the service, at its start, for
    the client installed as the `sandlock` command)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if client and f.read(len(client) + 1) == client:
                CLIENT_FILES.add(_identity(st))
    except OSError:
        pass


def _is_client(pid: int, client: bytes | None) -> bool:
    """The process runs the sandlock client (its executable holds the same bytes)."""
    if not client:
        return False
    try:
        with open(f"/proc/{pid}/exe", "rb") as f:
            if _identity(os.fstat(f.fileno())) in CLIENT_FILES:
                return True
            return f.read(len(client) + 1) == client
    except OSError:
        return False


def _attributes(pid: int, status: dict[str, str]) -> dict:
    with open(f"/proc/{pid}/oom_score_adj") as f:
        oom = int(f.read())
    with open(f"/proc/{pid}/personality") as f:  # the client's own uid: readable
        persona = int(f.read(), 16)
    return {
        "limits": [resource.prlimit(pid, r) for r in range(RLIMITS)],
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "sched": (os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority),
        "cpus": os.sched_getaffinity(pid),
        "umask": int(status["Umask"], 8),
        "ioprio": procattr.ioprio(pid),
        "oom_score_adj": oom,
        "personality": persona,
        "ignored": _signals(status["SigIgn"]),
        "blocked": _signals(status["SigBlk"]),
    }


def own() -> tuple:
    """This process's side of the comparison inspect() makes: what of it a client must
    match. Read ahead of a request by a waiting child (nothing of it changes while it
    waits: credentials, namespaces, root, label, seccomp and no_new_privs are never
    changed by the service), so that a client does not wait for it."""
    return _status("self"), _namespaces("self"), _label("self"), _root("self")


def inspect(conn: socket.socket, client: bytes | None = None, mine: tuple | None = None
            ) -> tuple[str | None, dict | None]:
    """(why the process at the other end of `conn` may not be served, None) or
    (None, its attributes; "client": whether it runs the sandlock client, whose
    executable's bytes are `client`). `mine`: own(), if read already."""
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET,
                                                        socket.SO_PEERCRED, 12))
    if uid != os.geteuid() or gid != os.getegid():
        return f"uid {uid}/gid {gid} is not this service's", None
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as e:
        return f"no pidfd of the client ({e.strerror})", None
    try:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            mine = own() if mine is None else mine
            theirs = (_status(pid), _namespaces(pid), _label(pid), _root(pid))
            attrs = _attributes(pid, theirs[0])
            attrs["client"] = _is_client(pid, client)
        except (OSError, KeyError, ValueError) as e:
            return f"the client's /proc entries cannot be read ({e})", None
        try:
            signal.pidfd_send_signal(pidfd, 0)  # still the process that connected
        except OSError:
            return "the client is gone", None
    finally:
        os.close(pidfd)
    if len(tasks) != 1 or theirs[0].get("State", "Z")[:1] == "Z":
        return "the client is not a single live thread", None
    if theirs[1] != mine[1]:
        return "the client is in other namespaces", None
    if theirs[2] != mine[2]:
        return "the client has another LSM label", None
    if theirs[3] != mine[3]:
        return "the client has another root directory (chroot)", None
    for field in STATUS_FIELDS:
        if theirs[0].get(field, "?") != mine[0].get(field, "?"):
            return (f"the client's {field} ({theirs[0].get(field, '?')}) differs from the "
                    "service's"), None
    return None, attrs


def take_on(attrs: dict) -> str | None:
    """Give this process (a service child, about to run the CLI) the client's attributes;
    why it cannot, or None. Each is set only where it differs, and with this process's
    rights, which are the client's (same credentials and capabilities, checked above) —
    except that a service started with more restricted attributes (a lower hard limit, a
    higher nice value) cannot serve a client with fewer restrictions: that one falls back."""
    for res, lim in enumerate(attrs["limits"]):
        try:
            if resource.getrlimit(res) != lim:
                resource.setrlimit(res, lim)
        except (OSError, ValueError) as e:
            return f"resource limit {res} {lim}: {e}"
    try:
        policy, priority = attrs["sched"]
        if (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) != attrs["sched"]:
            os.sched_setscheduler(0, policy, os.sched_param(priority))
        if os.getpriority(os.PRIO_PROCESS, 0) != attrs["nice"]:
            os.setpriority(os.PRIO_PROCESS, 0, attrs["nice"])
        if os.sched_getaffinity(0) != attrs["cpus"]:
            os.sched_setaffinity(0, attrs["cpus"])
        if procattr.personality() != attrs["personality"]:
            procattr.set_personality(attrs["personality"])
        if procattr.ioprio(0) != attrs["ioprio"]:
            procattr.set_ioprio(attrs["ioprio"])
        with open("/proc/self/oom_score_adj", "r+") as f:
            if int(f.read()) != attrs["oom_score_adj"]:
                f.seek(0)
                f.write(str(attrs["oom_score_adj"]))
    except OSError as e:
        return (f"scheduling policy, nice value, CPU affinity, execution domain, I/O priority "
                f"or OOM score: {e}")
    os.umask(attrs["umask"])
    return None


def take_signals(attrs: dict) -> None:
    """The client's ignored and blocked signals, as a Python CLI started by the client
    would have them: ignored stay ignored (SIGINT too), SIGPIPE and SIGXFSZ ignored
    (Python's start does that), SIGINT raising KeyboardInterrupt, the rest default —
    except where Sandlock installed a handler of its own, as it does in any process.
    Through _signal, the C module: the signal module's wrappers map every number and
    handler to an enum member (0.25 ms of a warm call for 64 signals; 0.05 ms so)."""
    from .._kernel import interrupt
    ignored = attrs["ignored"]
    ign, dfl, intr = int(signal.SIG_IGN), int(signal.SIG_DFL), signal.default_int_handler
    kept = (int(signal.SIGKILL), int(signal.SIGSTOP), interrupt.installed())
    for sig in _signal.valid_signals():
        if sig in kept or not 0 < sig < 65:
            continue  # the supervisor threads' interrupt signal keeps its handler
        try:
            current = _signal.getsignal(sig)
        except ValueError:
            continue
        if current not in (ign, dfl, intr):
            continue  # a handler Sandlock installed from Python: kept
        if sig in ignored or sig in (signal.SIGPIPE, signal.SIGXFSZ):
            handler = ign
        elif sig == signal.SIGINT:
            handler = intr
        else:
            handler = dfl
        if current == handler:
            continue  # Python's table is the kernel's for these: nothing to change
        try:
            _signal.signal(sig, handler)
        except (OSError, ValueError):
            pass  # a signal the C library reserves for itself (32, 33)
    # glibc's own 32 and 33 are refused (a warning each): its fork and posix_spawn
    # clear them in a child anyway, as sandlock-exec.c does
    _signal.pthread_sigmask(signal.SIG_SETMASK, attrs["blocked"] - {32, 33})
