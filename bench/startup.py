"""Startup latency: how long one short command takes to run under each peer.

Peers (each a worker op, see worker.py), all interleaved round by round:
ours_api, upstream_api, bare subprocess, ours_cli, upstream_cli (when upstream ships
one), upstream_py_oneshot (a Python stand-in for it) and bwrap.

    python bench/startup.py [--runs N | --quick]
"""

import argparse
import sys
from dataclasses import dataclass, field

from harness import (ROOT, UPSTREAM_PY, UPSTREAM_VENV, UPSTREAM_VERSION, WORKER, check_imports,
                     ensure_setup, rotations, start_workers, stats,
                     verdict)

NAME = "startup"
POLICY = {"fs_readable": ["/usr", "/lib", "/lib64", "/bin", "/etc"]}
WORKLOADS = {
    "true": ["/bin/true"],
    "echo": ["/bin/echo", "hi"],
    "python": ["/usr/bin/python3", "-c", "pass"],
}
OURS_CLI = ROOT / ".venv" / "bin" / "sandlock"
UPSTREAM_CLI = UPSTREAM_VENV / "bin" / "sandlock"
# Ratios of medians reported per workload: (numerator, denominator).
RATIOS = [("ours_api", "bare"), ("ours_api", "upstream_api"),
          ("ours_cli", "upstream_cli"), ("ours_cli", "upstream_py_oneshot")]
TARGET_API_MS = 2.0


@dataclass
class Peer:
    name: str
    worker: str  # which interpreter runs the op: ours | upstream | plain
    op: str
    about: str
    extra: dict = field(default_factory=dict)
    required: bool = True  # a required peer that fails is an error, not "unavailable"


PEERS = [
    Peer("ours_api", "ours", "api_run", "our `Sandbox(fs_readable=...).run(argv)`, "
         "Sandbox built once per policy"),
    Peer("upstream_api", "upstream", "api_run", f"upstream sandlock {UPSTREAM_VERSION} "
         "(Rust core) `Sandbox(fs_readable=...).run(argv)`, Sandbox built once per policy"),
    Peer("bare", "plain", "subprocess_run", "`subprocess.run(argv, capture_output=True)`, no sandbox"),
    Peer("ours_cli", "plain", "cli_run", "our CLI, `sandlock run --no-system -r PATH... "
         "-- argv`, a fresh interpreter per call", {"cli": [str(OURS_CLI)]}),
    Peer("upstream_cli", "plain", "cli_run", "upstream's own `sandlock run` binary",
         {"cli": [str(UPSTREAM_CLI)]}, required=False),
    Peer("upstream_py_oneshot", "plain", "cli_run", "stand-in for upstream's CLI: a "
         "fresh upstream-venv interpreter imports upstream sandlock and runs argv "
         "(`worker.py run`)", {"cli": [str(UPSTREAM_PY), "-I", str(WORKER)]}),
    Peer("bwrap", "plain", "bwrap_run", "bubblewrap: read-only binds of the same "
         "paths, `--unshare-all --die-with-parent`", required=False),
]


def _known_unavailable():
    if not UPSTREAM_CLI.exists():
        return {"upstream_cli": f"sandlock {UPSTREAM_VERSION}'s wheel ships no CLI (upstream's "
                "CLI is a separate Rust binary, not installable from the registries "
                "reachable here); see upstream_py_oneshot"}
    return {}


def _bench_workload(workers, argv, runs, warmup, log):
    def once(peer, verifying=False):
        r = workers[peer.worker].ask({"op": peer.op, "argv": argv, "policy": POLICY,
                                      **peer.extra})
        if not r["ok"] and not verifying:
            raise RuntimeError(f"startup: {peer.name} failed on {argv}: {r['err']}")
        return r

    # Verify each peer succeeds (exit 0) before timing anything.
    unavailable = _known_unavailable()
    active = []
    for peer in PEERS:
        if peer.name in unavailable:
            continue
        r = once(peer, verifying=True)
        if r["ok"]:
            active.append(peer)
        elif peer.required:
            raise RuntimeError(f"startup: {peer.name} cannot run {argv}: {r['err']}")
        else:
            unavailable[peer.name] = r["err"]
            log(f"  {peer.name}: unavailable ({r['err']})")

    for _ in range(warmup):
        for peer in active:
            once(peer)
    samples = {peer.name: [] for peer in active}
    for i, order in enumerate(rotations(active, runs)):
        for peer in order:
            samples[peer.name].append(once(peer)["ns"])
        if (i + 1) % 50 == 0:
            log(f"  {i + 1}/{runs} rounds")
    st = {name: stats(ns) for name, ns in samples.items()}
    ratios = {f"{a}/{b}": st[a]["median"] / st[b]["median"]
              for a, b in RATIOS if a in st and b in st}
    return {"argv": argv, "stats": st, "ratios": ratios, "unavailable": unavailable}


def run(runs=200, warmup=20, quick=False, log=lambda s: print(s, file=sys.stderr)):
    if quick:
        runs = 30
    workers = start_workers()
    try:
        result = {"name": NAME, "runs": runs, "warmup": warmup, "policy": POLICY,
                  "imports": check_imports(workers),
                  "peers": {p.name: p.about for p in PEERS}, "workloads": {}}
        for name, argv in WORKLOADS.items():
            log(f"startup: {name} ({' '.join(argv)})")
            result["workloads"][name] = _bench_workload(workers, argv, runs, warmup, log)
    finally:
        for w in workers.values():
            w.close()
    return result


def markdown(result):
    out = ["## Startup latency", "",
           f"{result['runs']} runs per peer and workload, after {result['warmup']} warm-up "
           "runs, interleaved round by round (the first peer rotates each round). Policy: "
           f"read-only {', '.join(result['policy']['fs_readable'])}.", ""]
    out += [f"- **{name}**: {about}" for name, about in result["peers"].items()]
    out += ["", "| workload | peer | median ms | p99 ms | mean ms |",
            "|---|---|--:|--:|--:|"]
    for wl in result["workloads"].values():
        cmd = f"`{' '.join(wl['argv'])}`"
        for peer, s in wl["stats"].items():
            out.append(f"| {cmd} | {peer} | {s['median']:.2f} | {s['p99']:.2f} | "
                       f"{s['mean']:.2f} |")
        out += [f"| {cmd} | {peer} | unavailable | | |" for peer in wl["unavailable"]]
    out += ["", "| workload | ratio of medians | value | in words |", "|---|---|--:|---|"]
    for wl in result["workloads"].values():
        for a, b in RATIOS:
            r = wl["ratios"].get(f"{a}/{b}")
            words = verdict(r, b) if r is not None else f"n/a: {b if b in wl['unavailable'] else a} unavailable"
            out.append(f"| `{' '.join(wl['argv'])}` | {a}/{b} | "
                       f"{'n/a' if r is None else f'{r:.2f}x'} | {words} |")
    unavailable = {p: why for wl in result["workloads"].values()
                   for p, why in wl["unavailable"].items()}
    out += [""] + [f"- {p} unavailable: {why}" for p, why in unavailable.items()]
    med = result["workloads"]["true"]["stats"]["ours_api"]["median"]
    out += ["", f"Target: ours_api median for `/bin/true` ≤ {TARGET_API_MS:g} ms: measured "
            f"{med:.2f} ms, {'met' if med <= TARGET_API_MS else 'MISSED'}."]
    return "\n".join(out) + "\n"


def plot(result, ax):
    """Grouped bars: median latency per peer, per workload (log scale)."""
    wls = list(result["workloads"])
    peers = [p for p in result["peers"]
             if any(p in result["workloads"][w]["stats"] for w in wls)]
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        xs, ys = [], []
        for j, w in enumerate(wls):
            s = result["workloads"][w]["stats"].get(peer)
            if s:
                xs.append(j + (i - (len(peers) - 1) / 2) * width)
                ys.append(s["median"])
        bars = ax.bar(xs, ys, width, label=peer)
        ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=7, rotation=90,
                     padding=2)
    ax.set_yscale("log")
    ax.set_xticks(range(len(wls)),
                  [" ".join(result["workloads"][w]["argv"]) for w in wls])
    ax.set_ylabel("median latency, ms (log scale)")
    ax.set_title(f"Startup: median of {result['runs']} interleaved runs")
    ax.legend(fontsize=8, ncols=2)
    top = max(s["median"] for w in wls for s in result["workloads"][w]["stats"].values())
    ax.set_ylim(top=top * 4)  # room for the labels above the tallest bars


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="30 runs")
    p.add_argument("--warmup", type=int, default=20)
    a = p.parse_args(argv)
    ensure_setup()
    result = run(30 if a.quick else a.runs, a.warmup)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
