"""Filesystem operations run in the current directory, printing what they observe.

Run once inside a sandbox with a copy-on-write workdir and once outside on a copy of the
same tree: the printed observations and the resulting trees must be identical.
"""
import hashlib
import os
import stat
import sys


def show(label, value):
    print(f"{label}: {value}")


def st(path, follow=True):
    s = os.stat(path, follow_symlinks=follow)
    kind = stat.S_IFMT(s.st_mode)
    size = s.st_size if stat.S_ISREG(s.st_mode) or stat.S_ISLNK(s.st_mode) else "-"
    return f"{kind:o} {stat.S_IMODE(s.st_mode):o} {size} nlink={s.st_nlink if not stat.S_ISDIR(s.st_mode) else '-'}"


def tree(top="."):
    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            line = f"{p} {st(p, follow=False)}"
            if os.path.islink(p):
                line += f" -> {os.readlink(p)}"
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    data = f.read()
                line += f" {data!r}" if len(data) <= 64 else \
                    f" sha256={hashlib.sha256(data).hexdigest()[:16]}"
            out.append(line)
    return out


def attempt(label, fn):
    try:
        show(label, fn())
    except OSError as e:
        show(label, f"error {e.errno}")


show("initial", tree())
show("listing", sorted(os.listdir(".")))
# reads of untouched files
with open("readme.txt") as f:
    show("read", f.read())
# O_TRUNC, O_APPEND, O_CREAT|O_EXCL
with open("readme.txt", "a") as f:
    f.write("appended\n")
with open("notes/todo.txt", "w") as f:
    f.write("truncated and rewritten\n")
attempt("excl", lambda: os.close(os.open("readme.txt", os.O_CREAT | os.O_EXCL | os.O_WRONLY)))
fd = os.open("new.txt", os.O_CREAT | os.O_WRONLY, 0o640)
os.write(fd, b"brand new\n")
os.close(fd)
show("new stat", st("new.txt"))
# mkdir, nested files, rmdir of non-empty and empty
os.mkdir("build", 0o750)
os.makedirs("build/out/deep")
with open("build/out/deep/artifact.bin", "wb") as f:
    f.write(bytes(range(256)) * 4)
attempt("rmdir nonempty", lambda: os.rmdir("notes"))
os.mkdir("empty")
os.rmdir("empty")
attempt("rmdir gone", lambda: os.rmdir("empty"))
# unlink, rename over, rename of a directory, exchange-like moves
os.unlink("data/old.csv")
attempt("unlink missing", lambda: os.unlink("data/old.csv"))
os.rename("data/keep.csv", "data/renamed.csv")
os.rename("lib", "lib2")
show("after dir rename", sorted(os.listdir("lib2")))
with open("lib2/mod.py") as f:
    show("read moved", f.read())
os.rename("new.txt", "readme.txt") if False else None
attempt("rename onto nonempty dir", lambda: os.rename("build", "lib2"))
# symlinks and hard links
os.symlink("readme.txt", "link-to-readme")
os.symlink("/nonexistent/target", "dangling")
show("readlink", os.readlink("link-to-readme"))
with open("link-to-readme") as f:
    show("through link", f.read())
os.link("data/renamed.csv", "data/hard.csv")
with open("data/hard.csv", "a") as f:
    f.write("via hard link\n")
with open("data/renamed.csv") as f:
    show("hard link shares", f.read())
show("nlink", os.stat("data/hard.csv").st_nlink)
# chmod, truncate, utimes
os.chmod("script.sh", 0o755)
show("chmod", st("script.sh"))
os.truncate("big.txt", 10)
show("truncate", st("big.txt"))
os.utime("readme.txt", (1_000_000_000, 1_000_000_000))
show("utime", os.stat("readme.txt").st_mtime)
# access
show("access w", os.access("notes/todo.txt", os.W_OK))
show("access x", os.access("script.sh", os.X_OK))
attempt("access missing", lambda: os.access("nope", os.F_OK) or "False")
# stat of missing and of deleted
attempt("stat deleted", lambda: os.stat("data/old.csv"))
# directory listing with scandir types
show("scandir", sorted((e.name, e.is_dir(), e.is_symlink()) for e in os.scandir(".")))
# cwd inside an unchanged subdirectory
os.chdir("notes")
show("cwd rel read", open("todo.txt").read())
os.chdir("..")
show("final", tree())
