"""read_file / write_file / list_files, run inside the tool's sandbox (stdlib only; the
server passes this file's text to `python -I -S -c`).

    _fileops read  REL MAX_BYTES        -> JSON on stdout
    _fileops write REL MAX_BYTES        (content on stdin)
    _fileops list  REL MAX_ENTRIES

REL is relative to the working directory (the workspace) and was checked by the server
(no `..`, not absolute). Here every component is opened with O_NOFOLLOW from the
workspace down, so a symbolic link swapped in after that check is refused (ELOOP), never
followed; Landlock decides the rest (EACCES). Errors: {"ok": false, "errno": NAME,
"error": text, "at": component}, exit status 1.
"""

import base64
import errno
import json
import os
import stat
import sys

# Directories on the way are opened O_PATH: a lookup needs no right on them (a directory
# holding a denied path has no read right under Landlock, yet what lies beside it may).
DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LISTED = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def fail(err: OSError, at: str) -> None:
    code = errno.errorcode.get(err.errno or 0, str(err.errno))
    print(json.dumps({"ok": False, "errno": code, "error": err.strerror or str(err),
                      "at": at}))
    sys.exit(1)


def walk(parts, create=False):
    """An fd on the directory holding the last component of `parts`."""
    fd = os.open(".", DIR)
    done = []
    for name in parts[:-1]:
        done.append(name)
        try:
            try:
                nfd = os.open(name, DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                nfd = os.open(name, DIR, dir_fd=fd)
        except OSError as e:
            fail(e, "/".join(done))
        os.close(fd)
        fd = nfd
    return fd


def main(argv) -> None:
    op, rel, limit = argv[0], argv[1], int(argv[2])
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if op == "list":
        fd = walk(parts or ["."])
        try:
            fd = os.open(parts[-1] if parts else ".", LISTED, dir_fd=fd)
        except OSError as e:
            fail(e, rel or ".")
        entries = []
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    if len(entries) >= limit:
                        break
                    st = entry.stat(follow_symlinks=False)
                    kind = ("dir" if stat.S_ISDIR(st.st_mode) else "file"
                            if stat.S_ISREG(st.st_mode) else "symlink"
                            if stat.S_ISLNK(st.st_mode) else "other")
                    entries.append({"name": entry.name, "kind": kind, "size": st.st_size})
        except OSError as e:
            fail(e, rel or ".")
        entries.sort(key=lambda e: e["name"])
        print(json.dumps({"ok": True, "entries": entries, "truncated": len(entries) >= limit}))
        return
    if not parts:
        fail(OSError(errno.EISDIR, "is the workspace itself"), ".")
    fd = walk(parts, create=op == "write")
    name = parts[-1]
    if op == "read":
        try:
            ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                          dir_fd=fd)
            st = os.fstat(ffd)
            if stat.S_ISDIR(st.st_mode):
                raise OSError(errno.EISDIR, "a directory (list_files lists it)")
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            data = b""
            while len(data) <= limit:
                chunk = os.read(ffd, 65536)
                if not chunk:
                    break
                data += chunk
        except OSError as e:
            fail(e, rel)
        truncated = len(data) > limit
        data = data[:limit]
        try:
            out = {"text": data.decode("utf-8")}
        except UnicodeDecodeError:
            out = {"base64": base64.b64encode(data).decode()}
        print(json.dumps({"ok": True, "size": st.st_size, "truncated": truncated, **out}))
        return
    if op == "write":
        content = sys.stdin.buffer.read(limit + 1)
        if len(content) > limit:
            fail(OSError(errno.EFBIG, f"content over {limit} bytes"), rel)
        try:
            ffd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                          | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=fd)
            if not stat.S_ISREG(os.fstat(ffd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            view = memoryview(content)
            while view:
                view = view[os.write(ffd, view):]
            os.close(ffd)
        except OSError as e:
            fail(e, rel)
        print(json.dumps({"ok": True, "size": len(content)}))
        return
    fail(OSError(errno.EINVAL, f"unknown operation {op}"), rel)


if __name__ == "__main__":
    main(sys.argv[1:])
