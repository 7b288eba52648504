"""Directory fds and the working directory across renames and removals, printed so that
the run in a workspace can be compared with the same run on a real filesystem.
Run from the top of the tree made by tests/test_cow.py (notes/, data/, lib/)."""

import os
import subprocess
import sys

root = os.getcwd()


def show(what, fn):
    try:
        print(what, fn())
    except OSError as e:
        print(what, "error", e.errno)


def read_at(dfd, name):
    fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


def create_at(dfd, name):
    os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dfd))
    return "created"


if sys.argv[1:] == ["changed"]:
    with open("first.txt", "w") as f:  # the layer's first change, before the fds are taken
        f.write("1\n")
notes = os.open("notes", os.O_RDONLY | os.O_DIRECTORY)
data = os.open("data", os.O_RDONLY | os.O_DIRECTORY)
os.chdir("lib")

os.rename(f"{root}/notes", f"{root}/memo")
show("notes fd, after notes -> memo", lambda: read_at(notes, "todo.txt"))
show("create through it", lambda: create_at(notes, "added.txt"))
os.mkdir(f"{root}/notes")  # a new directory under the old name
show("notes fd, after a new notes/", lambda: read_at(notes, "todo.txt"))

os.rename(f"{root}/lib", f"{root}/lib2")
show("cwd, after lib -> lib2", lambda: open("mod.py").read())
show("getcwd", lambda: os.path.relpath(os.getcwd(), root))
show("create in cwd", lambda: create_at(None, "made.py"))
show("a child in the cwd", lambda: subprocess.run(["cat", "mod.py"], capture_output=True).stdout)

os.rename(f"{root}/data", f"{root}/memo/data")  # into a directory that moved itself
show("data fd, two moves", lambda: read_at(data, "keep.csv"))
for name in ("keep.csv", "old.csv"):
    os.unlink(f"{root}/memo/data/{name}")
os.rmdir(f"{root}/memo/data")
show("data fd, removed", lambda: read_at(data, "keep.csv"))
show("create in it", lambda: create_at(data, "late.csv"))
show("memo", lambda: sorted(os.listdir(f"{root}/memo")))
show("lib2", lambda: sorted(os.listdir(f"{root}/lib2")))
show("notes", lambda: sorted(os.listdir(f"{root}/notes")))
