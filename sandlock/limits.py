"""Resource limits of a sandbox, without cgroups (these machines' cgroups belong to the
environment: nothing here creates, enters or changes one).

- max_memory: every process's RLIMIT_DATA (its own heap and private writable mappings:
  an allocation past it fails with ENOMEM, which a program can report), and the sandbox's
  total memory (proportional resident shares, Pss, plus the memfds its members hold),
  summed over its process tree every 10 ms by the sandbox's root (sandlock-init.c), which
  kills the whole tree past it (ExitReason.MEMORY).
- max_processes: live processes in the tree (threads not counted). Every process-creating
  clone/fork/vfork reaches the supervisor, which counts the tree and the forks it let
  through still inside their syscall (supervisor.forks): past the limit the call fails
  with EAGAIN, as it would past RLIMIT_NPROC.
- max_cpu: percent of one core for the whole tree (above 100: several cores). The root
  samples the tree's CPU time and, once a 100 ms window's share is used, stops every
  member (SIGSTOP) until the window ends; members stopped by anyone else are left alone.
- cpu_cores: the CPUs the sandbox runs on (sched_setaffinity on the program before it
  starts; its children inherit it, and the filter refuses sched_setaffinity).
A policy_fn may lower max_memory and max_processes mid-run (PolicyContext).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import PolicyError


@dataclass(frozen=True)
class Limits:
    memory: int | None = None      # bytes
    processes: int | None = None
    cpu: int | None = None         # percent of one core
    cores: tuple[int, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.memory or self.processes or self.cpu or self.cores)

    def control_lines(self) -> list[bytes]:
        """What the sandbox's root is told at the start (its control socket)."""
        out = []
        if self.memory:
            out.append(b"memory %d" % self.memory)
        if self.cpu:
            out.append(b"cpu %d" % self.cpu)
        return out


def parse_cores(value, field: str = "cpu_cores") -> tuple[int, ...]:
    """[0, 2] or "0,2-3" -> (0, 2, 3); every CPU must be one this process may run on."""
    if value in (None, (), [], ""):
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    cores: set[int] = set()
    for item in items:
        text = str(item).strip()
        lo, sep, hi = text.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or isinstance(item, bool):
            raise PolicyError(f"{field}: {item!r} is not a CPU number or range (e.g. 0,2-3)")
        cores.update(range(int(lo), int(hi if sep else lo) + 1))
    available = os.sched_getaffinity(0)
    missing = sorted(cores - available)
    if missing:
        raise PolicyError(f"{field}: CPU {missing[0]} is not available here (this process "
                          f"may run on {sorted(available)})")
    return tuple(sorted(cores))


def parse_limits(fields: dict) -> Limits:
    from .policy import parse_size
    memory = parse_size(fields.get("max_memory"), "max_memory")
    processes = fields.get("max_processes")
    if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int)
                                  or processes < 1):
        raise PolicyError(f"max_processes: expected a positive number of processes, got "
                          f"{processes!r}")
    cpu = fields.get("max_cpu")
    ncpu = len(os.sched_getaffinity(0))
    if cpu is not None:
        if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or \
                not 1 <= cpu <= 100 * ncpu:
            raise PolicyError(f"max_cpu: expected a percentage of one core, 1 to {100 * ncpu} "
                              f"here, got {cpu!r}")
        cpu = int(cpu)
    if memory is not None and memory < 1 << 20:
        raise PolicyError(f"max_memory: {memory} bytes is less than 1M: nothing could start")
    return Limits(memory, processes, cpu, parse_cores(fields.get("cpu_cores")))
