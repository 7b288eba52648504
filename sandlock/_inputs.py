"""`from sandlock import inputs`: a fan-in consumer reads its producers' outputs by name.

    code = inputs["code"]     # the whole output of the stage named "code" (text)

The pipeline (sandlock.pipeline.GatherPipeline) hands each producer's output to the
consumer on a pipe and says which in `_SANDLOCK_GATHER` ("name:fd,..."; the last producer
is stdin, fd 0). Each input is read to its end on first use and kept. Standard library
only: this runs inside the sandbox.
"""

from __future__ import annotations

import os


class _Inputs:
    def __init__(self):
        self._cache: dict[str, str] = {}
        self._fds: dict[str, int] | None = None

    def _map(self) -> dict[str, int]:
        if self._fds is None:
            self._fds = {}
            for pair in filter(None, os.environ.get("_SANDLOCK_GATHER", "").split(",")):
                name, _, fd = pair.rpartition(":")
                self._fds[name] = int(fd)
        return self._fds

    def __getitem__(self, name: str) -> str:
        if name not in self._cache:
            fds = self._map()
            if name not in fds:
                raise KeyError(f"no input named {name!r} (there are: {', '.join(fds) or 'none'})")
            fd = fds[name]
            with os.fdopen(fd, "r", closefd=fd > 2) as f:  # stdin stays open, at EOF
                self._cache[name] = f.read()
        return self._cache[name]

    def get(self, name: str, default=None):
        return self[name] if name in self else default

    def __contains__(self, name) -> bool:
        return name in self._map()

    def keys(self):
        return self._map().keys()

    def __iter__(self):
        return iter(self._map())

    def __len__(self) -> int:
        return len(self._map())

    def __repr__(self) -> str:
        return "inputs({" + ", ".join(
            f"{n!r}: <{'read' if n in self._cache else f'fd {fd}'}>"
            for n, fd in self._map().items()) + "})"


inputs = _Inputs()
