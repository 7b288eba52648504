"""The user's own toolchain: what `sandlock run` and `net-run` grant beyond the system
directories so that a pyenv or nvm Python, a uv/conda/pipx tool, ~/.local/bin and
~/.cargo/bin programs run, and git finds its configuration.

Rules:
- Read and execute only, never write; never a path of the secrets list (home_policy).
- What the command line names is resolved as the kernel would run it: through PATH, every
  symlink on the way, `#!` interpreters (and `/usr/bin/env NAME` through PATH again),
  version-manager shims, and a Python virtualenv's base installation. Each program's
  installation tree is granted: its version manager's root for a managed one (pyenv,
  asdf, mise, nvm, volta, uv, pipx, conda, cargo/rustup, Homebrew...), else the prefix
  above its bin/ directory.
- PATH entries that belong to a version manager grant that manager's root too, so that a
  shell that runs `python3` later finds the same interpreter.
- Per-user configuration that tools read and that holds no credentials (~/.gitconfig,
  ~/.config/git/, ~/.tool-versions, ...) is granted read-only.
Every grant carries the reason it was made: `-v` and `policy check` print them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ._kernel.fileops import read_regular
from .fs_rules import is_beneath

# Version managers: (name, environment variable naming the root, default root in $HOME)
MANAGERS = (
    ("pyenv", "PYENV_ROOT", ".pyenv"), ("asdf", "ASDF_DATA_DIR", ".asdf"),
    ("mise", "MISE_DATA_DIR", ".local/share/mise"), ("nvm", "NVM_DIR", ".nvm"),
    ("volta", "VOLTA_HOME", ".volta"), ("uv", "UV_PYTHON_INSTALL_DIR", ".local/share/uv"),
    ("pipx", "PIPX_HOME", ".local/pipx"), ("pipx", None, ".local/share/pipx"),
    ("cargo", "CARGO_HOME", ".cargo"), ("rustup", "RUSTUP_HOME", ".rustup"),
    ("conda", None, "miniconda3"), ("conda", None, "anaconda3"),
    ("conda", None, "miniforge3"), ("conda", None, "mambaforge"), ("conda", None, ".conda"),
    ("rbenv", "RBENV_ROOT", ".rbenv"), ("nodenv", "NODENV_ROOT", ".nodenv"),
    ("bun", "BUN_INSTALL", ".bun"), ("deno", "DENO_INSTALL", ".deno"),
    ("rye", "RYE_HOME", ".rye"), ("sdkman", "SDKMAN_DIR", ".sdkman"),
    ("go", "GOPATH", "go"), ("pnpm", "PNPM_HOME", ".local/share/pnpm"),
    ("homebrew", None, ".linuxbrew"),
)
SYSTEM_MANAGERS = (("homebrew", "/home/linuxbrew/.linuxbrew"),)
# Per-user configuration tools read, none of which holds credentials.
CONFIG_FILES = (".gitconfig", ".config/git", ".gitignore_global", ".tool-versions",
                ".python-version", ".nvmrc", ".node-version", ".config/mise",
                ".config/uv", ".condarc", ".cargo/config.toml", ".editorconfig",
                ".inputrc", ".terminfo", ".config/pypoetry/config.toml")
MAX_HOPS = 12


@dataclass(frozen=True)
class Grant:
    path: str
    why: str


class _Grants:
    def __init__(self, home: str, env):
        self.home = home
        self.env = env
        self.out: dict[str, str] = {}
        self._roots: list[tuple[str, str]] | None = None
        from .home_policy import secret_paths
        self.secrets = secret_paths(home)

    def copy(self) -> "_Grants":
        """The same grants, to add to independently (the manager roots as resolved, if
        they were: a list never changed once made)."""
        c = object.__new__(_Grants)
        c.home, c.env, c.secrets = self.home, self.env, self.secrets
        c._roots = self._roots
        c.out = dict(self.out)
        return c

    def add(self, path: str, why: str) -> None:
        path = os.path.realpath(path)
        if not os.path.exists(path) or path in ("/", self.home):
            return
        if any(is_beneath(path, s) for s in self.secrets):
            return  # never a secret, whatever the reason
        if any(is_beneath(path, g) for g in self.out):
            return
        for g in [g for g in self.out if is_beneath(g, path)]:
            del self.out[g]  # a wider grant replaces narrower ones
        self.out[path] = why

    def _manager_roots(self) -> list[tuple[str, str]]:
        """Each manager's root, resolved once per call of toolchain_grants."""
        if self._roots is None:
            self._roots = []
            for name, var, default in MANAGERS:
                root = self.env.get(var) if var else None
                self._roots.append(
                    (name, os.path.realpath(root or os.path.join(self.home, default))))
        return self._roots

    def manager_of(self, path: str) -> tuple[str, str] | None:
        for name, root in self._manager_roots():
            if is_beneath(path, root) and os.path.isdir(root):
                return name, root
        for name, root in SYSTEM_MANAGERS:
            if is_beneath(path, root):
                return name, root
        return None


def _which(name: str, path_env: str, cwd: str | None) -> str | None:
    if "/" in name:
        full = name if os.path.isabs(name) else os.path.join(cwd or ".", name)
        return full if os.path.exists(full) else None
    for directory in path_env.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _shebang(path: str) -> list[str]:
    head = read_regular(path, 256)
    if head is None or not head.startswith(b"#!"):
        return []
    return os.fsdecode(head[2:].split(b"\n", 1)[0]).split()


def _follow(program: str, g: _Grants, path_env: str, cwd, why: str, depth: int = 0) -> None:
    """Grant what running `program` (a path) needs, hop by hop."""
    if depth > MAX_HOPS:
        return
    hop = program
    for _ in range(MAX_HOPS):
        _grant_for(hop, g, why)
        if not os.path.islink(hop):
            break
        target = os.readlink(hop)
        hop = os.path.normpath(os.path.join(os.path.dirname(hop), target))
    real = os.path.realpath(program)
    _grant_for(real, g, why)
    words = _shebang(real)
    if words:
        interp = words[0]
        if os.path.basename(interp) == "env" and len(words) > 1:
            args = [w for w in words[1:] if not w.startswith("-")]
            found = _which(args[0], path_env, cwd) if args else None
            if found:
                _follow(found, g, path_env, cwd, f"{why} -> #! env {args[0]}", depth + 1)
        elif os.path.exists(interp):
            _follow(interp, g, path_env, cwd, f"{why} -> #! {interp}", depth + 1)
    cfg = os.path.join(os.path.dirname(os.path.dirname(real)), "pyvenv.cfg")
    hop_cfg = os.path.join(os.path.dirname(os.path.dirname(program)), "pyvenv.cfg")
    for candidate in {cfg, hop_cfg}:
        data = read_regular(candidate, 65536)
        for line in (data or b"").decode("utf-8", "replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                base = os.path.join(value.strip(), "python3")
                _follow(base if os.path.exists(base) else value.strip(), g,
                        path_env, cwd, f"{why} -> virtualenv base", depth + 1)


def _venv_of(path: str) -> str | None:
    """The Python virtualenv a program or bin/ directory belongs to (its pyvenv.cfg)."""
    d = path if os.path.isdir(path) else os.path.dirname(path)
    root = os.path.dirname(d) if os.path.basename(d) == "bin" else None
    if root and os.path.isfile(os.path.join(root, "pyvenv.cfg")):
        return root
    return None


def _grant_for(path: str, g: _Grants, why: str) -> None:
    """The installation tree of one hop: its manager's root, else the prefix above bin/.
    A virtualenv is granted wherever it is (an activated /tmp/venv too)."""
    venv = _venv_of(path)
    if venv is not None and not is_beneath(venv, g.home):
        g.add(venv, f"{why}: virtualenv")
        return
    if not is_beneath(path, g.home) and not any(is_beneath(path, r)
                                                for _, r in SYSTEM_MANAGERS):
        return  # system directories are granted anyway
    managed = g.manager_of(path)
    if managed is not None:
        g.add(managed[1], f"{why}: {managed[0]} installation")
        return
    parent = os.path.dirname(path)
    if os.path.basename(parent) == "bin" and os.path.dirname(parent) != g.home:
        g.add(os.path.dirname(parent), f"{why}: installation prefix")
    else:
        g.add(parent if os.path.isdir(path) is False else path, f"{why}: program directory")


class Toolchains:
    """toolchain_grants in two steps: what PATH grants, read once (`env`, `cwd`, `home`
    as toolchain_grants takes them), then grants(argv0) for any command, which reads
    that command's files and the per-user configuration again each time. The CLI service
    keeps one with a sandbox built ahead (service/prepared.py): another command may take
    that sandbox only if its grants are the same, both ways."""

    def __init__(self, env=None, cwd: str | None = None, home: str | None = None):
        env = os.environ if env is None else env
        home = os.path.realpath(home or env.get("HOME") or os.path.expanduser("~"))
        g = _Grants(home, env)
        self.path_env = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        self.cwd = cwd
        for entry in self.path_env.split(os.pathsep):
            if not entry or not os.path.isdir(entry):
                continue
            real = os.path.realpath(entry)
            managed = g.manager_of(real)
            venv = _venv_of(entry)
            if venv is not None:
                g.add(venv, f"PATH entry {entry} (virtualenv)")
            elif managed is not None:
                g.add(managed[1], f"PATH entry {entry} ({managed[0]})")
            elif is_beneath(real, home) and real != home:
                g.add(real, f"PATH entry {entry}")
        self._path_part = g

    def grants(self, argv0: str | None) -> list[Grant]:
        g = self._path_part.copy()
        if argv0:
            found = _which(argv0, self.path_env, self.cwd)
            if found:
                _follow(found, g, self.path_env, self.cwd, f"command {argv0}")
        for rel in CONFIG_FILES:
            p = os.path.join(g.home, rel)
            if os.path.exists(p):
                g.add(p, "per-user configuration (no credentials)")
        return [Grant(p, why) for p, why in sorted(g.out.items())]


def toolchain_grants(argv0: str | None, env=None, cwd: str | None = None,
                     home: str | None = None) -> list[Grant]:
    """What the user's toolchain needs granted (read + execute), with the reasons."""
    return Toolchains(env, cwd, home).grants(argv0)
