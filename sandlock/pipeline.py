"""Pipelines: `sb.cmd(argv) | other.cmd(argv) | ...`, each stage under its own policy and
supervisor, connected by kernel pipes. `run(timeout=...)` bounds the whole pipeline: at the
deadline every stage's process group is killed."""

from __future__ import annotations

import os
import threading
import time

from .result import ExitReason, Result


class Stage:
    def __init__(self, sandbox, argv):
        self.sandbox = sandbox
        self.argv = list(argv)

    def __or__(self, other) -> "Pipeline":
        return Pipeline([self]) | other


class Pipeline:
    def __init__(self, stages):
        self.stages = list(stages)

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
            last.error = f"the pipeline timed out (stage {timed_out[0] + 1} was killed)"
        return last
