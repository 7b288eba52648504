"""policy_fn cost: µs added to an execve held by a trivial callback, and to a connect().

A program (the system /usr/bin/python3) times, from inside the sandbox, N rounds of
fork + execve(/bin/true) + wait (exec), or N TCP connects to a listener this benchmark
runs on 127.0.0.2 (connect), with perf_counter_ns, and prints every sample. Peers run the
same program under the same static policy, with and without a policy_fn that allows
everything; upstream runs its own policy_fn. Peers are interleaved round by round (the
first rotating), samples pooled; the figure reported is the median.

    python bench/policy_fn.py [--quick]
"""

import sys
from dataclasses import dataclass

import harness
from harness import UPSTREAM_VERSION, check_imports, rotations, \
    start_workers, stats

NAME = "policy_fn"
HOST = "127.0.0.2"
PY = "/usr/bin/python3"
SYSTEM = ["/usr", "/lib", "/lib64", "/bin", "/etc"]
FS = {"fs_readable": SYSTEM, "fs_writable": ["/dev/null"]}

EXEC_PROG = r"""
import os, sys, time
n, warm = int(sys.argv[1]), int(sys.argv[2])
ts = []
for i in range(warm + n):
    t0 = time.perf_counter_ns()
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/true", ["/bin/true"])
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    t1 = time.perf_counter_ns()
    if status != 0:
        print("failed", status)
        sys.exit(3)
    if i >= warm:
        ts.append(t1 - t0)
print(" ".join(map(str, ts)))
"""

CONNECT_PROG = r"""
import socket, struct, sys, time
host, port, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
linger = struct.pack("ii", 1, 0)
ts = []
for i in range(warm + n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t0 = time.perf_counter_ns()
    try:
        s.connect((host, port))
    except OSError as e:
        print("refused", e.errno)
        sys.exit(3)
    t1 = time.perf_counter_ns()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    s.close()
    if i >= warm:
        ts.append(t1 - t0)
print(" ".join(map(str, ts)))
"""


@dataclass
class Peer:
    name: str
    worker: str          # ours | upstream | plain
    policy: dict | None  # None: no sandbox
    about: str


def _peers(kind, port):
    net = {"net_allow": [f"{HOST}:{port}"]} if kind == "connect" else {}
    fn = {"policy_fn": "allow"}
    return [
        Peer("bare", "plain", None, "plain `subprocess.run`"),
        Peer("ours", "ours", dict(net), "ours, no policy_fn"),
        Peer("ours_fn", "ours", {**net, **fn},
             "ours, `policy_fn` returning None, every event kind (exec, file, process, "
             "network)"),
        Peer("ours_fn_narrow", "ours",
             {**net, **fn, "policy_fn_events": ["exec" if kind == "exec" else "network"]},
             f'ours, `policy_fn_events=["{"exec" if kind == "exec" else "network"}"]`'),
        Peer("upstream", "upstream", dict(net), f"upstream {UPSTREAM_VERSION}, no policy_fn"),
        Peer("upstream_fn", "upstream", {**net, **fn},
             f"upstream {UPSTREAM_VERSION}, `policy_fn` returning None"),
    ]


def _ask(workers, peer, argv):
    if peer.policy is None:
        return workers["plain"].ask({"op": "subprocess_run", "argv": argv, "capture": True})
    return workers[peer.worker].ask({"op": "api_run", "argv": argv, "capture": True,
                                     "policy": {**FS, **peer.policy}})


def _samples(r, n):
    try:
        ns = [int(x) for x in r.get("out", "").split()]
    except ValueError:
        return None
    return ns if r["ok"] and len(ns) == n else None


def _measure(workers, kind, peers, argv_for, rounds, n, warm, log):
    samples, unavailable = {}, {}
    for p in peers:
        r = _ask(workers, p, argv_for(5, 0))
        if _samples(r, 5) is None:
            why = f"{r['err'] or ''} {r.get('out', '')[:160]!r}".strip()
            if p.worker != "upstream":
                raise RuntimeError(f"policy_fn/{kind}: {p.name} failed: {why}")
            unavailable[p.name] = why
            log(f"  {kind}/{p.name}: unavailable ({why})")
            continue
        samples[p.name] = []
    active = [p for p in peers if p.name in samples]
    for i, order in enumerate(rotations(active, rounds)):
        for p in order:
            r = _ask(workers, p, argv_for(n, warm))
            ns = _samples(r, n)
            if ns is None:
                raise RuntimeError(f"policy_fn/{kind}: {p.name} failed in round {i + 1}: "
                                   f"{r['err']} {r.get('out', '')[:160]!r}")
            samples[p.name] += ns
        log(f"  {kind}: {i + 1}/{rounds} rounds")
    return {name: stats(ns, unit=1e3) for name, ns in samples.items()}, unavailable


def run(rounds=8, execs=150, connects=1000, quick=False,
        log=lambda s: print(s, file=sys.stderr)):
    if quick:
        rounds, execs, connects = 2, 40, 200
    import socket
    import threading
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((HOST, 0))
    lsock.listen(4096)
    port = lsock.getsockname()[1]

    def serve():
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    workers = start_workers()
    out = {"name": NAME, "rounds": rounds, "execs": execs, "connects": connects}
    try:
        out["imports"] = check_imports(workers)
        for kind, n in (("exec", execs), ("connect", connects)):
            peers = _peers(kind, port)
            if kind == "exec":
                def argv_for(k, w):
                    return [PY, "-I", "-S", "-c", EXEC_PROG, str(k), str(w)]
            else:
                def argv_for(k, w):
                    return [PY, "-I", "-S", "-c", CONNECT_PROG, HOST, str(port), str(k),
                            str(w)]
            st, unavailable = _measure(workers, kind, peers, argv_for, rounds, n,
                                       max(5, n // 10), log)
            out[kind] = {"peers": {p.name: p.about for p in peers}, "stats": st,
                         "unavailable": unavailable}
    finally:
        for w in workers.values():
            w.close()
        lsock.close()
    return out


def markdown(result):
    lines = ["## policy_fn cost", "",
             "Median µs per operation timed inside the sandbox (`/usr/bin/python3`): "
             "**exec** = fork + `execve(/bin/true)` + wait; **connect** = one TCP "
             f"`connect()` to {HOST} allowed by an IP rule. {result['rounds']} interleaved "
             f"rounds × {result['execs']} execs / {result['connects']} connects per peer. "
             "The policy_fn returns None (allow) for everything; ours freezes the whole "
             "sandbox (ptrace) around every held exec so argv cannot change under the "
             "check.", ""]
    for kind in ("exec", "connect"):
        r = result[kind]
        st = r["stats"]
        bare = st["bare"]["median"]
        lines += [f"### {kind}", "", "| peer | median µs | p99 µs | added vs same peer "
                  "without policy_fn | vs bare |", "|---|---:|---:|---:|---:|"]
        for name, about in r["peers"].items():
            if name not in st:
                lines.append(f"| {about} | n/a: {r['unavailable'].get(name, '')[:80]} "
                             "| | | |")
                continue
            base = {"ours_fn": "ours", "ours_fn_narrow": "ours",
                    "upstream_fn": "upstream"}.get(name)
            added = (f"{st[name]['median'] - st[base]['median']:+.0f} µs"
                     if base in st else "")
            lines.append(f"| {about} | {st[name]['median']:.0f} | {st[name]['p99']:.0f} "
                         f"| {added} | {st[name]['median'] / bare:.2f}x |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    harness.main(__doc__, run, markdown)
