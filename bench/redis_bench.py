"""Redis: throughput and p99 latency of a redis-server, bare and sandboxed.

Each peer starts one redis-server (`--save '' --appendonly no`) on 127.0.0.1 and its own
free port, through a worker; the unconfined `redis-benchmark -t set,get -P 1 -c 50`
then drives each server in turn, round by round (the first peer rotating).

    python bench/redis_bench.py [--rounds R] [--requests N] [--quick]
"""

import argparse
import csv
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import UPSTREAM_VERSION, check_imports, ensure_setup, rotations, start_workers, \
    verdict

NAME = "redis"
SYSTEM = ["/usr", "/lib", "/lib64", "/bin", "/etc"]
TESTS = ("SET", "GET")
CLIENTS = 50
TARGET_RPS = 0.99  # ours throughput over bare, at least
TARGET_P99 = 1.10  # ours p99 over bare, at most
COLORS = {"ours": "tab:blue", "upstream": "tab:orange", "bare": "tab:green"}  # as startup's


@dataclass
class Peer:
    name: str
    worker: str  # ours | upstream | plain
    op: str
    about: str
    required: bool = True  # a required peer that fails is an error, not "unavailable"


PEERS = [
    Peer("bare", "plain", "subprocess_popen", "redis-server under plain `subprocess.Popen`"),
    Peer("ours", "ours", "api_popen", "our `Sandbox(...).popen(redis-server ...)`"),
    Peer("upstream", "upstream", "api_popen", f"upstream sandlock {UPSTREAM_VERSION} "
         "`Sandbox(...).popen(redis-server ...)`", required=False),
]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(port, workdir):
    argv = [shutil.which("redis-server"), "--bind", "127.0.0.1", "--port", str(port),
            "--save", "", "--appendonly", "no", "--dir", str(workdir),
            "--logfile", str(workdir / "redis.log")]
    policy = {"fs_readable": SYSTEM, "fs_writable": ["/dev/null", str(workdir)],
              "net_allow_bind": [port]}  # it only binds and accepts: no connect rule
    return argv, policy


def _wait_ready(port, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def _cpu_ns(pid):
    """CPU time the server has run so far (ns): /proc/PID/schedstat, exact to the ns."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _rw_calls(pid):
    """read- and write-type system calls the server has made so far (/proc/PID/io)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/io") as f:
            fields = dict(line.split(": ") for line in f.read().splitlines())
        return int(fields["syscr"]) + int(fields["syscw"])
    except (OSError, ValueError, KeyError):
        return None


def _bench(port, requests, pid=None):
    """One redis-benchmark run: {test: {rps, p50, p99 (ms)}, "cpu_us": the server's CPU
    µs per request over both tests (None if its pid is unknown)}. The server's CPU time
    per request does not depend on the client's share of the machine, so it resolves
    differences that throughput's run-to-run noise hides."""
    before, calls_before = _cpu_ns(pid), _rw_calls(pid)
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", "set,get",
           "-n", str(requests), "-P", "1", "-c", str(CLIENTS), "-q", "--csv"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rows = {r["test"]: r for r in csv.DictReader(cp.stdout.splitlines())}
    if cp.returncode != 0 or not all(t in rows for t in TESTS):
        raise RuntimeError(f"redis-benchmark exit {cp.returncode}: "
                           f"{cp.stdout[-300:]} {cp.stderr[-300:]}")
    after, calls_after = _cpu_ns(pid), _rw_calls(pid)
    out = {t: {"rps": float(rows[t]["rps"]), "p50": float(rows[t]["p50_latency_ms"]),
               "p99": float(rows[t]["p99_latency_ms"])} for t in TESTS}
    out["cpu_us"] = ((after - before) / 1e3 / (requests * len(TESTS))
                     if before is not None and after is not None else None)
    out["rw_calls"] = ((calls_after - calls_before) / (requests * len(TESTS))
                       if calls_before is not None and calls_after is not None else None)
    return out


SYSCALL_ROUNDS = 8


def _syscall_costs(workers, active, tmp, log):
    """ns per read(2) and epoll_wait(2) in each peer's sandbox (bench/syscall_cost.c,
    the redis-server policy), peers interleaved round by round: what the sandbox adds to
    every call the server makes per request, measured without the benchmark's noise."""
    exe = tmp / "syscall_cost"
    src = Path(__file__).with_name("syscall_cost.c")
    cp = subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], capture_output=True,
                        text=True)
    if cp.returncode != 0:
        log(f"  syscall cost: not measured (cc: {cp.stderr.strip()[:200]})")
        return {}
    tmp.chmod(0o755)
    samples = {peer.name: {"read": [], "epoll_wait": []} for peer, _, _ in active}
    for order in rotations(active, SYSCALL_ROUNDS):
        for peer, port, _ in order:
            if peer.worker == "plain":
                r = workers["plain"].ask({"op": "subprocess_run", "argv": [str(exe)],
                                          "capture": True})
            else:
                _, policy = _server(port, tmp)
                policy["fs_readable"] = policy["fs_readable"] + [str(exe), "/dev/zero"]
                r = workers[peer.worker].ask({"op": "api_run", "argv": [str(exe)],
                                              "capture": True, "policy": policy})
            words = r.get("out", "").split()
            if len(words) != 4 or r.get("err"):
                raise RuntimeError(f"syscall cost: {peer.name}: {r.get('err')} {words}")
            samples[peer.name]["read"].append(float(words[1]))
            samples[peer.name]["epoll_wait"].append(float(words[3]))
    return {name: {call: _median(v) for call, v in calls.items()}
            for name, calls in samples.items()}


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def run(rounds=10, requests=100000, quick=False, log=lambda s: print(s, file=sys.stderr)):
    if quick:
        rounds, requests = 3, 20000
    workers = start_workers()
    tmp = Path(tempfile.mkdtemp(prefix="sandlock-bench-redis-"))
    started, active, unavailable, runs = {}, [], {}, {}
    try:
        imports = check_imports(workers)
        for peer in PEERS:
            port, workdir = _free_port(), tmp / peer.name
            workdir.mkdir()
            argv, policy = _server(port, workdir)
            r = workers[peer.worker].ask({"op": peer.op, "argv": argv, "policy": policy})
            if r["ok"]:
                started[peer.name] = (peer.worker, r["pid"])
            why = r.get("err")
            if r["ok"] and not _wait_ready(port):
                log_tail = (workdir / "redis.log").read_text()[-500:] \
                    if (workdir / "redis.log").exists() else "(no log)"
                why = f"not accepting on port {port} after 10 s; log: {log_tail}"
            elif r["ok"]:
                try:  # sanity and warm-up: a short run must succeed
                    _bench(port, max(requests // 10, 1000))
                    why = None
                except RuntimeError as e:
                    why = str(e)
            if why is None:
                active.append((peer, port, r["pid"]))
                runs[peer.name] = []
            elif peer.required:
                raise RuntimeError(f"redis: {peer.name}: {why}")
            else:
                unavailable[peer.name] = why
                log(f"  {peer.name}: unavailable ({why})")
        syscalls = _syscall_costs(workers, active, tmp, log)
        log(f"redis: {rounds} rounds x {requests} requests per test")
        for i, order in enumerate(rotations(active, rounds)):
            for peer, port, pid in order:
                runs[peer.name].append(_bench(port, requests, pid))
            log(f"  {i + 1}/{rounds} rounds")
    finally:
        for worker, pid in started.values():
            workers[worker].ask({"op": "stop", "pid": pid})
        for w in workers.values():
            w.close()
        shutil.rmtree(tmp, ignore_errors=True)
    # Per peer and test: the median over rounds of each run's rps and p99.
    st = {name: {t: {k: _median([run_[t][k] for run_ in rs]) for k in ("rps", "p50", "p99")}
                 | {"rps_range": [min(x[t]["rps"] for x in rs), max(x[t]["rps"] for x in rs)]}
                 for t in TESTS} for name, rs in runs.items()}
    # Ratios of medians, and the median of the ratios within each round (which cancels
    # the drift this machine shows from round to round).
    ratios = {f"{a}/{b}": {t: {"rps": st[a][t]["rps"] / st[b][t]["rps"],
                               "rps_paired": _median([x[t]["rps"] / y[t]["rps"]
                                                      for x, y in zip(runs[a], runs[b])]),
                               "p99": st[a][t]["p99"] / st[b][t]["p99"]} for t in TESTS}
              for a, b in (("ours", "bare"), ("upstream", "bare"), ("ours", "upstream"))
              if a in st and b in st}
    # The server's CPU per request: median over rounds, and the paired ratio.
    cpu = {name: _median([x["cpu_us"] for x in rs]) for name, rs in runs.items()
           if rs and all(x["cpu_us"] is not None for x in rs)}
    rw_calls = {name: _median([x["rw_calls"] for x in rs]) for name, rs in runs.items()
                if rs and all(x["rw_calls"] is not None for x in rs)}
    cpu_ratios = {f"{a}/{b}": {"ratio": cpu[a] / cpu[b],
                               "paired": _median([x["cpu_us"] / y["cpu_us"]
                                                  for x, y in zip(runs[a], runs[b])])}
                  for a, b in (("ours", "bare"), ("upstream", "bare"), ("ours", "upstream"))
                  if a in cpu and b in cpu}
    return {"name": NAME, "rounds": rounds, "requests": requests, "clients": CLIENTS,
            "imports": imports, "peers": {p.name: p.about for p in PEERS},
            "policy": "read-only " + ", ".join(SYSTEM) + "; writable /dev/null and its "
                      "working directory; net_allow_bind=[its port]",
            "unavailable": unavailable, "stats": st, "ratios": ratios, "runs": runs,
            "cpu_us": cpu, "cpu_ratios": cpu_ratios, "syscall_ns": syscalls,
            "rw_calls": rw_calls}


def markdown(result):
    st = result["stats"]
    out = ["## Redis", "",
           f"Debian's redis-server (`--save '' --appendonly no`), one per peer on "
           f"127.0.0.1, driven by the unconfined `redis-benchmark -t set,get -n "
           f"{result['requests']} -P 1 -c {result['clients']} -q --csv`, {result['rounds']} "
           "rounds, the peers interleaved round by round (the first rotating). Figures are "
           "medians over the rounds of each run's throughput and p99; ratios are of those "
           "medians, and (paired) the median over rounds of the ratio within a round. "
           "Sandbox policy: "
           f"{result['policy']}.", ""]
    out += [f"- **{name}**: {about}" for name, about in result["peers"].items()]
    out += ["", "| peer | test | requests/s | p50 ms | p99 ms | requests/s over rounds |",
            "|---|---|--:|--:|--:|---|"]
    for name in result["peers"]:
        for t in TESTS:
            if name not in st:
                out.append(f"| {name} | {t} | unavailable | | | |")
                continue
            s = st[name][t]
            out.append(f"| {name} | {t} | {s['rps']:,.0f} | {s['p50']:.3f} | {s['p99']:.3f} | "
                       f"{s['rps_range'][0]:,.0f}–{s['rps_range'][1]:,.0f} |")
    out += ["", "| ratio | test | throughput | throughput, paired by round | p99 | "
            "in words (throughput) |", "|---|---|--:|--:|--:|---|"]
    for key, by_test in result["ratios"].items():
        b = key.split("/")[1]
        for t, r in by_test.items():
            # for throughput, higher is better: ours/peer < 1 means behind
            words = verdict(1 / r["rps"], b)
            out.append(f"| {key} | {t} | {r['rps']:.3f}x | {r['rps_paired']:.3f}x | "
                       f"{r['p99']:.2f}x | {words} |")
    out += [""] + [f"- {p} unavailable: {why}" for p, why in result["unavailable"].items()]
    if "bare" in st:
        lo, hi = st["bare"]["SET"]["rps_range"]
        out += ["", f"Run-to-run noise: bare's own SET throughput ranged {lo:,.0f}–{hi:,.0f} "
                f"requests/s over the rounds ({(hi - lo) / st['bare']['SET']['rps']:.0%} of its "
                "median), so differences of a few percent are not resolved here."]
    cpu, cpu_r = result.get("cpu_us", {}), result.get("cpu_ratios", {})
    if cpu:
        out += ["", "The server's own CPU time per request (from /proc/PID/schedstat, both "
                "tests together; median over rounds): not moved by how the client is "
                "scheduled, but still by this machine's state from run to run:", "",
                "| peer | server CPU µs per request |", "|---|--:|"]
        out += [f"| {name} | {us:.2f} |" for name, us in cpu.items()]
        out += ["", "| ratio | server CPU per request | paired by round |", "|---|--:|--:|"]
        out += [f"| {k} | {v['ratio']:.3f}x | {v['paired']:.3f}x |" for k, v in cpu_r.items()]
    sc = result.get("syscall_ns", {})
    if sc:
        out += ["", f"What each sandbox adds per system call the server makes "
                f"(bench/syscall_cost.c under the same policy; median over "
                f"{SYSCALL_ROUNDS} interleaved runs of the best of 5 × 200,000 calls):", "",
                "| peer | read(2) ns | epoll_wait(2) ns | added per call ns |", "|---|--:|--:|--:|"]
        for name, v in sc.items():
            added = ((v["read"] - sc["bare"]["read"] + v["epoll_wait"]
                      - sc["bare"]["epoll_wait"]) / 2) if "bare" in sc else 0.0
            out.append(f"| {name} | {v['read']:.1f} | {v['epoll_wait']:.1f} | "
                       f"{added:+.1f} |")
    r = result["ratios"].get("ours/bare")
    if r:
        out += ["", f"Targets: ours ≥ {TARGET_RPS:.0%} of bare throughput and p99 within "
                f"{TARGET_P99 - 1:.0%} of bare:", ""]
        for t in TESTS:
            ok_rps, ok_p99 = r[t]["rps"] >= TARGET_RPS, r[t]["p99"] <= TARGET_P99
            out.append(f"- {t}: throughput {r[t]['rps']:.1%} of bare (paired "
                       f"{r[t]['rps_paired']:.1%}), {'met' if ok_rps else 'MISSED'}; "
                       f"p99 {r[t]['p99']:.2f}x bare, "
                       f"{'met' if ok_p99 else 'MISSED'}")
        calls = result.get("rw_calls", {}).get("bare")
        if "ours" in sc and "bare" in sc and "bare" in cpu and calls is not None:
            # Per request the server makes `calls` read/write calls (/proc/PID/io) and at
            # most one epoll_wait: the sandbox's share of its CPU per request.
            added = (sc["ours"]["read"] - sc["bare"]["read"] + sc["ours"]["epoll_wait"]
                     - sc["bare"]["epoll_wait"]) / 2
            share = (calls + 1) * added / (cpu["bare"] * 1000)
            if added < 0:
                out.append(f"- what the sandbox adds per request, from the per-call cost: "
                           f"not resolved (ours measured {-added:.1f} ns per call faster "
                           "than bare: this machine's noise)")
            else:
                out.append(f"- what the sandbox adds per request, from the per-call cost: "
                           f"({calls:.2f} read/write calls per request + ≤ 1 epoll_wait) × "
                           f"{added:.1f} ns on {cpu['bare']:.2f} µs of server CPU = "
                           f"{share:.2%}, i.e. throughput ≥ {1 / (1 + share):.1%} of bare: "
                           f"{'met' if 1 / (1 + share) >= TARGET_RPS else 'MISSED'}")
        c = cpu_r.get("ours/bare")
        if c:
            # CPU-bound, the server's throughput is the inverse of its CPU per request.
            ok = 1 / c["paired"] >= TARGET_RPS
            out.append(f"- server CPU per request, which bounds a CPU-bound server's "
                       f"throughput: ours {c['paired']:.3f}x bare (paired by round), so "
                       f"with equal CPU ours serves {1 / c['paired']:.1%} of bare's "
                       f"requests: {'met' if ok else 'MISSED'}")
    return "\n".join(out) + "\n"


def plot(result, ax):
    """Grouped bars: requests/s per peer for SET and GET, p99 in the labels."""
    peers = [p for p in result["peers"] if p in result["stats"]]
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        xs = [j + (i - (len(peers) - 1) / 2) * width for j in range(len(TESTS))]
        s = [result["stats"][peer][t] for t in TESTS]
        bars = ax.bar(xs, [x["rps"] / 1000 for x in s], width, label=peer,
                      color=COLORS[peer])
        ax.bar_label(bars, labels=[f"{x['rps'] / 1000:.1f}k\np99 {x['p99']:.2f} ms"
                                   for x in s], fontsize=8, padding=2)
    ax.set_xticks(range(len(TESTS)), TESTS)
    ax.set_ylabel("thousand requests/s (median over rounds)")
    top = max(result["stats"][p][t]["rps"] for p in peers for t in TESTS) / 1000
    ax.set_ylim(top=top * 1.3)
    ax.set_title(f"Redis: redis-benchmark -c {result['clients']} -P 1, "
                 f"{result['requests']} requests per test, {result['rounds']} rounds")
    ax.legend(fontsize=8, loc="upper left", ncols=3)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--requests", type=int, default=100000)
    p.add_argument("--quick", action="store_true", help="3 rounds x 20000 requests")
    a = p.parse_args(argv)
    ensure_setup()
    result = run(a.rounds, a.requests, quick=a.quick)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
