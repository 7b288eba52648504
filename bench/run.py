"""Run the benchmarks and write bench/results/<date>.{json,md,png}.

    python bench/run.py [--only NAME]... [--quick]

Each benchmark is a module in bench/ with NAME, run(quick=False) -> dict, markdown(result)
-> str and, optionally, plot(result, ax). Add one by listing it in BENCHMARKS.
"""

import argparse
import datetime
import importlib
import json
import os
import platform
import sys
from pathlib import Path

from harness import BENCH, ensure_setup

BENCHMARKS = ["startup", "connect", "redis_bench", "policy_fn", "http_filter", "cow", "limits",
              "cli"]
RESULTS = BENCH / "results"


def machine():
    meminfo = dict(line.split(":", 1) for line in
                   Path("/proc/meminfo").read_text().splitlines())
    return {"cores": os.cpu_count(), "kernel": os.uname().release,
            "machine": os.uname().machine, "python": platform.python_version(),
            "mem_total_kib": int(meminfo["MemTotal"].split()[0])}


def write_plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed in this venv: no plot "
              "(.venv/bin/pip install matplotlib)", file=sys.stderr)
        return False
    plotted = [(mod, res) for mod, res in results if hasattr(mod, "plot")]
    if not plotted:
        return False
    fig, axes = plt.subplots(len(plotted), 1, figsize=(10, 5.5 * len(plotted)), squeeze=False)
    for (mod, res), ax in zip(plotted, axes[:, 0]):
        mod.plot(res, ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description="Run the sandlock benchmarks.")
    p.add_argument("--only", action="append", choices=BENCHMARKS,
                   help="run only this benchmark (repeatable)")
    p.add_argument("--quick", action="store_true", help="fewer runs (a smoke test)")
    a = p.parse_args(argv)
    ensure_setup()

    started = datetime.datetime.now().astimezone()
    results = []
    for name in a.only or BENCHMARKS:
        mod = importlib.import_module(name)
        results.append((mod, mod.run(quick=a.quick)))

    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / started.strftime("%Y-%m-%d")
    desc = machine()
    doc = {"timestamp": started.isoformat(timespec="seconds"), "machine": desc,
           "quick": a.quick, "benchmarks": {mod.NAME: res for mod, res in results}}
    previous = stem.with_suffix(".json")
    if a.only and previous.exists() and not a.quick:
        # A partial re-run replaces those benchmarks in the day's full results.
        old = json.loads(previous.read_text())
        if not old.get("quick"):
            reruns = {**old.get("reruns", {}),
                      **{mod.NAME: doc["timestamp"] for mod, _ in results}}
            merged = {**old["benchmarks"], **doc["benchmarks"]}
            doc = {**old, "benchmarks": merged, "reruns": reruns}
            names = [n for n in BENCHMARKS if importlib.import_module(n).NAME in merged]
            results = [(importlib.import_module(n), merged[importlib.import_module(n).NAME])
                       for n in names]
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")

    md = [f"# sandlock benchmarks, {doc['timestamp']}", "",
          f"Machine: {desc['cores']} cores, {desc['mem_total_kib'] / 2**20:.1f} GiB, "
          f"Linux {desc['kernel']} ({desc['machine']}), Python {desc['python']}."
          + (" Quick run (fewer samples): indicative only." if a.quick else "")
          + "".join(f" `{n}` re-run alone at {t}." for n, t in doc.get("reruns", {}).items()),
          ""]
    plotted = write_plot(results, stem.with_suffix(".png"))
    if plotted:
        md += [f"![benchmark plots]({stem.name}.png)", ""]
    md += [mod.markdown(res) for mod, res in results]
    stem.with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))
    print(f"wrote {stem}.json, .md" + (", .png" if plotted else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
