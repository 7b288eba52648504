"""Files the user's startup files pull in: what a shell's startup file sources, what ssh's
config includes, what tmux's and vim's configs source. home_policy's persistence list
names the startup files themselves; a file one of them pulls in runs code as that file
does (a `source ~/dotfiles/aliases.sh` in ~/.bashrc, an `Include` whose hosts carry a
ProxyCommand), so it is protected as that file is: read-only where it is, never created
where it is not (home_policy.plan).

Found as the program would find it, statically: `~` and $HOME expanded (and, in a shell
file, a variable that file set to a static value before: `$NVM_DIR/nvm.sh`), a relative path
from where the program resolves it (the home, or ~/.ssh for ssh), a glob expanded (and
its directory kept whole, where a file made later would match; not a home itself);
followed into what those pull in, to MAX_DEPTH. A name built from anything else (another
variable, a command's output) is left out: it cannot be known before the run. Each file is
read bounded (MAX_BYTES); the whole walk too (MAX_FILES, refused beyond).
"""

from __future__ import annotations

import glob
import itertools
import os
import re

from ._kernel.fileops import read_regular
from .fs_rules import is_beneath

MAX_DEPTH = 5       # files pulled in by files pulled in...
MAX_FILES = 256     # in all, from one home
MAX_BYTES = 1 << 20
MAX_GLOB = 64       # paths a glob is followed into, at most (its directory is kept whole)

# Shell: `source FILE` or `. FILE` (nvm's installer writes `\.`) as a command (after a
# line's start, ;, &, |, (, {); and a variable given a value (`export NVM_DIR="$HOME/.nvm"`),
# which a later `source "$NVM_DIR/nvm.sh"` in the same file takes.
_SHELL = re.compile(r"""(?:^|[\s;&|({])(?:source|\\?\.)\s+(["']?)([^\s;&|()"'`]+)\1""")
_ASSIGN = re.compile(r"""^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)="""
                     r"""(["']?)([^"'\s;`]*)\2\s*(?:;|$)""")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_SSH = re.compile(r"^\s*include\s+(.+)$", re.IGNORECASE)
_TMUX = re.compile(r"""(?:^|[\s;])source(?:-file)?\s+(?:-[qnvF]+\s+)*(["']?)([^\s;"']+)\1""")
_VIM = re.compile(r"""^\s*(?:so|source)!?\s+(\S+)""")

SHELL = (".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc",
         ".zprofile", ".zshenv", ".zlogin", ".zlogout", ".bash_aliases", ".xsessionrc",
         ".xprofile", ".xinitrc", ".xsession", ".config/fish/config.fish")
OTHERS = {".ssh/config": "ssh", ".tmux.conf": "tmux", ".config/tmux/tmux.conf": "tmux",
          ".vimrc": "vim", ".vim/vimrc": "vim"}


def _expand(value: str, names: dict) -> str:
    """$NAME and ${NAME} replaced where `names` knows them (others left, then not
    followed)."""
    return _VAR.sub(lambda m: names.get(m.group(1) or m.group(2), m.group(0)), value)


def _names(kind: str, text: str, home: str) -> list[str]:
    out = []
    comment = '"' if kind == "vim" else "#"
    names = {"HOME": home}  # the file's own variables, as it sets them, in order
    for line in text.splitlines():
        if line.lstrip().startswith(comment):
            continue
        if kind == "shell":
            m = _ASSIGN.match(line)
            if m:
                names[m.group(1)] = _expand(m.group(3), names)
            out += [_expand(m.group(2), names) for m in _SHELL.finditer(line)]
        elif kind == "tmux":
            out += [m.group(2) for m in _TMUX.finditer(line)]
        elif kind == "vim":
            out += [m.group(1) for m in _VIM.finditer(line)]
        else:
            m = _SSH.match(line)
            if m:
                out += m.group(1).split()
    return out


def _resolve(name: str, home: str, base: str) -> list[str]:
    """The paths `name` names (several for a glob), or none where it is not static."""
    name = name.strip("\"'")
    for var in ("${HOME}", "$HOME"):
        if name.startswith(var):
            name = home + name[len(var):]
    if name.startswith("~/") or name == "~":
        name = home + name[1:]
    if "$" in name or "`" in name or name.startswith("~"):
        return []  # another variable, a command's output, another user's home
    path = os.path.normpath(os.path.join(base, name))
    if any(c in path for c in "*?["):
        # What it matches now, and the directory it matches in: a file made there later
        # is pulled in too (but a home itself, which a glob there would make read-only).
        head = path
        while any(c in head for c in "*?["):
            head = os.path.dirname(head)
        ahead = [] if head == home or is_beneath(home, head) else [head]
        return ahead + sorted(itertools.islice(glob.iglob(path), MAX_GLOB))  # bounded
    return [path]


def referenced(home_dirs, follow=lambda path: True) -> list[str]:
    """Every file the startup files of `home_dirs` pull in, transitively, as above; a file
    pulled in is read for what it pulls in only where `follow(path)` (the plan follows
    what lies in a home or beneath a writable grant, not the system's own scripts, which
    no sandbox can change: /etc/bash_completion is ~100 KB of shell)."""
    out: list[str] = []
    for home in home_dirs:
        seen: set[str] = set()
        level = [(os.path.join(home, rel), "shell") for rel in SHELL]
        level += [(os.path.join(home, rel), kind) for rel, kind in OTHERS.items()]
        for depth in range(MAX_DEPTH + 1):
            nxt = []
            for path, kind in level:
                if path in seen:
                    continue
                if len(seen) >= MAX_FILES:
                    from .errors import PolicyError
                    raise PolicyError(f"{home}: its startup files pull in over {MAX_FILES} "
                                      f"files: too many to check (grant less)")
                seen.add(path)
                if depth:
                    out.append(path)
                    if not follow(path):
                        continue
                data = read_regular(path, MAX_BYTES + 1)
                if not data:
                    continue
                if len(data) > MAX_BYTES:  # what lies beyond is unchecked: refused
                    from .errors import PolicyError
                    raise PolicyError(f"{path}: over {MAX_BYTES} bytes: too large to check "
                                      f"for the files it pulls in (grant less)")
                base = os.path.join(home, ".ssh") if kind == "ssh" else home
                for name in _names(kind, data.decode("utf-8", "replace"), home):
                    nxt += [(p, kind) for p in _resolve(name, home, base)]
            level = nxt
    return list(dict.fromkeys(out))
