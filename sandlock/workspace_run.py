"""A run's copy-on-write workdir (sandlock.cow): started with the run, finished with it
(commit, abort, keep or defer, crash-safely), reported in its Result."""

from __future__ import annotations

import os

from .errors import SandlockError
from .fs_rules import is_beneath
from .modes import BranchAction, _action
from .policy import Policy
from .result import Result


class _Workspace:
    """A run's copy-on-write layer and what its outcome did with it."""

    RELEASE_WAIT = 2.0  # seconds for the supervisor to see the last sandboxed task go

    def __init__(self, layer, on_exit, on_error, max_disk):
        self.layer = layer
        self.on_exit, self.on_error = on_exit, on_error
        self.max_disk = max_disk
        self.changes: list = []
        self.refused: list = []  # (change, reason) never applied (protected files)
        self.action: BranchAction | None = None
        self.pending = False
        self.error: str | None = None

    @classmethod
    def start(cls, policy: Policy, on_exit, on_error, session,
              pwd: str | None = None) -> "_Workspace | None":
        """`pwd`: the run's $PWD (the seccomp backend takes its spelling of the workdir)."""
        ws = policy.workspace
        if ws is None:
            return None
        from . import cow
        try:
            layer = cow.create(ws.workdir, ws.storage, policy.name, ws.backend)
        except OSError as e:
            raise SandlockError(f"fs_storage: cannot create the copy-on-write layer in "
                                f"{ws.storage}: {e.strerror}") from None
        if ws.backend == "seccomp":  # the supervisor serves the workdir's path calls
            try:
                cwd = policy.cwd or os.getcwd()
            except OSError:
                cwd = None  # started in a removed directory: no $PWD spelling
            layer.alias(ws.spelled, cwd, pwd)
            session.cow = layer
            session.cow_max_disk = ws.max_disk
        return cls(layer, _action(on_exit, "on_exit"), _action(on_error, "on_error"),
                   ws.max_disk)

    @property
    def run_rules(self) -> dict | None:
        """Landlock rules of this run's own (the seccomp backend's layer: its upper tree is
        read and executed by the kernel for exec and chdir re-issued there; never written
        but by the supervisor)."""
        if getattr(self.layer, "backend", None) == "overlay":
            return None
        from .fs_rules import READ_RIGHTS
        return {self.layer.upper: READ_RIGHTS}

    @property
    def overlay(self) -> tuple[str, str, str] | None:
        """(lower, upper, work) for the trampoline's overlay mount (overlay backend)."""
        layer = self.layer
        if getattr(layer, "backend", None) != "overlay":
            return None
        return layer.lower, layer.upper, layer.work

    def finish(self, session, success: bool) -> None:
        """Apply on_exit or on_error once every sandboxed task is gone."""
        from . import cow
        action = self.on_exit if success else self.on_error
        if not session.released.wait(self.RELEASE_WAIT):
            # A task of the sandbox still runs (nothing may change the layer during a diff
            # or a commit): leave the layer as it is.
            self.action = BranchAction.KEEP
            self.error = (f"sandboxed processes were still running after the program ended; "
                          f"{action.value} not done, layer kept in {self.layer.root}")
            try:
                cow.keep(self.layer, None)
            except OSError:
                pass
            return
        checked = False
        try:
            self.changes = cow.diff(self.layer)
            self._refuse_protected(session)
            checked = True
            if self.max_disk is not None and action == BranchAction.COMMIT:
                used = self.layer.usage()
                if used > self.max_disk:
                    action = BranchAction.ABORT
                    self.error = (f"the workspace used {used} bytes, over max_disk "
                                  f"({self.max_disk}): changes discarded")
            self._apply(action)
        except Exception as e:  # never lose the layer on a failure: keep it for a retry
            try:  # a failed commit's or abort's layer: its changes as read, if they were
                cow.keep(self.layer, self.changes if checked else None)
            except OSError:
                pass
            self.action = BranchAction.KEEP
            self.error = f"copy-on-write {action.value} failed: {e}; layer kept in " \
                         f"{self.layer.root}"

    def _refuse_protected(self, session) -> None:
        """Changes to the user's protected files (protect_user_files) are never applied:
        inside the workdir the sandbox wrote to its layer, so they are refused here, at
        the commit, and listed in `refused`."""
        prot = session.protection
        if prot is None:
            return
        kept, held = [], []  # held: directories kept whole (their replacement refused)
        for change in self.changes:
            real = os.path.join(self.layer.lower, change.path)
            why = prot.refusal(real)
            replaced = change.action == "deleted" or (
                change.before is not None and change.after is not None
                and change.before.kind != change.after.kind)  # .git dir -> a gitfile
            if why is None and replaced:
                why = prot.moves(real)
                if why is not None:
                    held.append(real)
            if why is None:
                kept.append(change)
            else:
                self.refused.append((change, why))
        if held:  # nothing beneath a directory kept whole changes either
            inside = [c for c in kept if any(
                is_beneath(os.path.join(self.layer.lower, c.path), h) for h in held)]
            kept = [c for c in kept if c not in inside]
            self.refused += [(c, f"it lies in {h}, which is kept whole") for c in inside
                             for h in held[:1]]
        if self.refused:
            self.changes = kept
            first = self.refused[0][1]
            self.error = (f"{len(self.refused)} change(s) to protected files not applied "
                          f"(e.g. {first})")

    def _apply(self, action: BranchAction) -> None:
        from . import cow
        self.action = action
        if action == BranchAction.COMMIT:
            cow.commit(self.layer, self.changes)
        elif action == BranchAction.ABORT:
            self.layer.discard()
        elif action == BranchAction.DEFER:
            self.pending = True
        elif action == BranchAction.KEEP:
            cow.keep(self.layer, self.changes)

    def commit(self) -> None:
        """Apply a deferred run's changes to the workdir."""
        if not self.pending:
            raise SandlockError("nothing to commit: the run's outcome was not DEFER, or it "
                                "was already committed or aborted")
        from . import cow
        cow.commit(self.layer, self.changes)
        self.pending = False
        self.action = BranchAction.COMMIT

    def abort(self) -> None:
        """Discard a deferred run's changes."""
        if not self.pending:
            raise SandlockError("nothing to abort: the run's outcome was not DEFER, or it "
                                "was already committed or aborted")
        self.layer.discard()
        self.pending = False
        self.action = BranchAction.ABORT

    def report(self, result: Result) -> None:
        result.changes = list(self.changes)
        result.pending = self.pending
        result.workspace = self
        if self.action == BranchAction.KEEP:
            result.kept = self.layer.root
        if self.error:
            result.error = f"{result.error}; {self.error}" if result.error else self.error
