"""Pipelines: `sb.cmd(argv) | other.cmd(argv) | ...`, each stage under its own policy and
supervisor, connected by kernel pipes. `run(timeout=...)` bounds the whole pipeline: at the
deadline every stage's process group is killed.

Fan-in (upstream's gather): `a.cmd(...).as_("code") + b.cmd(...).as_("data") | c.cmd(...)`
runs the producers side by side, each under its own policy, and hands each one's output
to the consumer on a pipe of its own; the consumer reads them by name
(`from sandlock import inputs; inputs["code"]`, sandlock._inputs), or on fds 3, 4, ... in
order (a shell: `cat <&3`). The last producer is the consumer's stdin."""

from __future__ import annotations

import os
import threading
import time

from .result import ExitReason, Result


class Stage:
    def __init__(self, sandbox, argv):
        self.sandbox = sandbox
        self.argv = list(argv)

    @property
    def args(self) -> list[str]:  # upstream's name
        return self.argv

    def __or__(self, other) -> "Pipeline":
        if isinstance(other, Stage):
            return Pipeline([self, other])
        if isinstance(other, Pipeline):
            return Pipeline([self, *other.stages])
        return NotImplemented

    def as_(self, name: str) -> "NamedStage":
        """This stage's output, named for a fan-in consumer."""
        return NamedStage(self, name)

    def run(self, timeout: float | None = None) -> Result:
        return self.sandbox.run(self.argv, timeout=timeout)


class NamedStage:
    def __init__(self, stage: Stage, name: str):
        if not isinstance(name, str) or not name or any(c in name for c in ",:\0"):
            raise ValueError(f"a stage's name is a non-empty string without ',' or ':', "
                             f"got {name!r}")
        self.stage, self.name = stage, name

    def __add__(self, other) -> "Gather":
        return Gather([(self.name, self.stage)]) + other


class Gather:
    def __init__(self, sources):
        self.sources = list(sources)
        names = [n for n, _ in self.sources]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"two producers are named {sorted(dup)[0]!r}")

    def __add__(self, other) -> "Gather":
        if isinstance(other, NamedStage):
            return Gather(self.sources + [(other.name, other.stage)])
        if isinstance(other, Gather):
            return Gather(self.sources + other.sources)
        return NotImplemented

    def __or__(self, other) -> "GatherPipeline":
        if not isinstance(other, Stage):
            return NotImplemented
        return GatherPipeline(self.sources, other)


class GatherPipeline:
    def __init__(self, sources, consumer: Stage):
        self.sources, self.consumer = list(sources), consumer

    def run(self, timeout: float | None = None) -> Result:
        """Run the producers in parallel and the consumer; returns the consumer's Result
        with `stages` holding the producers' Results (in order) then the consumer's. The
        timeout bounds them all."""
        from .sandbox import StdioMode
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in self.sources]
        procs = []
        try:
            for (name, stage), (_, w) in zip(self.sources, pipes):
                procs.append(stage.sandbox.popen(stage.argv, stdin=StdioMode.NULL, stdout=w,
                                                 stderr=StdioMode.PIPED))
            passed = [r for r, _ in pipes[:-1]]
            mapping = [f"{name}:{3 + i}" for i, (name, _) in enumerate(self.sources[:-1])]
            mapping.append(f"{self.sources[-1][0]}:0")
            c = self.consumer
            procs.append(c.sandbox.popen(c.argv, stdin=pipes[-1][0], stdout=StdioMode.PIPED,
                                         stderr=StdioMode.PIPED, pass_fds=passed,
                                         extra_env={"_SANDLOCK_GATHER": ",".join(mapping)}))
        except BaseException:
            for p in procs:
                p.kill()
                p.close()
            raise
        finally:
            for r, w in pipes:  # the stages hold their own ends now
                os.close(r)
                os.close(w)
        return _collect(procs, timeout, "the fan-in pipeline")


class Pipeline:
    def __init__(self, stages, *, single: bool = False):
        self.stages = list(stages)
        if len(self.stages) < (1 if single else 2):
            raise ValueError("a Pipeline needs at least 2 stages (run a single Stage with "
                             "its run())")

    def __or__(self, other) -> "Pipeline":
        if isinstance(other, Stage):
            return Pipeline(self.stages + [other])
        if isinstance(other, Pipeline):
            return Pipeline(self.stages + other.stages)
        return NotImplemented

    def run(self, stdout=None, timeout: float | None = None, stdin=None) -> Result:
        """Run every stage; returns the last stage's Result, with `stages` holding each
        stage's Result in order. `stdout`/`stdin` may be fds for the ends of the pipeline
        (default: the last stage's output is captured, the first stage reads nothing)."""
        from .sandbox import StdioMode
        n = len(self.stages)
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(n - 1)]
        procs = []
        try:
            for i, stage in enumerate(self.stages):
                s_in = pipes[i - 1][0] if i > 0 else (stdin if stdin is not None
                                                       else StdioMode.NULL)
                s_out = pipes[i][1] if i < n - 1 else (stdout if stdout is not None
                                                        else StdioMode.PIPED)
                procs.append(stage.sandbox.popen(stage.argv, stdin=s_in, stdout=s_out,
                                                 stderr=StdioMode.PIPED))
        except BaseException:
            for p in procs:
                p.close()
            raise
        finally:
            for r, w in pipes:  # the stages hold their own ends now
                os.close(r)
                os.close(w)
        return _collect(procs, timeout, "the pipeline")


def _collect(procs, timeout, what) -> Result:
    """Wait for every process (the deadline for all at once); the last one's Result with
    `stages` holding each one's."""
    n = len(procs)
    deadline = None if timeout is None else time.monotonic() + timeout
    results: list = [None] * n

    def collect(i):
        with procs[i]:
            results[i] = procs[i].communicate()
    threads = [threading.Thread(target=collect, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        # The deadline, for the whole pipeline at once, last stage first: a stage must
        # not see EOF from a killed upstream stage and end as if it had finished.
        for proc in reversed(procs):
            proc.time_out()
    for t in threads:
        t.join()
    last = results[-1]
    last.stages = results
    timed_out = [i for i, r in enumerate(results) if r.reason == ExitReason.TIMEOUT]
    if timed_out and last.reason != ExitReason.TIMEOUT:
        # The last stage may have ended on EOF once an earlier stage was killed at the
        # deadline: the pipeline still timed out.
        last.reason = ExitReason.TIMEOUT
        last.success = False
        last.error = f"{what} timed out (stage {timed_out[0] + 1} was killed)"
    return last
