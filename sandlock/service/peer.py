"""Who may have the CLI service run a command: a process of this user that is confined no
more than the service itself.

The service runs what a client asks with the service's own credentials, namespaces,
capabilities and confinement, so a client must not be able to obtain more through it than
it holds. A client is served only if, at the moment it is checked, it is alive (a pidfd
taken from the connection, SO_PEERPIDFD: the pid cannot have been reused) and it has the
service's uids, gids and groups, the same namespaces, the same capability sets, the same
LSM label, no_new_privs and seccomp state. A process under any seccomp filter or with
no_new_privs set — every Landlock domain of an unprivileged process, every Sandlock
sandbox, bubblewrap, most agent sandboxes — is told to fall back, and the client then runs
today's in-process CLI, which nests inside whatever confines it. Not seen here: a Landlock
domain that a process with CAP_SYS_ADMIN entered without no_new_privs (the kernel offers no
way to ask), and cgroup membership (the sandbox runs in the service's cgroup).

A check that cannot be made (a /proc file unreadable) refuses.
"""

from __future__ import annotations

import os
import signal
import socket

SO_PEERPIDFD = 77  # Linux 6.5
NAMESPACES = ("mnt", "pid", "net", "user", "uts", "ipc", "cgroup", "time")
STATUS_FIELDS = ("Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp", "Seccomp_filters",
                 "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def _status(pid: int | str) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        lines = dict(line.rstrip("\n").split(":", 1) for line in f if ":" in line)
    return {k: " ".join(lines.get(k, "?").split()) for k in STATUS_FIELDS}


def _label(pid: int | str) -> bytes:
    try:
        with open(f"/proc/{pid}/attr/current", "rb") as f:
            return f.read()
    except OSError:
        return b""  # no LSM that labels processes: the same for everyone


def _namespaces(pid: int | str) -> tuple:
    out = []
    for ns in NAMESPACES:
        try:
            out.append(os.stat(f"/proc/{pid}/ns/{ns}").st_ino)
        except FileNotFoundError:
            out.append(None)  # a namespace kind this kernel lacks
    return tuple(out)


def refusal(conn: socket.socket) -> str | None:
    """Why the process at the other end of `conn` may not be served, or None."""
    pid, uid, gid = __import__("struct").unpack(
        "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != os.geteuid() or gid != os.getegid():
        return f"uid {uid}/gid {gid} is not this service's"
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as e:
        return f"no pidfd of the client ({e.strerror})"
    try:
        try:
            mine = (_status("self"), _namespaces("self"), _label("self"))
            theirs = (_status(pid), _namespaces(pid), _label(pid))
        except OSError as e:
            return f"the client's /proc entries cannot be read ({e.strerror})"
        try:
            signal.pidfd_send_signal(pidfd, 0)  # still the process that connected
        except OSError:
            return "the client is gone"
    finally:
        os.close(pidfd)
    if theirs[1] != mine[1]:
        return "the client is in other namespaces"
    if theirs[2] != mine[2]:
        return "the client has another LSM label"
    for field in STATUS_FIELDS:
        if theirs[0][field] != mine[0][field]:
            return f"the client's {field} ({theirs[0][field]}) differs from the service's"
    return None
