"""What a sandbox may see and change of a user's home, under any grant: secrets are hidden,
persistence vectors are never changed.

Rules enforced (by sandlock.protect, from the plan made here):
- Secrets (`secret_paths`: SSH and cloud keys, credential files, password stores and
  keyrings, browser profiles, shell histories, Sandlock's own CA key) are denied under
  every grant, unless the user names that path itself (or a path beneath it: then only
  that path is reachable of it).
- Persistence vectors (`persistence_paths`: shell startup files, ~/.ssh, autostart and
  systemd user units, ~/.local/bin, and in any directory under a writable grant `.envrc`,
  editor task/launch configs `.vscode/` and `.idea/`, and `.git/hooks` and `.git/config`
  of the repositories that exist when the sandbox starts) are never created or changed
  under a writable grant, unless the user names that path in a writable grant: it is
  then theirs to open.
Only paths beneath a grant matter: a path no grant reaches is refused by Landlock anyway.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .fs_rules import is_beneath

SECRETS = (
    ".ssh", ".aws", ".gnupg", ".config/gcloud", ".azure", ".kube", ".docker/config.json",
    ".netrc", ".git-credentials", ".pypirc", ".npmrc", ".config/gh", ".config/hub",
    ".password-store", ".local/share/keyrings", ".gnome2/keyrings", ".config/keepassxc",
    ".pgpass", ".my.cnf", ".vault-token", ".s3cfg", ".boto", ".config/rclone/rclone.conf",
    ".cargo/credentials", ".cargo/credentials.toml", ".terraform.d/credentials.tfrc.json",
    ".config/op", ".local/share/sandlock/certs",
    # browser profiles
    ".mozilla", ".config/google-chrome", ".config/chromium", ".config/BraveSoftware",
    ".config/microsoft-edge", ".config/vivaldi", ".config/opera", "snap/firefox",
    "snap/chromium",
    # shell and interpreter histories
    ".bash_history", ".zsh_history", ".histfile", ".local/share/fish/fish_history",
    ".python_history", ".node_repl_history", ".psql_history", ".mysql_history",
    ".sqlite_history", ".lesshst", ".irb_history", ".rediscli_history",
)
PERSISTENCE = (
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc",
    ".zprofile", ".zshenv", ".zlogin", ".zlogout", ".config/fish", ".ssh",
    ".config/autostart", ".config/systemd/user", ".local/bin", ".xprofile", ".xinitrc",
    ".xsession", ".pam_environment", ".config/environment.d", ".envrc",
    # configuration that runs commands: git (hooks path, aliases), editors
    ".gitconfig", ".config/git", ".vimrc", ".config/nvim", ".emacs", ".emacs.d",
)
# Outside the home: crontabs and system-wide startup files (a writable grant of / as root).
SYSTEM_PERSISTENCE = (
    "/var/spool/cron", "/etc/crontab", "/etc/cron.d", "/etc/cron.hourly", "/etc/cron.daily",
    "/etc/cron.weekly", "/etc/cron.monthly", "/etc/anacrontab", "/etc/profile",
    "/etc/profile.d", "/etc/bash.bashrc", "/etc/zsh", "/etc/environment",
    "/etc/systemd/system", "/etc/rc.local", "/etc/ld.so.preload", "/etc/sudoers",
    "/etc/sudoers.d",
)
# Names protected in every directory under a writable grant (direnv, editors' task and
# launch configurations run commands when the user opens the directory).
PROJECT_FILES = (".envrc", ".vscode", ".idea")
REPO_FILES = ("hooks", "config")  # in the .git of a repository that exists at the start
SCAN_DEPTH = 4          # directories below a writable grant searched for repositories
SCAN_ENTRIES = 20000    # entries looked at, in all


def home() -> str:
    return os.path.realpath(os.path.expanduser("~"))


def secret_paths(home_dir: str | None = None) -> list[str]:
    """The secrets list, as absolute paths in `home_dir` (default: the user's home), with
    Sandlock's certificate store wherever $SANDLOCK_CERTS_DIR puts it."""
    h = home_dir or home()
    out = [os.path.join(h, rel) for rel in SECRETS]
    certs = os.environ.get("SANDLOCK_CERTS_DIR")
    if certs:
        out.append(os.path.realpath(certs))
    return out


def persistence_paths(home_dir: str | None = None) -> list[str]:
    """The persistence list: absolute paths in `home_dir` (default: the user's home), and
    the system's crontabs and startup files."""
    h = home_dir or home()
    return [os.path.join(h, rel) for rel in PERSISTENCE] + list(SYSTEM_PERSISTENCE)


@dataclass(frozen=True)
class HomePlan:
    hidden: tuple[str, ...]        # existing secrets beneath a grant: never readable
    readonly: tuple[str, ...]      # existing persistence vectors beneath a writable grant
    guarded: tuple[str, ...]       # absent persistence paths: never created
    repos: tuple[str, ...]         # .git directories found (their hooks/config protected)
    named: tuple[str, ...]         # what the user named (exempt)
    roots: tuple[str, ...] = ()    # writable grant directories (.envrc & co. refused there)

    @property
    def empty(self) -> bool:
        return not (self.hidden or self.readonly or self.guarded or self.repos or self.roots)


def _named_exempt(path: str, named) -> bool:
    """The user named this path or something beneath it."""
    return any(is_beneath(n, path) for n in named)


def _carve(path: str, named) -> list[str]:
    """`path` minus the user's named paths beneath it: the entries beside the way to each."""
    keep = [n for n in named if is_beneath(n, path) and n != path]
    if not keep:
        return [path]
    if any(n == path for n in named):
        return []
    out = []
    try:
        entries = os.listdir(path)
    except OSError:
        return []
    for name in entries:
        child = os.path.join(path, name)
        if any(is_beneath(n, child) for n in keep):
            out += _carve(child, keep) if os.path.isdir(child) and not \
                os.path.islink(child) else []
        else:
            out.append(child)
    return out


def _scan(roots, budget: list[int]) -> tuple[list[str], list[str]]:
    """`.git` directories below `roots` (bounded), and above them (a repository the grant
    lies inside of); and the PROJECT_FILES entries below them."""
    found, project = [], []
    for root in roots:
        p = root
        while p != "/":
            g = os.path.join(p, ".git")
            if os.path.isdir(g) and not os.path.islink(g):
                found.append(g)
                break
            p = os.path.dirname(p)
        stack = [(root, 0)]
        while stack and budget[0] > 0:
            d, depth = stack.pop()
            try:
                with os.scandir(d) as it:
                    for e in it:
                        budget[0] -= 1
                        if e.name in PROJECT_FILES:
                            project.append(e.path)
                        if not e.is_dir(follow_symlinks=False):
                            continue
                        if e.name == ".git":
                            found.append(e.path)
                        elif depth < SCAN_DEPTH and (not e.name.startswith(".") or
                                                     e.name in (".config", ".local")):
                            stack.append((e.path, depth + 1))
            except OSError:
                continue
    return sorted(set(found)), sorted(set(project))


def _beneath_grant(path: str, grants) -> bool:
    return any(is_beneath(path, g) and path != g for g in grants)


def plan(readable, writable, named=None, home_dir: str | None = None) -> HomePlan:
    """What to hide and protect for these grants (canonical paths). `named`: the paths the
    user wrote themselves (default: every grant): a secret named in any grant is exempt,
    a persistence vector only when named in a writable grant. A protected path that is a
    symlink is protected where it points too (its name stays guarded)."""
    h = home_dir or home()
    named = tuple(readable) + tuple(writable) if named is None else tuple(named)
    named_write = tuple(n for n in named if n in tuple(writable))
    grants = tuple(readable) + tuple(writable)
    hidden, readonly, guarded = [], [], []
    for s in secret_paths(h):
        if not os.path.lexists(s):
            continue
        for p in dict.fromkeys((s, os.path.realpath(s))):
            if _beneath_grant(p, grants):
                hidden += _carve(p, named)
    roots = [w for w in writable if w != "/dev/null" and os.path.isdir(w)]
    for p in persistence_paths(h):
        if _named_exempt(p, named_write) or any(is_beneath(p, x) for x in hidden):
            continue
        if not os.path.lexists(p):
            if _beneath_grant(p, writable):
                guarded.append(p)
            continue
        for q in dict.fromkeys((p, os.path.realpath(p))):
            if _beneath_grant(q, writable) and not _named_exempt(q, named_write):
                readonly.append(q)
    repos, project = _scan(roots, [SCAN_ENTRIES]) if roots else ([], [])
    for g in repos:
        for name in REPO_FILES:
            p = os.path.join(g, name)
            if os.path.lexists(p) and not _named_exempt(p, named_write) and \
                    _beneath_grant(p, writable):
                readonly.append(p)
    for p in project:
        if not _named_exempt(p, named_write):
            readonly.append(p)
    return HomePlan(tuple(dict.fromkeys(hidden)), tuple(dict.fromkeys(readonly)),
                    tuple(dict.fromkeys(guarded)), tuple(repos), tuple(named), tuple(roots))
