"""`sandlock mcp --cow`: tool calls change a private staging copy of the workspace; the
client lists, commits or discards what they changed, across any number of calls.

Why a copy: each tool call is a fresh sandbox, and a copy-on-write layer belongs to one
run (Sandbox.popen creates it), so changes cannot pile up in one layer across calls. The
staging tree is made once (and again after each commit or discard) by `cp` inside a
sandbox under the user-file protection (a secret the tools could not read is not copied
out of its place either). The commit is a sandboxed run too (_sync.py): its workdir is the
workspace, copy-on-write, so what it writes is applied by sandlock's own crash-safe
commit, which refuses changes to the user's protected files; `changes` is the same run
discarded (a dry run), listing exactly what a commit would change. A workspace entry that
changed since the copy was made and that the tools changed too is a conflict: nothing is
applied. Uncommitted changes are discarded when the server ends.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import threading

from ..errors import SandlockError
from . import runner

COMMIT_TIMEOUT = 600.0
COPY_TIMEOUT = 600.0


def _source(name: str) -> str:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)) as f:
        return f.read()


class Staging:
    def __init__(self, workspace: str, storage: str, auditor: runner.Auditor,
                 interpreter: tuple[str, list[str]]):
        import secrets
        from ..fs_rules import is_beneath
        self.workspace = os.path.realpath(workspace)
        storage = os.path.realpath(storage)
        if is_beneath(storage, self.workspace) or is_beneath(self.workspace, storage):
            raise SandlockError(f"--storage {storage}: must not contain the workspace or "
                                f"lie inside it")
        os.makedirs(storage, mode=0o700, exist_ok=True)
        label = os.path.basename(self.workspace) or "workspace"
        self.root = os.path.join(storage, f"{label[:40]}-{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(self.root, 0o700)
        self.tree = os.path.join(self.root, "tree")
        self.manifest = os.path.join(self.root, "manifest.json")
        self.auditor = auditor
        self.python, self.python_grants = interpreter
        self.lock = threading.Lock()  # tool calls, changes, commit, discard: one at a time
        self.notes: list[str] = []

    # -- the staging tree -----------------------------------------------------------------

    def make(self) -> None:
        """(Re)build the staging tree from the workspace, and its manifest."""
        from ..policy_file import system_fields
        if os.path.lexists(self.tree):
            shutil.rmtree(self.tree)
        os.mkdir(self.tree, 0o755)
        fields = dict(system_fields())
        fields["fs_readable"] = fields["fs_readable"] + [self.workspace]
        fields["fs_writable"] = fields["fs_writable"] + [self.tree]
        fields.update(clean_env=True, protect_user_files=True, cwd=self.workspace,
                      name="mcp-staging")
        out = runner.run(fields, ["cp", "-R", "-P", "--preserve=mode,timestamps",
                                  "--reflink=auto", self.workspace + "/.", self.tree],
                         tool="staging", source="sandlock mcp --cow", auditor=self.auditor,
                         timeout=COPY_TIMEOUT)
        if out.timed_out:
            raise SandlockError(f"copying {self.workspace} to the staging tree took over "
                                f"{COPY_TIMEOUT:g}s")
        if not out.success:
            lines = out.stderr.decode(errors="replace").strip().splitlines()
            self.notes = [f"not copied to the staging tree ({len(lines)} message(s) from "
                          f"cp, e.g. {lines[0] if lines else out.error})"]
            print(f"sandlock mcp: note: {self.notes[0]}", file=sys.stderr)
        self._write_manifest()

    def _write_manifest(self) -> None:
        entries = {}
        for dirpath, dirs, files in os.walk(self.tree, followlinks=False):
            for name in dirs + files:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.tree)
                st = os.lstat(full)
                entries[rel] = {"kind": _kind(st.st_mode), "ino": st.st_ino,
                                "ctime": st.st_ctime_ns, "mode": stat.S_IMODE(st.st_mode),
                                "w": _wstate(os.path.join(self.workspace, rel))}
        tmp = self.manifest + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"tree": self.tree, "entries": entries}, f)
        os.replace(tmp, self.manifest)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # -- changes, commit, discard -------------------------------------------------------

    def _sync(self, apply: bool) -> runner.CallOutcome:
        from ..policy_file import system_fields
        fields = dict(system_fields())
        fields["fs_readable"] = fields["fs_readable"] + [self.tree, self.manifest] + \
            self.python_grants
        fields.update(clean_env=True, protect_user_files=True, cwd=self.workspace,
                      workdir=self.workspace, fs_storage=os.path.join(self.root, "layers"),
                      name="mcp-commit", on_exit="commit" if apply else "abort",
                      on_error="abort")
        return runner.run(fields, [self.python, "-I", "-S", "-c", _source("_sync.py"),
                                   self.manifest],
                          tool="commit" if apply else "changes", source="sandlock mcp --cow",
                          auditor=self.auditor, timeout=COMMIT_TIMEOUT)

    def changes(self) -> dict:
        out = self._sync(apply=False)
        return self._report(out, applied=False)

    def commit(self) -> dict:
        out = self._sync(apply=True)
        report = self._report(out, applied=out.success)
        if out.success:
            self.make()
        return report

    def discard(self) -> dict:
        self.make()
        return {"ok": True, "applied": False, "discarded": True, "workspace": self.workspace,
                "changes": [], "refused": [], "conflicts": [], "skipped": [], "denials": [],
                "notes": list(self.notes)}

    def _report(self, out: runner.CallOutcome, applied: bool) -> dict:
        try:
            said = json.loads(out.stdout or b"{}")
        except ValueError:
            said = {}
        conflicts = said.get("conflicts") or []
        report = {
            "ok": out.success, "applied": applied, "workspace": self.workspace,
            "changes": [_change(c) for c in out.changes],
            "refused": [{**_change(c), "reason": why} for c, why in out.refused],
            "conflicts": conflicts, "skipped": said.get("skipped") or [],
            "denials": out.denials, "notes": list(self.notes),
        }
        if not out.success and not conflicts:
            err = out.stderr.decode(errors="replace").strip()[-2000:]
            report["error"] = out.error or err or f"exit status {out.exit_code}"
        return report


def _kind(mode: int) -> str:
    return ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "symlink"
            if stat.S_ISLNK(mode) else "other")


def _wstate(path: str):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [_kind(st.st_mode), st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode)]


def _change(c) -> dict:
    def side(e):
        if e is None:
            return None
        out = {"kind": e.kind, "mode": f"{e.mode:04o}", "size": e.size}
        digest = e.digest
        if e.kind == "file":
            out["sha256"] = digest.hex() if isinstance(digest, bytes) else digest
        elif e.kind == "symlink":
            out["target"] = os.fsdecode(digest) if isinstance(digest, bytes) else digest
        return out
    return {"path": c.path, "action": c.action, "before": side(c.before),
            "after": side(c.after), "line": c.describe()}
