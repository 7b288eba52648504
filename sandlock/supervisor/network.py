"""What the network handlers (connect.py, send.py) share: socket addresses, the decision
on a destination and its audit record, and running an on-behalf call now or on a worker.

Three phases. Parse: the sockaddr, msghdr and payload are copied out of the child once.
Decide: netpolicy's pure `EndpointPolicy.decide` (or the unix-socket grants) on the copies.
Act: the operation is performed on our duplicate of the child's socket with exactly the
bytes that were checked, and its result is returned to the child.

SECCOMP_USER_NOTIF_FLAG_CONTINUE (the kernel redoes the call and re-reads memory and the
fd) is used only when that re-read cannot change the outcome: the calling process has a
single thread (so no other task can swap the fd: fd tables are shared only by threads,
the filter refuses CLONE_FILES without CLONE_THREAD) *and* every address the kernel could
then use is still checked by the kernel itself (Landlock TCP ports and scopes, or a socket
type that ignores destination addresses).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
import struct
import threading
import time

from netpolicy.endpoint import canonical_address

from .._kernel import procstat, sockets, unix_diag
from .._kernel.interrupt import interrupt
from .._kernel.fileops import AT_FDCWD
from ..fs_rules import is_beneath
from .request import Denied

CONTINUE = object()  # handler result: let the kernel perform the call


class Defer:
    """Handler result: finish `fn()` on a worker thread (a blocking on-behalf call must not
    stall the supervisor loop). `guard` owns the call's fds: the loop aborts the call through
    it if the caller dies, and releases them if the call is never run. `pool`: the workers
    to run it on (a sandbox's confined threads, supervisor.confined), else the shared
    ones."""

    def __init__(self, fn, guard: "Guard", pool=None):
        self.fn = fn
        self.guard = guard
        self.pool = pool


class Frozen:
    """Handler result: freeze the sandbox (supervisor.freeze), then decide with `body()`,
    which may read the caller's memory and return CONTINUE.

    The freeze stops every task of the sandbox, but not the kernel: a task killed while
    frozen still has its exit path write into memory it registered earlier (its
    clear_child_tid, its robust futex list), so what the kernel re-reads may differ from
    what `body` read. Hence `after(outcome)`: once a call let through has returned, and
    while everything is still frozen, it verifies the call's effect on state no other task
    can change (the new program's own argv and executable after an exec; the fd an open
    installed; the address a bind took) and returns a refusal reason if it is not what was
    judged. The caller's process is then killed before it runs again (freeze.Freeze.run).
    `outcome` is "exec" (an exec succeeded), "returned" or "gone"."""

    def __init__(self, body, after=None):
        self.body = body
        self.after = after


class Inject:
    """Handler result: install our `fd` in the caller and answer with its number
    (SECCOMP_IOCTL_NOTIF_ADDFD); the supervisor closes its copy once sent."""

    def __init__(self, fd: int, cloexec: bool):
        self.fd = fd
        self.cloexec = cloexec


class Replace:
    """Handler result: make our `fd` the caller's fd `target` (SECCOMP_ADDFD_FLAG_SETFD,
    as dup2), then let the call continue in the kernel, on it; the supervisor closes its
    copy. For calls whose only argument the kernel re-reads is that fd number."""

    def __init__(self, fd: int, target: int, cloexec: bool):
        self.fd = fd
        self.target = target
        self.cloexec = cloexec


class Guard:
    """The fds an on-behalf call uses: our duplicate socket first, then any others, and the
    worker thread running it.

    A worker runs the call between enter() and leave(). abort() (the caller's task is gone)
    marks the call cancelled and wakes the worker if it is blocked in a syscall
    (_kernel.interrupt: the call returns EINTR); the loop repeats abort() at every check
    until the worker has left, so a signal that arrived just before the worker blocked
    cannot leave it blocked. No on-behalf call outlives its caller. close() releases every
    fd exactly once, and never while the worker may still use them."""

    def __init__(self, fd: int, others=None):
        self.fd = fd
        self.others = others if others is not None else []
        self._lock = threading.Lock()
        self._closed = False
        self._thread: int | None = None
        self.cancelled = False

    def enter(self) -> None:
        with self._lock:
            self._thread = threading.get_ident()

    def leave(self) -> None:
        with self._lock:
            self._thread = None

    def abort(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._thread is not None:
                interrupt(self._thread)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self.fd, *self.others):
                if fd >= 0:
                    os.close(fd)


AF_UNSPEC, AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 0, 1, 2, 10, 16
SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET = 1, 2, 5
MSG_FASTOPEN = 0x20000000


class Destination:
    __slots__ = ("family", "address", "port", "path", "raw")

    def __init__(self, family, raw, address=None, port=0, path=None):
        self.family, self.raw, self.address, self.port, self.path = (family, raw, address,
                                                                      port, path)


def parse_sockaddr(raw: bytes) -> Destination:
    """Parse a copied sockaddr. Unspecified addresses are decided as the loopback address the
    kernel turns them into (0.0.0.0 -> 127.0.0.1, :: -> ::1)."""
    if len(raw) < 2:
        raise Denied(errno.EINVAL, "short socket address")
    family = struct.unpack_from("<H", raw)[0]
    if family == AF_INET:
        if len(raw) < 16:
            raise Denied(errno.EINVAL, "short sockaddr_in")
        port = struct.unpack_from("!H", raw, 2)[0]
        return Destination(family, raw, as_connected(ipaddress.IPv4Address(raw[4:8])), port)
    if family == AF_INET6:
        if len(raw) < 24:
            raise Denied(errno.EINVAL, "short sockaddr_in6")
        port = struct.unpack_from("!H", raw, 2)[0]
        return Destination(family, raw,
                           as_connected(canonical_address(ipaddress.IPv6Address(raw[8:24]))),
                           port)
    if family == AF_UNIX:
        path = raw[2:]
        if path[:1] == b"\0":
            return Destination(family, raw, path=None)  # abstract
        return Destination(family, raw, path=path.split(b"\0", 1)[0])
    if family in (AF_UNSPEC, AF_NETLINK):
        return Destination(family, raw)  # no destination policy: passed through as is
    raise Denied(errno.EAFNOSUPPORT, f"address family {family}")


def as_connected(address):
    if address.is_unspecified:
        return ipaddress.ip_address("127.0.0.1" if address.version == 4 else "::1")
    return address


def single_threaded(pid: int) -> bool:
    try:
        return int(procstat.fields(procstat.read(f"/proc/{pid}/stat"))[
            procstat.NUM_THREADS]) == 1
    except (OSError, ValueError, IndexError):
        return False


def argv_of(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def protocol_of(domain: int, stype: int, proto: int) -> str:
    if stype == SOCK_STREAM:
        return "tcp"
    if proto in (socket.IPPROTO_ICMP, socket.IPPROTO_ICMPV6):
        return "icmp"
    return "udp"


def deny(req, session, syscall, reason, err=errno.EACCES, **dest):
    """Record a network denial (audit log first, then the session) and refuse."""
    net = session.net
    if net is not None and net.audit is not None:
        net.audit.record(decision="deny", sandbox=session.name, pid=req.pid,
                         argv=argv_of(req.pid), syscall=syscall,
                         errno=errno.errorcode.get(err, err), reason=reason, **dest)
    raise Denied(err, reason)


def refuse(req, session, syscall, reason, err=errno.EACCES, **dest):
    """A refusal by the policy's rules: deny() it, or in report-only mode record it as
    "would-deny" and let the call go on (returns). Refusals no rule decides (malformed,
    uncheckable) use deny() and are refused in every mode."""
    net = session.net
    if net is None or not net.report_only:
        deny(req, session, syscall, reason, err, **dest)
    net.would_deny += 1
    if net.audit is not None:
        net.audit.record(decision="would-deny", sandbox=session.name, pid=req.pid,
                         argv=argv_of(req.pid), syscall=syscall,
                         errno=errno.errorcode.get(err, err), reason=reason, **dest)


def audit_allow(req, session, syscall, **dest):
    audit = session.net.audit
    if audit is not None and audit.log_allowed:
        audit.record(decision="allow", sandbox=session.name, pid=req.pid,
                     argv=argv_of(req.pid), syscall=syscall, **dest)


def inet_verdict(req, session, syscall, protocol, dest):
    """Decide on an inet destination; returns the names it is pinned to. Raises Denied.

    The static policy decides first; a policy_fn can only narrow what it allows."""
    net = session.net
    names = net.pins.names_for(dest.address) if net.pins is not None else ()
    verdict = net.policy.decide(protocol, dest.address, dest.port, names,
                                net.local_addresses() if names else frozenset())
    info = dict(protocol=protocol, address=str(dest.address), port=dest.port,
                host=names[0] if names else None, rule=verdict.rule)
    rt = session.runtime
    if rt is not None:
        _runtime_verdict(req, session, rt, syscall, dest, verdict.allowed, info)
    if not verdict.allowed:
        refuse(req, session, syscall, verdict.reason, **info)
    else:
        audit_allow(req, session, syscall, **info)
    return names


def _runtime_verdict(req, session, rt, syscall, dest, allowed, info) -> None:
    """The policy_fn's say on a destination: its restrictions, then its verdict (held).
    An event the static policy denies is only shown to it (event.denied)."""
    from .runtime import SyscallEvent
    tgid, ppid = req.process_ids()
    event = SyscallEvent(syscall, "network", tgid, ppid, host=str(dest.address),
                         port=dest.port, denied=not allowed)
    if not allowed:
        if "network" in rt.events:
            rt.observe(event)
        return
    refusal = rt.network_refusal(tgid, dest.address)
    if refusal is not None:
        refuse(req, session, syscall, refusal, **dict(info, rule="policy_fn"))
    if "network" in rt.events:
        v = rt.decide(event)
        if not v.allow:
            refuse(req, session, syscall, v.reason, v.errno, **dict(info, rule="policy_fn"))


OWN_SCAN_FDS = 8192      # fds of the sandbox's processes own_socket reads at most (~40 ms)
OWN_SCAN_SECONDS = 0.5  # ... a backstop on its time (other threads take the GIL meanwhile)


def unix_target(req, session, syscall, dest) -> int:
    """Resolve a pathname unix address as the child would; returns an O_PATH fd on the
    socket inode if a grant covers it, or if the socket bound there is the sandbox's own
    (own_socket). Abstract names are the caller's business."""
    fd = req.open_target(AT_FDCWD, dest.path, 0, follow=True)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        os.close(fd)
        raise
    grants = session.net.unix_allow
    if "*" in grants or any(is_beneath(real, g) for g in grants):
        return fd
    if own_socket(session, fd, req.pid):
        audit_allow(req, session, syscall, protocol="unix", path=real, rule="own:unix")
        return fd
    os.close(fd)
    # Refused in report-only too: a unix socket reaches local services (docker.sock, an
    # ssh agent, D-Bus) with the supervisor's reach, not a remote host.
    deny(req, session, syscall, f"unix socket {real} is not in net_allow_unix",
         protocol="unix", path=real, rule="default:unix")


def own_socket(session, target_fd: int, caller: int = 0) -> bool:
    """Whether the unix socket serving at the inode `target_fd` holds is held by a process
    of this sandbox: a server it runs itself (multiprocessing's managers and forkservers,
    a test's server in its TMPDIR), which no grant needs to name. Decided on the object:
    the sockets listening (or, datagram, bound and unconnected) at that inode, from the
    kernel (sock_diag: never a connection a listener accepted, which carries the
    listener's address), looked for among the fds of the sandbox's processes. That
    binding cannot change while the socket lives (bind makes a new inode; the path may be
    replaced, the inode connected to stays the one checked, through target_fd).
    Invariants of the look (review: a pid of the tree reused by a host process while a
    long look went on made the host's listener count as the sandbox's):
      - a process's fds count only through _holds: pinned by a pidfd opened before it is
        checked to be in the tree, and alive after they were read (a live process's pid
        is never reused);
      - where the socket was found last time (session.own_sockets: pid and fd) is looked
        at first, alone (a manager's every proxy connects);
      - otherwise the look reads OWN_SCAN_FDS fds at most, the caller's process first,
        within OWN_SCAN_SECONDS (it runs on the supervisor's thread, which every sandbox
        of this process shares; the time is a backstop, the fds bound the work); past
        either the socket is not the sandbox's own.
    A listener passed into the sandbox (inherited, or received) counts as its own: it can
    already accept what that socket's clients send. Any failure to tell is a no."""
    if session.root <= 0:
        return False
    try:
        st = os.fstat(target_fd)
        if not stat.S_ISSOCK(st.st_mode):
            return False
        inodes = unix_diag.bound_at(st.st_dev, st.st_ino)
    except OSError:
        return False
    if not inodes:
        return False
    from .. import process_tree
    links = {f"socket:[{i}]" for i in inodes}
    known = session.own_sockets
    for link in links:
        where = known.get(link)
        if where is not None and _holds(session, where[0], links, (where[1],)) is not None:
            return True
    budget = [OWN_SCAN_FDS, time.monotonic() + OWN_SCAN_SECONDS]
    pids = process_tree.members(session.root)
    if caller in pids:
        pids.remove(caller)
        pids.insert(0, caller)
    for pid in pids:
        found = _holds(session, pid, links, None, budget)
        if found is False:
            return False  # past the look's bounds
        if found is not None:
            if len(known) >= 64:
                known.clear()
            known[found[0]] = (pid, found[1])
            return True
    return False


def _holds(session, pid: int, links: set, fds=None, budget=None):
    """(link, fd) if process `pid` of the sandbox holds one of `links` at one of `fds`
    (all its fds if None), None if not, False once `budget` ([fds, deadline]) is spent.
    Pinned: a pidfd opened before the tree check, alive after the fds were read."""
    from .. import process_tree
    from .._kernel.pidfd import pidfd_open, pidfd_send_signal
    try:
        pidfd = pidfd_open(pid)
    except OSError:
        return None  # gone, or a thread's id
    try:
        if not process_tree.in_tree(pid, session.root):
            return None
        if fds is None:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                return None
        for n in fds:
            if budget is not None:
                budget[0] -= 1
                if budget[0] < 0 or time.monotonic() > budget[1]:
                    return False
            try:
                link = os.readlink(f"/proc/{pid}/fd/{n}")
            except OSError:
                continue
            if link in links:
                try:
                    pidfd_send_signal(pidfd, 0)  # still that process: its pid was its own
                except OSError:
                    return None
                return link, n
        return None
    finally:
        os.close(pidfd)


def proc_fd_sockaddr(target_fd: int) -> bytes:
    """A sockaddr_un naming the socket inode held open at `target_fd` (no re-resolution)."""
    return struct.pack("<H", AF_UNIX) + f"/proc/self/fd/{target_fd}".encode() + b"\0"


def blocking(fd: int) -> bool:
    import fcntl
    return not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK


def run_action(fd: int, defer: bool, fn, *closers):
    """Run the on-behalf action now, or (`defer`) on a worker thread; closes the fds after."""
    guard = Guard(fd, list(closers))

    def action():
        try:
            return fn()
        finally:
            guard.close()
    return Defer(action, guard) if defer else action()


def socket_info_of(fd: int):
    try:
        return sockets.socket_info(fd)
    except OSError as e:
        raise Denied(e.errno or errno.ENOTSOCK, "not a socket") from None


def abstract_granted(req, session, syscall, dest) -> None:
    name = "@" + dest.raw[3:].split(b"\0", 1)[0].decode("latin-1")
    grants = session.net.unix_allow
    if "*" not in grants and name not in grants:
        deny(req, session, syscall, f"abstract unix socket {name} is not in net_allow_unix",
             errno.EPERM, protocol="unix", path=name, rule="default:unix")
