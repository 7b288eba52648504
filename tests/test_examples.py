"""The examples in examples/ run as documented (they start their own loopback servers)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def test_runtime_policy_examples():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "runtime_policy.py")],
                       capture_output=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])})
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert "setup: fetched the index" in out and "tool: no network" in out
    assert "curl: refused" in out and "sender: uploaded stdin" in out
