"""The cost of explain=True (--explain): every path call goes to the supervisor, which
records the ones the policy refuses; and of `sandlock learn`'s run (explain on every
access, a copy-on-write workdir, report-only network). Medians of a Python start and `git
status` in a small repository: bare, sandboxed, with explain, learning.

    .venv/bin/python bench/explain.py [--runs N]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sandlock import Sandbox, system_devices, system_readable  # noqa: E402


def median_ms(fn, runs):
    fn()  # warm
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    runs = ap.parse_args().runs
    repo = tempfile.mkdtemp(prefix="sandlock-bench-git-")
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    subprocess.run(["git", "init", "-q", repo], check=True, env=env)
    for i in range(200):
        Path(repo, f"f{i}.txt").write_text(f"{i}\n")
    subprocess.run(["git", "-C", repo, "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", repo, "-c", "user.name=b", "-c", "user.email=b@x", "commit",
                    "-qm", "x"], check=True, env=env)
    cases = {"python3 -c pass": ["/usr/bin/python3", "-c", "pass"],
             "git status (200 files)": ["git", "-C", repo, "status", "--porcelain"]}
    grants = dict(fs_readable=system_readable() + [repo], fs_writable=system_devices())
    plain, explained = Sandbox(**grants), Sandbox(**grants, explain=True)
    from sandlock.learn import run_learning
    print(f"{'command':26} {'bare':>9} {'sandbox':>9} {'explain':>9} {'learn':>9} "
          f"{'explain/sandbox':>16}")
    for name, argv in cases.items():
        bare = median_ms(lambda: subprocess.run(argv, env=env, capture_output=True), runs)
        sb = median_ms(lambda: plain.run(argv), runs)
        ex = median_ms(lambda: explained.run(argv), runs)
        le = median_ms(lambda: run_learning(argv, {}, repo, 60), max(3, runs // 4))
        print(f"{name:26} {bare:8.2f}ms {sb:8.2f}ms {ex:8.2f}ms {le:8.2f}ms "
              f"{ex / sb:15.2f}x")


if __name__ == "__main__":
    main()
