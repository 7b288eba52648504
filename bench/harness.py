"""Pieces shared by the benchmarks: paths, the worker client, statistics, wording."""

import json
import os
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
    """Run setup_upstream.sh (idempotent) if the upstream venv, bwrap or redis is missing."""
    tools = ("bwrap", "redis-server", "redis-benchmark")
    if not UPSTREAM_PY.exists() or any(shutil.which(t) is None for t in tools):
        subprocess.run(["bash", str(BENCH / "setup_upstream.sh")], check=True)


class Worker:
    """A bench/worker.py child under a given interpreter; ask() sends one request."""

    def __init__(self, python, env=None):
        # -I: isolated mode, so neither PYTHONPATH nor the cwd can pick the wrong sandlock.
        self.proc = subprocess.Popen([str(python), "-I", str(WORKER)], cwd="/",
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1,
                                     env={**os.environ, **env} if env else None)

    def ask(self, req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args[0]} died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def start_workers():
    """The three peer interpreters: ours (imports our sandlock), upstream (imports
    upstream's) and plain (our venv too, but its ops never import sandlock)."""
    return {"ours": Worker(OURS_PY), "upstream": Worker(UPSTREAM_PY), "plain": Worker(OURS_PY)}


def check_imports(workers):
    """Fail unless each worker imported the sandlock it should; returns what they said."""
    ours = workers["ours"].ask({"op": "info"})
    if not ours["file"].startswith(str(ROOT / "sandlock")):
        raise RuntimeError(f"ours worker imported the wrong sandlock: {ours}")
    up = workers["upstream"].ask({"op": "info"})
    if up["version"] != UPSTREAM_VERSION:
        raise RuntimeError(f"upstream worker imported the wrong sandlock: {up}")
    return {"ours": ours, "upstream": up}


def rotations(peers, rounds):
    """The peer order of each round: every peer once, the first one rotating from round
    to round so no peer always follows the same one."""
    for i in range(rounds):
        k = i % len(peers)
        yield peers[k:] + peers[:k]


def stats(ns, unit=1e6):
    """Latency statistics from a list of nanosecond samples, in milliseconds (unit=1e6)
    or microseconds (unit=1e3)."""
    v = sorted(x / unit for x in ns)
    p99 = v[max(0, math.ceil(0.99 * len(v)) - 1)]  # nearest rank
    return {"n": len(v), "median": statistics.median(v), "p99": p99,
            "mean": statistics.fmean(v), "min": v[0], "max": v[-1]}


def verdict(ratio, peer):
    """Plain words for ours/peer: 'behind upstream_api by 1.30x' or 'ahead of ... by'."""
    if ratio >= 1:
        return f"behind {peer} by {ratio:.2f}x"
    return f"ahead of {peer} by {1 / ratio:.2f}x"


def main(doc: str, run, markdown) -> None:
    """A benchmark module's command line: `--quick` for fewer rounds; prints its table."""
    import argparse
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    ensure_setup()
    print(markdown(run(quick=a.quick)))
