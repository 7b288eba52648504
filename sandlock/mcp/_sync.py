"""The `--cow` workspace's commit: what the tools changed in the staging tree, replayed on
the workspace. Runs inside a sandbox whose workdir is the workspace, copy-on-write, so
that its writes land in a layer that sandlock's own commit applies (crash-safely, the
user's protected files refused) or discards; stdlib only (the server passes this file's
text to `python -I -S -c`).

    _sync MANIFEST        (working directory: the workspace)

MANIFEST (JSON, written by the server when the staging tree was made):
{"tree": STAGING, "entries": {REL: {"kind", "ino", "ctime", "mode", "w": WSTATE}}}, where
WSTATE is the workspace entry's [kind, size, mtime_ns, mode] at that time (or null).

An entry of the staging tree changed if it is new, or its inode, ctime (which no
program can set back) or kind differ. A change conflicts when the workspace entry it
replaces changed since the copy was made (the user edited it meanwhile): then nothing is
written, the conflicts are printed, and the exit status is 3.
"""

import json
import os
import stat
import sys


def kind(mode: int) -> str:
    return ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "symlink"
            if stat.S_ISLNK(mode) else "other")


def wstate(rel: str):
    try:
        st = os.lstat(rel)
    except FileNotFoundError:
        return None
    return [kind(st.st_mode), st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode)]


def scan(tree: str) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(tree, followlinks=False):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, tree)] = os.lstat(full)
    return out


def same(entry: dict, st) -> bool:
    return (entry["kind"] == kind(st.st_mode) and entry["ino"] == st.st_ino
            and entry["ctime"] == st.st_ctime_ns)


def remove(rel: str) -> None:
    st = os.lstat(rel)
    if stat.S_ISDIR(st.st_mode):
        os.rmdir(rel)  # emptied by the deletions before it, or the user added to it
    else:
        os.unlink(rel)


def copy_file(src: str, rel: str, st) -> None:
    tmp = os.path.join(os.path.dirname(rel), f".{os.path.basename(rel)}.sandlock-sync")
    sfd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600)
        try:
            while True:
                chunk = os.read(sfd, 1 << 20)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dfd, view):]
            os.fchmod(dfd, stat.S_IMODE(st.st_mode))
            os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    os.replace(tmp, rel)


def main(manifest_path: str) -> int:
    with open(manifest_path) as f:
        manifest = json.load(f)
    tree, entries = manifest["tree"], manifest["entries"]
    now = scan(tree)
    changed = sorted(r for r, st in now.items() if r not in entries or not same(entries[r], st))
    deleted = sorted((r for r in entries if r not in now), key=lambda r: -r.count("/"))
    conflicts, skipped, done = [], [], []
    for rel in changed + deleted:
        entry = entries.get(rel)
        st = now.get(rel)
        was = entry["w"] if entry is not None else None
        here = wstate(rel)
        if here is not None and here[0] == "dir" and (
                (st is not None and stat.S_ISDIR(st.st_mode))   # merged into a directory
                or (st is None and was is not None and was[0] == "dir")):  # rmdir decides
            continue
        if here != was:
            conflicts.append({"path": rel, "reason": "changed in the workspace since the "
                              "staging copy was made" if was is not None else
                              "created in the workspace since the staging copy was made"})
    if conflicts:
        print(json.dumps({"conflicts": conflicts}))
        return 3
    try:
        for rel in deleted:
            if os.path.lexists(rel):
                remove(rel)
                done.append(["deleted", rel])
        for rel in changed:
            st = now[rel]
            entry = entries.get(rel)
            src = os.path.join(tree, rel)
            here = wstate(rel)
            if here is not None and here[0] != kind(st.st_mode):
                remove(rel)
                here = None
            if stat.S_ISDIR(st.st_mode):
                if here is None:
                    os.mkdir(rel, stat.S_IMODE(st.st_mode))
                elif entry is None or entry["mode"] != stat.S_IMODE(st.st_mode):
                    os.chmod(rel, stat.S_IMODE(st.st_mode))
            elif stat.S_ISLNK(st.st_mode):
                if here is not None:
                    os.unlink(rel)
                os.symlink(os.readlink(src), rel)
            elif stat.S_ISREG(st.st_mode):
                copy_file(src, rel, st)
            else:
                skipped.append(rel)
                continue
            done.append(["added" if entry is None else "changed", rel])
    except OSError as e:
        print(json.dumps({"conflicts": [{"path": e.filename or "?",
                                         "reason": e.strerror or str(e)}]}))
        return 3
    print(json.dumps({"done": done, "skipped": skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
