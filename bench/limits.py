"""What resource limits cost: µs added to a fork + exec of /bin/true, a fork + exit, and a
1 MiB allocation, with max_memory and max_processes set vs without (sandlock.limits).

A program (the system /usr/bin/python3) times N rounds of each operation from inside the
sandbox with perf_counter_ns and prints every sample. Peers run it bare, under ours with
and without limits, and under upstream with and without the same limits; peers are
interleaved round by round (the first rotating), samples pooled; medians reported.

    python bench/limits.py [--quick]
"""

import sys

import harness
from harness import UPSTREAM_VERSION, check_imports, rotations, \
    start_workers, stats
from policy_fn import PY, Peer, _ask, _samples

NAME = "limits"
LIMITS = {"max_memory": "1G", "max_processes": 64}

PROG = r"""
import os, sys, time
kind, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ts = []
for i in range(warm + n):
    t0 = time.perf_counter_ns()
    if kind == "alloc":
        b = bytearray(1 << 20)
        b[::4096] = b"x" * 256
        del b
    else:
        pid = os.fork()
        if pid == 0:
            if kind == "exec":
                try:
                    os.execv("/bin/true", ["/bin/true"])
                finally:
                    os._exit(127)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            print("failed", status)
            sys.exit(3)
    t1 = time.perf_counter_ns()
    if i >= warm:
        ts.append(t1 - t0)
print(" ".join(map(str, ts)))
"""


def _peers():
    return [
        Peer("bare", "plain", None, "plain `subprocess.run`"),
        Peer("ours", "ours", {}, "ours, no limits"),
        Peer("ours_limits", "ours", dict(LIMITS),
             "ours, `max_memory=1G, max_processes=64`"),
        Peer("upstream", "upstream", {}, f"upstream {UPSTREAM_VERSION}, no limits"),
        Peer("upstream_limits", "upstream", dict(LIMITS),
             f"upstream {UPSTREAM_VERSION}, the same limits"),
    ]


def run(rounds=8, n=200, quick=False, log=lambda s: print(s, file=sys.stderr)):
    if quick:
        rounds, n = 2, 40
    workers = start_workers()
    out = {"name": NAME, "rounds": rounds, "n": n}
    try:
        out["imports"] = check_imports(workers)
        for kind in ("exec", "fork", "alloc"):
            peers = _peers()
            samples, unavailable = {}, {}
            for p in peers:
                r = _ask(workers, p, [PY, "-I", "-S", "-c", PROG, kind, "5", "0"])
                if _samples(r, 5) is None:
                    why = f"{r['err'] or ''} {r.get('out', '')[:160]!r}".strip()
                    if p.worker != "upstream":
                        raise RuntimeError(f"limits/{kind}: {p.name} failed: {why}")
                    unavailable[p.name] = why
                    log(f"  {kind}/{p.name}: unavailable ({why})")
                    continue
                samples[p.name] = []
            active = [p for p in peers if p.name in samples]
            for i, order in enumerate(rotations(active, rounds)):
                for p in order:
                    r = _ask(workers, p, [PY, "-I", "-S", "-c", PROG, kind, str(n),
                                          str(max(5, n // 10))])
                    ns = _samples(r, n)
                    if ns is None:
                        raise RuntimeError(f"limits/{kind}: {p.name} failed: {r['err']}")
                    samples[p.name] += ns
                log(f"  {kind}: {i + 1}/{rounds} rounds")
            out[kind] = {"peers": {p.name: p.about for p in peers},
                         "stats": {k: stats(v, unit=1e3) for k, v in samples.items()},
                         "unavailable": unavailable}
    finally:
        for w in workers.values():
            w.close()
    return out


def markdown(result):
    lines = ["## Resource limits", "",
             "Median µs per operation timed inside the sandbox (`/usr/bin/python3`): "
             "**exec** = fork + `execve(/bin/true)` + wait; **fork** = fork + `_exit` + "
             "wait; **alloc** = a 1 MiB bytearray touched and freed. "
             f"{result['rounds']} interleaved rounds × {result['n']} per peer. Ours counts "
             "every fork in the supervisor under max_processes (supervisor.forks) and "
             "sets RLIMIT_DATA plus a 10 ms resident-memory watch (sandlock-init.c) under "
             "max_memory.", ""]
    for kind in ("exec", "fork", "alloc"):
        r = result[kind]
        st = r["stats"]
        bare = st["bare"]["median"]
        lines += [f"### {kind}", "", "| peer | median µs | p99 µs | added by limits | vs bare |",
                  "|---|---:|---:|---:|---:|"]
        for name, about in r["peers"].items():
            if name not in st:
                lines.append(f"| {about} | n/a: {r['unavailable'].get(name, '')[:80]} "
                             "| | | |")
                continue
            base = {"ours_limits": "ours", "upstream_limits": "upstream"}.get(name)
            added = ""
            if base in st:
                d = st[name]["median"] - st[base]["median"]
                added = f"{d:+.0f} µs ({d / st[base]['median'] * 100:+.0f} %)"
            lines.append(f"| {about} | {st[name]['median']:.0f} | {st[name]['p99']:.0f} "
                         f"| {added} | {st[name]['median'] / bare:.2f}x |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    harness.main(__doc__, run, markdown)
