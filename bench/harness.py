"""Pieces shared by the benchmarks: paths, the worker client, statistics, wording."""

import json
import math
import shutil
import statistics
import subprocess
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORKER = BENCH / "worker.py"
OURS_PY = ROOT / ".venv" / "bin" / "python"
UPSTREAM_VENV = BENCH / ".venv-upstream"
UPSTREAM_PY = UPSTREAM_VENV / "bin" / "python"
UPSTREAM_VERSION = "0.9.0"


def ensure_setup():
    """Run setup_upstream.sh (idempotent) if the upstream venv or bwrap is missing."""
    if not UPSTREAM_PY.exists() or shutil.which("bwrap") is None:
        subprocess.run(["bash", str(BENCH / "setup_upstream.sh")], check=True)


class Worker:
    """A bench/worker.py child under a given interpreter; ask() sends one request."""

    def __init__(self, python):
        # -I: isolated mode, so neither PYTHONPATH nor the cwd can pick the wrong sandlock.
        self.proc = subprocess.Popen([str(python), "-I", str(WORKER)], cwd="/",
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def ask(self, req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args[0]} died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def stats(ns):
    """Latency statistics in milliseconds from a list of nanosecond samples."""
    ms = sorted(x / 1e6 for x in ns)
    p99 = ms[max(0, math.ceil(0.99 * len(ms)) - 1)]  # nearest rank
    return {"n": len(ms), "median": statistics.median(ms), "p99": p99,
            "mean": statistics.fmean(ms), "min": ms[0], "max": ms[-1]}


def verdict(ratio, peer):
    """Plain words for ours/peer: 'behind upstream_api by 1.30x' or 'ahead of ... by'."""
    if ratio >= 1:
        return f"behind {peer} by {ratio:.2f}x"
    return f"ahead of {peer} by {1 / ratio:.2f}x"
