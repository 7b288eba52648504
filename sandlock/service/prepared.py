"""A sandbox built ahead of a call by a waiting CLI-service child, and used only if
nothing it was built from has changed (server.py starts it; cli._sandbox_from_args
calls use(); call.py, after_call()).

Why: turning a call's arguments into a Sandbox — the policy file, the system view, the
command's toolchain grants, the protection of the user's files, the Landlock ruleset, the
seccomp program — is ~4 ms of a warm `sandlock run`, and a spare child has nothing to do
while it waits. Agents send the same flags from the same directory with the same
environment call after call, most of them through the same shell. So a spare builds the
sandbox of the last call the service served, and a call whose inputs are the same gets
it, if the file system still looks as it did to that build.

What use() checks before a prepared sandbox replaces a new one, each check made on the
request's own state; any difference, or a check that cannot be made, means a new build,
exactly as without this module:
  1. The inputs, compared whole: the parsed arguments (every option, and the command's
     name: its arguments build nothing; another command's name only for its toolchain
     grants, computed again for it at use and compared with the build's, both ways:
     the grants it would lack, and those it would have that its own build would not
     give), the environment, the working directory (device
     and inode, and its path), and this process's attributes (peer._attributes: limits,
     umask, affinity...). Credentials, namespaces and confinement are the service's in
     both cases (peer.inspect). What the arguments build from besides — the policy file,
     the toolchain found for the command, the home — is read from files: 2.
  2. The file system, as the build saw it (service/reads.py): every stat, access,
     readlink, open and listing the build made is recorded with what it saw; once built,
     inotify watches the directories they lie in, and what inotify cannot vouch for
     (contents read, /proc, the mount table, other filesystems than the local ones) is
     read again and compared at use, as are the answers a build takes from elsewhere:
     the user database, the scan of root-only files, whether the kernel's audit is on.
  3. Nothing else. Any other effect while building (reads.py lists them: a write, a
     process, a socket...) is refused (the operation raises), and so is a build over
     PREPARE_LIMIT; the preparation is abandoned: the spare exits rather than serve
     with whatever state the refusal left, and the service does not try that call's
     inputs again (server.py). Fields with side effects known in advance (a workspace,
     the HTTP filter, credentials, explain) are not tried. net-run is: its private /tmp's
     root is made by the run that uses the sandbox, in the caller's TMPDIR, and granted
     then (Sandbox._private_tmp_now: the path rules a build with it has, added to the
     ruleset before any run restricts itself with it), so nothing waits in a directory
     others can write; its audit log is opened when the program starts.
Once built, the spare also starts the sandbox's trampoline (park(): launch.Parked), which
waits unconfined for its call; it inherits the spare's process attributes, which 1
requires of a caller, and gets the call's stdio, directory, signals and program then.
Invariant: a prepared Sandbox is used at most once, and only after 1-3 passed at that
moment. The checks are made before the program starts, as a new build's reads would be:
the window in which a change goes unseen is a new build's own.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys

from . import reads

MAX_REPORT = 1 << 17  # a call's inputs larger than this are not prepared
PREPARE_LIMIT = 2.0   # seconds a build ahead may take (one that blocks is abandoned)
# Fields whose build has effects (directories made, files opened to write, sockets): not
# prepared (the audit hook would refuse them anyway; this spares a wasted spare).
# Not among them: a private /tmp, whose root the call makes (_Prepared.private_tmp_now),
# and an audit log, opened when the program starts.
_EFFECTS = ("workdir", "http_allow", "http_deny", "http_auth", "http_ca", "http_key",
            "http_inject_ca", "http_ca_out", "credentials", "credential_env", "explain",
            "report_only")
# The options that set those fields (a policy file may set them too: _EFFECTS, below).
_OPTION_EFFECTS = ("workdir", "http_allow", "http_deny", "http_ca", "http_key",
                   "http_inject_ca", "http_ca_out", "credential", "credential_env",
                   "http_auth", "explain", "report_only", "interactive")

REPORT: socket.socket | None = None  # to the service: the inputs of each call served
_ready: "_Prepared | None" = None
# The caller's attributes as peer.inspect read them, which this process took on
# (peer.take_on) before the CLI runs: _attributes() would read them again.
CALLER: "dict | None" = None
_after: "tuple | None" = None  # use()'s: the call's key, the prepared sandbox checked
_early: "tuple | None" = None  # check_early()'s: the prepared sandbox, why it is stale
abandoned = ""  # what made prepare() give up (for the service's log)


class _Prepared:
    def __init__(self, payload, key, env, cwd, attrs, built, toolchain, mounts: int,
                 watch: int, redo: dict, matter: dict, where: dict):
        self.payload = payload  # the inputs it was built from, as report() sent them
        self.key, self.env, self.cwd, self.attrs = key, env, cwd, attrs
        self.built, self.watch, self.redo, self.matter = built, watch, redo, matter
        self.where = where  # each watch's directory
        self.mounts = mounts  # reads.mount_table(), opened before the build's reads
        # why it is stale, once an event that matters was read (reads.moved: where), or
        # once the mount table changed; "" until then
        self.moved = ""
        # (toolchain.Toolchains, the grants it gave the build's command), or None where
        # the build consulted no toolchain (--strict, --no-system): the command's name
        # then builds nothing either.
        self.toolchain = toolchain

    def stale(self, key, cmd) -> str | None:
        """Why this sandbox is not the one `key`'s call (its command `cmd`) would build
        now, or None."""
        try:
            if key[:2] != self.key[:2]:
                if key[1] != self.key[1]:
                    return "another subcommand"
                mine, theirs = dict(key[0]), dict(self.key[0])
                return "other options (" + ", ".join(sorted(
                    k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))) + ")"
        except Exception as e:  # a check that cannot be made: a change
            return f"check failed ({e})"
        if _early is not None and _early[0] is self:
            why = _early[1]
        else:
            why = self.changed()
        if why is None and key[2] != self.key[2]:
            why = self.toolchain_differs(cmd)
        return why

    def toolchain_differs(self, cmd) -> str | None:
        """Why another command than the build's does not take this sandbox, or None: the
        toolchain grants it gets now (its PATH part read by the build, whose reads are
        checked as any other; its own files and the per-user configuration read now)
        are the build's command's, path for path and reason for reason (-v prints
        them)."""
        if self.toolchain is None:
            return None
        chains, grants = self.toolchain
        try:
            if chains.grants(cmd[0]) == grants:
                return None
        except Exception as e:  # a check that cannot be made: a change
            return f"check failed ({e})"
        return "another command, whose toolchain grants differ"

    def changed(self) -> str | None:
        """Why this sandbox is not the one its call would build now, its arguments aside
        (what the build read, the caller's environment, working directory and process
        attributes), or None."""
        try:
            if _compared(os.environ) != self.env:
                return "another environment"
            if (_cwd(), os.getcwd()) != self.cwd:  # the object, and the path the build
                return "another working directory"  # used (bind mounts: one, two paths)
            if (CALLER if CALLER is not None else _attributes()) != self.attrs:
                return "other process attributes"
        except Exception as e:  # a check that cannot be made: a change
            return f"check failed ({e})"
        return self.read_changed()

    def read_changed(self) -> str | None:
        """What the build read that has changed since, or None."""
        try:
            if not self.moved:
                self.moved = reads.moved(self.watch, self.matter, self.where) or ""
            if self.moved:
                return self.moved if self.moved == "the mount table changed" else (
                    f"a directory it read changed ({self.moved})")
            if reads.mount_table_changed(self.mounts):
                self.moved = "the mount table changed"
                return self.moved
            return reads.changed(self.redo)
        except Exception as e:  # a check that cannot be made: a change
            return f"check failed ({e})"

    def private_tmp_now(self) -> None:
        """Its private TMPDIR's root (net-run's), made and granted now rather than as the
        run starts (Sandbox._private_tmp_now): by the call, in the TMPDIR of the caller
        whose state this process has taken, while the client's "go" is on its way (a
        mkdir on this VM's ext4 is ~0.2 ms; hidden only where the go comes after the
        checks). Never by the build ahead: a root would wait there for minutes where
        others can write. A go that never comes removes it (call.serve_one); a
        failure is the run's to meet again, and to report."""
        try:
            sb = self.built[0]
            sb._private_tmp_now(sb._confinement())
        except Exception:
            pass

    def close(self) -> None:
        os.close(self.watch)
        os.close(self.mounts)


def _cwd() -> tuple[int, int]:
    st = os.stat(".")
    return st.st_dev, st.st_ino


def _attributes() -> dict:
    from . import peer
    attrs = peer._attributes(os.getpid(), peer._status("self"))
    attrs.pop("ignored")
    attrs.pop("blocked")
    return attrs


def _compared(env) -> dict:
    """The environment a build ahead is compared by: all of it but the service's own
    debugging switch, which only makes the service say what it does."""
    return {k: v for k, v in env.items() if k != "SANDLOCK_SERVICE_DEBUG"}


def _key(a, net_run: bool, cmd) -> tuple:
    """What of a call's arguments its sandbox is built from: every option, and the
    command's name (sandlock.toolchain looks it up); its arguments build nothing."""
    return (tuple(sorted((k, v) for k, v in vars(a).items() if k != "cmd")), net_run,
            tuple(cmd[:1]))


def _preparable(key: tuple, env: dict) -> bool:
    # HOME: `~` is read from it (os.path.expanduser); `~user` from the user database, an
    # answer recorded (reads._ASKED).
    opts = dict(key[0])
    return (bool(env.get("HOME")) and bool(key[2])
            and not any(opts.get(k) for k in _OPTION_EFFECTS))


def prepare(payload: bytes) -> bool:
    """In a spare child, before it waits: build the sandbox of `payload` (a call's inputs,
    as report() sent them), recording what the build read. False if the build did
    something a prepared build may not: the caller must exit, not serve."""
    global _ready
    key, env, cwd = pickle.loads(payload)
    if not _preparable(key, env):
        return True
    import argparse
    from .. import cli
    from ..sandbox import Sandbox
    a = argparse.Namespace(**dict(key[0]), cmd=list(key[2]))
    saved = dict(os.environ)
    try:
        os.chdir(cwd)
    except OSError:
        return True
    os.environ.clear()
    os.environ.update(env)
    built, mounts = None, -1
    try:
        mounts = reads.mount_table()  # before anything is read: a mount after it counts
        where, attrs = (_cwd(), os.getcwd()), _attributes()
        try:  # made now if missing, not by the call (cli.REGISTER_AFTER): the service's
            from .. import registry  # own directory, where the cover file lies, would
            registry.directory()  # change beneath the build (a new entry)
        except Exception:
            pass
        with reads.recording() as rec:
            def overdue(signum, frame):
                rec.refuse(f"building took over {PREPARE_LIMIT:g}s")
            old = signal.signal(signal.SIGALRM, overdue)
            # Again and again: a build that caught the first refusal may block once more.
            signal.setitimer(signal.ITIMER_REAL, PREPARE_LIMIT, PREPARE_LIMIT)
            try:
                chains: list = []
                merged, _, timeout, said, notes = cli._fields_from_args(a, key[1], a.cmd,
                                                                        chains)
                if not any(merged.get(k) for k in _EFFECTS):
                    sb = Sandbox(**merged)
                    sb._confinement(private_tmp_later=True)  # the ruleset, the filter
                    sb.degradations  # noqa: B018
                    sb.notices  # noqa: B018
                    built = (sb, timeout, said, notes)
            except Exception:
                built = None  # refused (the call will say why itself), or our refusal: below
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        if rec.refused is not None:
            global abandoned
            abandoned = rec.refused
            return False
        if built is None:
            return True
        try:
            watched = reads.watch(rec.deps, reads.mounts())
        except (OSError, ValueError, IndexError):  # the mount table unreadable, ...
            watched = None
        if watched is None:
            return True
        # A change between the build's reads and the watches: every read redone, now that
        # the watches see what comes next.
        try:
            moved = reads.changed(rec.deps) is not None
        except Exception:  # a file now over MAX_READ, ...
            moved = True
        if moved:
            os.close(watched[0])
            return True
        _ready = _Prepared(payload, key, _compared(env), where, attrs, built,
                           chains[0] if chains else None, mounts, *watched)
        mounts = -1  # _ready's
        return True
    finally:
        if mounts >= 0:
            os.close(mounts)
        os.environ.clear()
        os.environ.update(saved)
        os.chdir("/")


def still(payload: bytes) -> bool:
    """In a spare, told of a call served: whether its sandbox was built from `payload`
    and nothing the build read has changed since (then it is kept, not built again)."""
    return _ready is not None and _ready.payload == payload and _ready.read_changed() is None


def current() -> "_Prepared | None":
    """The sandbox built ahead, if any: a waiting spare reads the events of its inotify
    descriptor (.watch) as they come (idle()), so that a call finds few left to read."""
    return _ready


def idle() -> bool:
    """In a waiting spare whose watch has events: read them; whether one mattered (the
    sandbox built ahead is then stale: stale_inputs())."""
    if _ready is None:
        return False
    from .._kernel import inotify
    try:
        hit = reads.moved(_ready.watch, _ready.matter, _ready.where)
        if hit:
            inotify.drain(_ready.watch)  # the rest adds nothing to that
    except OSError as e:
        hit = f"its events unreadable ({e.strerror})"
    _ready.moved = _ready.moved or hit or ""
    return bool(hit)


def stale_inputs() -> bytes | None:
    """The inputs of the sandbox built ahead if what it read has changed (to build it
    again), else None."""
    return _ready.payload if _ready is not None and _ready.moved else None


def discard() -> None:
    """Drop the sandbox built ahead, if any (newer inputs are to be prepared); its kernel
    objects go with it (Confinement.__del__), and its parked trampoline."""
    global _ready
    ready, _ready = _ready, None
    from .. import launch
    launch.discard_parked()
    if ready is not None:
        ready.close()


def park() -> None:
    """In a spare that built a sandbox ahead: its trampoline started too, parked before
    its call (launch.Parked). The spare's process attributes are what the trampoline
    inherits, and a call gets this sandbox only with the same attributes (changed())."""
    if _ready is None:
        return
    from .. import launch
    conf = _ready.built[0]._confinement()
    if not launch.parked_for(conf):
        launch.park(conf)


def report(key: tuple) -> None:
    """In a serving child: tell the service this call's inputs (the next spares prepare
    them). Never waits: a full socket or large inputs skip it."""
    if REPORT is None or not _preparable(key, dict(os.environ)):
        return
    try:
        payload = pickle.dumps((key, dict(os.environ), os.getcwd()))
        if len(payload) <= MAX_REPORT:
            REPORT.send(b"R" + payload, socket.MSG_DONTWAIT)
    except Exception:  # OSError, unpicklable options...: not prepared, nothing else
        pass


def refused(payload: bytes) -> None:
    """In a spare whose preparation was abandoned: never prepare these inputs again."""
    if REPORT is not None:
        try:
            REPORT.send(b"B" + payload, socket.MSG_DONTWAIT)
        except OSError:
            pass


def check_early() -> None:
    """In a serving child that has taken on its caller's state (environment, working
    directory, attributes), while the client's "go" is on its way: whether the sandbox
    built ahead still stands, its arguments aside, which use() compares (~0.4 ms of a
    warm call, no longer waited for after the go). It reads, as the build did (a change
    after it is one made after the call, as a change after use() always was); if the
    sandbox stands, it then makes the call's private TMPDIR (_Prepared.private_tmp_now)."""
    global _early
    if _ready is not None:
        _early = (_ready, _ready.changed())
        if _early[1] is None:
            _ready.private_tmp_now()


def use(a, net_run: bool, cmd):
    """cli._sandbox_from_args in a serving child: (sandbox, timeout, lines to tell, -v
    notes) built ahead, if that is what these arguments build now, else None (the caller
    builds one). The call is reported, and the inotify descriptor closed, by after_call():
    neither is the caller's to wait for (closing one waits for the kernel's RCU grace)."""
    global _ready, _after
    ready, _ready = _ready, None
    key = _key(a, net_run, cmd)
    why = "none prepared" if ready is None else ready.stale(key, cmd)
    _after = (key, ready)
    from .. import launch
    if why is not None:
        launch.discard_parked()
    if os.environ.get("SANDLOCK_SERVICE_DEBUG"):
        print(f"sandlock: service: prepared sandbox "
              f"{'used' if why is None else 'not used: ' + why}", file=sys.stderr)
    return ready.built if why is None else None


def after_call() -> None:
    """In a serving child, once its client has the exit status: what use() left."""
    global _after
    after, _after = _after, None
    from .. import launch
    launch.discard_parked()  # one this call did not take (a command not found...)
    if after is not None:
        key, ready = after
        report(key)
        if ready is not None:
            ready.close()
