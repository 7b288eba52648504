"""Where a sandbox path lives in a copy-on-write layer, and the layer's xattr names.

Imported by the supervisor's handlers at start-up, so it imports nothing heavy.
"""

from typing import NamedTuple

ORIGIN = "user.sandlock.origin"    # on placeholders and pending directories: lower relpath
PENDING = "user.sandlock.pending"  # on directories not yet materialized
IDENTITY = "user.sandlock.identity"  # on a copied-up file: "dev:ino" of its workdir origin
SEEN = "user.sandlock.seen"  # on a materialized directory: its file of names seen (layer.py)
XATTR_PREFIX = "user.sandlock."
MAX_LINKS = 40

UPPER, LOWER, MISSING, OUTSIDE = "upper", "lower", "missing", "outside"
# UPPER: `real` is an upper entry; LOWER: `real` is in the workdir (a placeholder's origin,
# or anything below a directory the sandbox never changed); `upper` is where the entry is
# or will be in the upper tree; `rel` is the symlink-free path below the workdir.


class Loc(NamedTuple):
    """Where a sandbox path lives. UPPER: `real` is an upper entry (directory, private file,
    symlink, fifo); LOWER: `real` is in the workdir (a placeholder's origin, or an entry
    below a directory never changed: files, directories, symlinks) and `upper` is where its
    upper entry is or will be; MISSING: nothing there yet, `real` is the upper path it
    would get (after concrete()); OUTSIDE: the path left the workdir, `real` is where."""
    kind: str
    real: str
    upper: str = ""
    rel: str = ""   # the path relative to the workdir (UPPER, LOWER, MISSING)
