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

import collections
import os
import stat
from dataclasses import dataclass

from . import mountinfo
from ._kernel.fileops import open_regular, read_regular
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
    # sourced by the usual startup files, or on PATH before the system (~/bin)
    ".bash_aliases", ".xsessionrc", "bin", ".pythonrc", ".pythonrc.py",
    # configuration that runs commands: git (hooks path, aliases), editors, terminals
    ".gitconfig", ".config/git", ".vimrc", ".vim", ".config/nvim", ".emacs", ".emacs.d",
    ".tmux.conf", ".config/tmux", ".config/direnv", ".local/share/applications",
    ".ipython/profile_default/startup",
    # package managers and build tools: indexes, hooks and init scripts they run
    ".config/pip", ".pip", ".condarc", ".yarnrc", ".yarnrc.yml", ".cargo/config",
    ".cargo/config.toml", ".gradle/init.d", ".gradle/init.gradle", ".m2/settings.xml",
)
# Outside the home: crontabs and system-wide startup files (a writable grant of / as root).
SYSTEM_PERSISTENCE = (
    "/var/spool/cron", "/etc/crontab", "/etc/cron.d", "/etc/cron.hourly", "/etc/cron.daily",
    "/etc/cron.weekly", "/etc/cron.monthly", "/etc/anacrontab", "/etc/profile",
    "/etc/profile.d", "/etc/bash.bashrc", "/etc/zsh", "/etc/environment",
    "/etc/systemd/system", "/etc/systemd/user", "/lib/systemd/system",
    "/usr/lib/systemd/system", "/etc/init.d", "/etc/rc.local", "/etc/xdg/autostart",
    "/etc/update-motd.d", "/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/etc/sudoers", "/etc/sudoers.d", "/etc/pam.d", "/etc/security", "/etc/passwd",
    "/etc/shadow", "/etc/group", "/etc/gshadow", "/etc/ssh", "/etc/apt/apt.conf.d",
    "/etc/modprobe.d", "/usr/local/bin", "/usr/local/sbin",
)
# Names protected in every directory under a writable grant (direnv, editors' task and
# launch configurations run commands when the user opens the directory).
PROJECT_FILES = (".envrc", ".vscode", ".idea")
# In a repository's git directory (.git, and .git/modules/NAME, .git/worktrees/NAME): what
# git reads to find code to run (hooks, core.hooksPath, filters, fsmonitor) or another git
# directory to use instead (commondir, gitdir).
REPO_FILES = ("hooks", "config", "config.worktree", "commondir", "gitdir")
SCAN_DEPTH = 8          # directories below a writable grant searched for repositories
SCAN_ENTRIES = 100000   # entries looked at, in all
# Trees never searched for repositories: caches and installed packages.
SCAN_SKIP = ("node_modules", "site-packages", "dist-packages", "__pycache__", ".cache",
             "target", ".tox", ".nox", "venv", ".venv", ".mypy_cache", ".gradle", ".m2")


def home() -> str:
    return os.path.realpath(os.path.expanduser("~"))


def homes(home_dir: str | None = None) -> list[str]:
    """The homes whose files are protected: the user's; started as root, every home
    (/root, /home/*), which root's grants can reach."""
    out = [home_dir or home()]
    if os.geteuid() == 0:
        for h in ["/root"] + [os.path.join("/home", n) for n in _listdir("/home")]:
            h = os.path.realpath(h)
            if os.path.isdir(h) and h not in out:
                out.append(h)
    return out


def _mounts_of(dev: int, table) -> list[tuple[str, str]]:
    """(root in the filesystem, mount point) of every mount of device `dev` in `table`
    (mountinfo.mounts())."""
    key = f"{os.major(dev)}:{os.minor(dev)}"
    return [(root, point) for d, root, point, _ in table if d == key]


def exposures(path: str, table=None) -> list[tuple[str, str]]:
    """Other places the directory `path` (or a directory beneath it) is reached through,
    by another mount of its filesystem (a bind mount of a home elsewhere): (alias, what
    it is): the alias stands for `path` itself, or for a directory beneath it. The plan
    works by path, so an alias's secrets are protected by their alias paths too."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return []
    mounts = _mounts_of(dev, mountinfo.mounts() if table is None else table)
    above = [(root, mp) for root, mp in mounts if is_beneath(path, mp)]
    if not above:
        return []
    root0, mp0 = max(above, key=lambda m: len(m[1]))
    inner = os.path.normpath(os.path.join(root0, os.path.relpath(path, mp0)))  # not "//"
    out = []
    for root, mp in mounts:
        if (root, mp) == (root0, mp0):
            continue
        if is_beneath(inner, root):  # the whole of `path`, under mp
            out.append((os.path.normpath(os.path.join(mp, os.path.relpath(inner, root))),
                        path))
        elif is_beneath(root, inner):  # a directory beneath it, at mp
            out.append((mp, os.path.normpath(os.path.join(path, os.path.relpath(root, inner)))))
    return [(a, w) for a, w in out if not is_beneath(a, path)]  # a mount within it: the same


def _aliased(paths, exposed) -> list[str]:
    """`paths` and, for each, its alias paths (exposures)."""
    out = list(paths)
    for alias, real in exposed:
        out += [os.path.normpath(alias + "/" + os.path.relpath(p, real))
                for p in paths if is_beneath(p, real)]
    return out


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


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
    homes: tuple[str, ...] = ()    # the homes protected (the user's; as root, every one)
    named_write: tuple[str, ...] = ()  # named in a writable grant: what is beneath is theirs

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


def _git_dir_of(entry: str) -> str | None:
    """The git directory a `.git` entry stands for: itself, or the one a gitfile names."""
    if os.path.isdir(entry) and not os.path.islink(entry):
        return entry
    head = read_regular(entry, 4096)  # a FIFO planted as .git never stalls a build
    if head is None or not head.startswith(b"gitdir:"):
        return None
    target = os.fsdecode(head[7:].split(b"\n", 1)[0].strip())
    return os.path.realpath(os.path.join(os.path.dirname(entry), target))


def _scan(roots, budget: list[int]) -> tuple[list[str], list[str]]:
    """Git directories below `roots` (bounded; caches and package trees skipped), and
    above them (a repository the grant lies inside of); and the PROJECT_FILES entries."""
    found, project = [], []
    for root in roots:
        p = root
        while p != "/":
            g = _git_dir_of(os.path.join(p, ".git"))
            if g is not None:
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
                        if e.name == ".git":
                            g = _git_dir_of(e.path)
                            if g is not None:
                                found.append(g)
                            continue
                        if not e.is_dir(follow_symlinks=False) or e.name in SCAN_SKIP:
                            continue
                        if depth < SCAN_DEPTH and (not e.name.startswith(".") or
                                                   e.name in (".config", ".local")):
                            stack.append((e.path, depth + 1))
            except OSError:
                continue
    return sorted(set(found)), sorted(set(project))


def git_dirs_within(gitdir: str, budget: int = 2000) -> list[str]:
    """A git directory and those it holds: submodules' (modules/NAME, nested) and linked
    worktrees' (worktrees/NAME)."""
    out, todo = [], [gitdir]
    while todo and budget > 0:
        g = todo.pop()
        out.append(g)
        for sub in ("modules", "worktrees"):
            base = os.path.join(g, sub)
            for dirpath, dirnames, filenames in os.walk(base):
                budget -= 1
                if "HEAD" in filenames and dirpath != base:
                    todo.append(dirpath)
                    dirnames[:] = []
                if budget <= 0:
                    break
    return out


MAX_LINE = 1 << 16  # a git config line longer than this is read as several
MAX_CONFIG = 1 << 20  # bytes of a git config read for core.hooksPath, at most


MAX_INCLUDE_DEPTH = 10  # git's own limit on include chains
MAX_CONFIGS = 256       # git config files followed from one set of configs, at most


def _git_config(cfg: str) -> tuple[list[str], list[str]] | None:
    """(core.hooksPath values, include paths as written) of the git config file `cfg`, or
    None where there is none. A hooksPath key counts in any section; a path key in
    [include] and in [includeIf ...], whatever its condition. Read line by line, each
    bounded, and the whole too: what lies beyond is unchecked, so refused."""
    if os.path.realpath(cfg).startswith(("/proc/", "/sys/")):
        return None  # no git config (git would not finish reading one either)
    fd = open_regular(cfg)
    if fd is None:
        return None
    hooks = collections.deque(maxlen=64)  # git uses the last: the last ones are kept
    includes: list[str] = []
    section, read = "", 0
    with os.fdopen(fd, "rb") as f:
        for raw in iter(lambda: f.readline(MAX_LINE), b""):
            read += len(raw)
            if read > MAX_CONFIG:
                from .errors import PolicyError
                raise PolicyError(f"{cfg}: over {MAX_CONFIG} bytes: too large to check "
                                  f"for core.hooksPath (remove it or grant less)")
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("["):  # [section] or [section "sub"], a key may follow
                end = line.find("]")
                section = line[1:end if end > 0 else None].split('"')[0].strip().lower()
                line = line[end + 1:].strip() if end > 0 else ""
            key, sep, value = line.partition("=")
            if not sep:
                continue
            key, value = key.strip().lower(), value.strip().strip('"')
            if key == "hookspath":
                hooks.append(value)
            elif key == "path" and section in ("include", "includeif") and value:
                includes.append(value)
    return list(hooks), includes


def git_configs(configs: list[str], home: str | None = None) -> list[tuple[str, list]]:
    """(path, its core.hooksPath values) of `configs` and of every file they include,
    transitively (git's depth limit), as git finds them: `~/` from `home` (the user's own
    where None), a relative path from the including file's directory. Each included file
    runs code as the config does (hooks path, aliases, core.fsmonitor): protected as it
    is."""
    out, seen = [], set()
    level = list(configs)
    for _ in range(MAX_INCLUDE_DEPTH + 1):
        nxt = []
        for cfg in level:
            if cfg in seen:
                continue
            if len(seen) >= MAX_CONFIGS:  # what lies beyond is unchecked: refused
                from .errors import PolicyError
                raise PolicyError(f"{configs[0]}: includes over {MAX_CONFIGS} git config "
                                  f"files: too many to check (remove some or grant less)")
            seen.add(cfg)
            parsed = _git_config(cfg)
            out.append((cfg, parsed[0] if parsed else []))
            for inc in parsed[1] if parsed else ():
                if inc.startswith("~/") and home is not None:
                    inc = os.path.join(home, inc[2:])
                inc = os.path.expanduser(inc)
                nxt.append(os.path.normpath(os.path.join(os.path.dirname(cfg), inc)))
        level = nxt
    return out


GLOBAL_CONFIGS = (".gitconfig", ".config/git/config")


def home_configs(home_dirs) -> list[tuple[str, list]]:
    """git_configs() of each home's global configs."""
    return [c for h in home_dirs
            for c in git_configs([os.path.join(h, rel) for rel in GLOBAL_CONFIGS], h)]


def hooks_paths(gitdir: str, worktree: str | None, home_dirs, global_configs=None
                ) -> list[str]:
    """Directories a core.hooksPath setting names (the repository's config, the user's
    global ones, and what each includes): git runs what is there as hooks.
    `global_configs`: home_configs(home_dirs), if read already."""
    out = []
    for cfg, values in git_configs([os.path.join(gitdir, "config")]):
        base = worktree or os.path.dirname(cfg)
        out += [os.path.realpath(os.path.join(base, os.path.expanduser(v))) for v in values]
    if global_configs is None:
        global_configs = home_configs(home_dirs)
    for cfg, values in global_configs:
        out += [os.path.realpath(os.path.join(os.path.dirname(cfg), os.path.expanduser(v)))
                for v in values]
    return out


def _symlinked_secrets(directory: str, budget: int = 2000) -> list[str]:
    """Where the symlinks inside a secret directory lead (dotfiles managers: ~/.ssh/id_x
    -> ~/dotfiles/ssh/id_x): those are secrets too."""
    out = []
    for dirpath, dirnames, filenames in os.walk(directory):
        for n in dirnames + filenames:
            budget -= 1
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                out.append(os.path.realpath(p))
        if budget <= 0:
            break
    return out


def _grant_set(grants) -> frozenset[str]:
    """`grants` as _beneath_grant takes them (a trailing slash dropped, as is_beneath)."""
    return frozenset(g.rstrip("/") or "/" for g in grants)


def _beneath_grant(path: str, grants: frozenset[str]) -> bool:
    """`path` lies strictly below one of `grants` (a _grant_set): one of its ancestors is
    a grant. The same as any(is_beneath(path, g) and path != g) for canonical `path`, in
    a few lookups instead of one comparison per grant (a plan asks thousands of times)."""
    while True:
        head = path.rpartition("/")[0] or "/"
        if head == path:
            return False
        if head in grants:
            return True
        path = head


class _Resolver:
    """os.path.realpath for absolute paths without "." or ".." components, resolving each
    parent directory once (a plan resolves ~100 paths in a handful of directories): the
    last component is looked at with one lstat, and a symlink there is left to
    os.path.realpath itself."""

    def __init__(self):
        self._dirs: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        parent, _, name = path.rpartition("/")
        parent = parent or "/"
        real = self._dirs.get(parent)
        if real is None:
            real = self._dirs[parent] = os.path.realpath(parent)
        full = os.path.join(real, name)
        try:
            if stat.S_ISLNK(os.lstat(full).st_mode):
                return os.path.realpath(full)
        except OSError:
            pass
        return full


def plan(readable, writable, named=None, home_dir: str | None = None) -> HomePlan:
    """What to hide and protect for these grants (canonical paths). `named`: the paths the
    user wrote themselves (default: every grant): a secret named in any grant is exempt,
    a persistence vector only when named in a writable grant. A protected path that is a
    symlink is protected where it points too (its name stays guarded)."""
    named = tuple(readable) + tuple(writable) if named is None else tuple(named)
    named_write = tuple(n for n in named if n in tuple(writable))
    grants = _grant_set(tuple(readable) + tuple(writable))
    wgrants = _grant_set(writable)
    all_homes = homes(home_dir)
    table = mountinfo.mounts()
    exposed = [e for h in all_homes for e in exposures(h, table)]
    realpath = _Resolver()
    hidden, readonly, guarded = [], [], []
    own = [s for h in all_homes for s in secret_paths(h)]
    secrets = _aliased(own, exposed)
    for s in secrets[len(own):]:  # another mount's path to a secret: naming it is no consent
        for g in tuple(readable) + tuple(writable):
            if is_beneath(g, s) and os.path.lexists(s):
                from .errors import PolicyError
                raise PolicyError(f"{g} is a secret of a home reached through another mount "
                                  f"({s}); grant the secret by its own path to share it")
    for s in secrets:
        if not os.path.lexists(s):
            if _beneath_grant(s, wgrants) and not _named_exempt(s, named_write):
                guarded.append(s)  # a credential file planted there could run code
            continue
        targets = [s, realpath(s)]
        if os.path.isdir(s):
            targets += _symlinked_secrets(s)
        for p in dict.fromkeys(targets):
            if _beneath_grant(p, grants):
                hidden += _carve(p, named)
    roots = [w for w in writable if w != "/dev/null" and os.path.isdir(w)]
    vectors = _aliased([p for h in all_homes for p in persistence_paths(h)], exposed)

    def keep(p: str) -> None:
        """A persistence vector: read-only where it is, never created where it is not."""
        if _named_exempt(p, named_write) or any(is_beneath(p, x) for x in hidden):
            return
        if not os.path.lexists(p):
            if _beneath_grant(p, wgrants):
                guarded.append(p)
            return
        for q in dict.fromkeys((p, realpath(p))):
            if _beneath_grant(q, wgrants) and not _named_exempt(q, named_write):
                readonly.append(q)
    for p in dict.fromkeys(vectors):
        keep(p)
    # Only a writable grant can make anything of theirs writable: what the global git
    # configs include, and what the startup files source and include.
    global_configs = home_configs(all_homes) if wgrants else []
    tops = {os.path.join(h, rel) for h in all_homes for rel in GLOBAL_CONFIGS}  # vectors
    for p, _ in global_configs:
        if p not in tops:
            keep(p)
    if wgrants:
        from .sourced import referenced
        for p in referenced(all_homes, lambda p: _beneath_grant(p, wgrants) or any(
                is_beneath(p, h) for h in all_homes)):
            keep(p)
    found, project = _scan(roots, [SCAN_ENTRIES]) if roots else ([], [])
    repos = []
    for g in found:
        worktree = os.path.dirname(g) if os.path.basename(g) == ".git" else None
        for gd in git_dirs_within(g):
            repos.append(gd)
            for name in REPO_FILES:
                p = os.path.join(gd, name)
                if os.path.lexists(p) and not _named_exempt(p, named_write) and \
                        _beneath_grant(p, wgrants):
                    readonly.append(p)
            for p, _ in git_configs([os.path.join(gd, "config")])[1:]:  # its includes
                keep(p)
        for hp in hooks_paths(g, worktree, all_homes, global_configs):
            if _beneath_grant(hp, wgrants) and not _named_exempt(hp, named_write):
                (readonly if os.path.lexists(hp) else guarded).append(hp)
    for p in project:
        if not _named_exempt(p, named_write):
            readonly.append(p)
    return HomePlan(tuple(dict.fromkeys(hidden)), tuple(dict.fromkeys(readonly)),
                    tuple(dict.fromkeys(guarded)), tuple(dict.fromkeys(repos)), tuple(named),
                    tuple(roots), tuple(all_homes), named_write)
