"""connect() cost: µs per TCP connect() to loopback, timed inside the sandboxed process.

A small program (the system /usr/bin/python3) does N connects to a listener this
benchmark runs on 127.0.0.2, timing `socket.connect` alone with perf_counter_ns, and
prints every sample. Each peer runs it under a different network rule; peers are
interleaved round by round (the first peer rotating) and the samples pooled.

    python bench/connect.py [--rounds R] [--connects N] [--quick]

Run it with the project venv's python: the DNS server of the hostname peer
(tests/dnsserver.py) needs dnspython.
"""

import argparse
import socket
import sys
import threading
from dataclasses import dataclass

from harness import OURS_PY, ROOT, UPSTREAM_VERSION, Worker, check_imports, ensure_setup, \
    rotations, start_workers, stats, verdict

NAME = "connect"
HOST, DENIED_HOST = "127.0.0.2", "127.0.0.3"
DNS_NAME = "bench.sandlock.test"
PY = "/usr/bin/python3"
SYSTEM = ["/usr", "/lib", "/lib64", "/bin", "/etc"]
FS = {"fs_readable": SYSTEM, "fs_writable": ["/dev/null"]}
TARGET_LANDLOCK = 1.10  # median of a connect Landlock alone decides, over bare
TARGET_SUPERVISOR_US = 100  # median µs a supervised connect may add over bare
COLORS = {"ours": "tab:blue", "upstream": "tab:orange", "bare": "tab:green"}  # as startup's

# Runs confined: args host port n warmup. Prints n samples (ns), or "refused ERRNO ..."
# and exits 3. The client resets on close (SO_LINGER 0, untimed) so that no TIME_WAIT
# piles up over the tens of thousands of connects of a run.
PROG = r"""
import socket, struct, sys, time
host, port, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
linger = struct.pack("ii", 1, 0)
ts = []
for i in range(warm + n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        t0 = time.perf_counter_ns()
        s.connect((host, port))
        t1 = time.perf_counter_ns()
    except OSError as e:
        print("refused", e.errno, e.strerror)
        sys.exit(3)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    s.close()
    if i >= warm:
        ts.append(t1 - t0)
print(" ".join(map(str, ts)))
"""


@dataclass
class Peer:
    name: str
    worker: str  # ours | ours_python (C fast path switched off) | upstream | plain
    policy: dict | None  # network fields (with FS added); None: no sandbox
    denied: tuple | None  # a destination the rule must refuse (a listener is there)
    about: str
    upstream: str | None = None  # the upstream peer with the same rule


def _peers(port, decoy_port, dns):
    port_rule, ip_rule = f":{port}", f"{HOST}:{port}"
    other_port, other_host = (HOST, decoy_port), (DENIED_HOST, port)
    return [
        Peer("bare", "plain", None, None, "the same program under plain `subprocess.run`"),
        Peer("ours_port", "ours", {"net_allow": [port_rule]}, other_port,
             f'`net_allow=["{port_rule}"]`: connect() reaches the supervisor (unix-socket '
             "gating; the bare form also grants UDP), whose C fast path lets it continue "
             "(single-threaded caller); Landlock checks the port in the kernel",
             "upstream_port"),
        Peer("ours_port_unix", "ours", {"net_allow": [port_rule], "net_allow_unix": ["*"]},
             other_port, f'`net_allow=["{port_rule}"], net_allow_unix=["*"]`',
             "upstream_port"),
        Peer("ours_tcp_port_unix", "ours",
             {"net_allow": [f"tcp://{port_rule}"], "net_allow_unix": ["*"]}, other_port,
             f'`net_allow=["tcp://{port_rule}"], net_allow_unix=["*"]`: TCP only, so '
             "nothing needs the supervisor: Landlock alone decides", "upstream_tcp_port"),
        Peer("ours_ip", "ours", {"net_allow": [ip_rule]}, other_host,
             f'`net_allow=["{ip_rule}"]`: the supervisor decides (in Python, the first time) '
             "and connects on the sandbox's behalf (in C once the verdict is known)",
             "upstream_ip"),
        Peer("ours_ip_python", "ours_python", {"net_allow": [ip_rule]}, other_host,
             f"the same as ours_ip with the C fast path switched off "
             "(SANDLOCK_NO_FASTPATH=1): every connect decided and performed in Python",
             "upstream_ip"),
        Peer("ours_host", "ours", {"net_allow": [f"{DNS_NAME}:{port}"],
                                   "dns_servers": [dns], "net_allow_private": True},
             other_host, f'`net_allow=["{DNS_NAME}:{port}"]`, resolved (to {HOST}) through '
             "a DNS server run by the benchmark and pinned at sandbox start; the program "
             "connects to the IP", "upstream_host"),
        Peer("upstream_port", "upstream", {"net_allow": [port_rule]}, other_port,
             f'upstream sandlock {UPSTREAM_VERSION}, `net_allow=["{port_rule}"]`'),
        Peer("upstream_tcp_port", "upstream", {"net_allow": [f"tcp://{port_rule}"]},
             other_port, f'upstream, `net_allow=["tcp://{port_rule}"]`'),
        Peer("upstream_ip", "upstream", {"net_allow": [ip_rule]}, other_host,
             f'upstream, `net_allow=["{ip_rule}"]`'),
    ]


UNAVAILABLE = {
    "upstream_host": "upstream has no dns_servers option: it resolves rule hostnames "
                     "with the host's resolver when the sandbox is created, which cannot "
                     f"see the benchmark's DNS server (and {DNS_NAME} is in no public zone)",
}


def _listen(host, port=0):
    """A TCP listener that accepts and closes, in a daemon thread; returns its port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(4096)

    def serve():
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    return s


def _ask(workers, peer, dest, n, warm):
    argv = [PY, "-I", "-S", "-c", PROG, dest[0], str(dest[1]), str(n), str(warm)]
    if peer.policy is None:
        return workers["plain"].ask({"op": "subprocess_run", "argv": argv, "capture": True})
    return workers[peer.worker].ask({"op": "api_run", "argv": argv, "capture": True,
                                     "policy": {**FS, **peer.policy}})


def _samples(r, n):
    try:
        ns = [int(x) for x in r.get("out", "").split()]
    except ValueError:
        ns = []
    return ns if r["ok"] and len(ns) == n else None


def _verify(workers, peers, dest, log):
    """Every peer's program must succeed; every sandboxed peer's denied destination (where
    a listener is, as a bare run shows) must be refused: else the setup is broken.
    Returns (active peers, unavailable {name: why}, denial outcome {name: text})."""
    active, unavailable, denials = [], dict(UNAVAILABLE), {}
    bare = peers[0]
    for peer in peers:
        r = _ask(workers, peer, dest, 20, 0)
        if _samples(r, 20) is None:
            why = f"{r['err'] or 'unparseable output'}: {r.get('out', '')[:200]!r}"
            if peer.worker != "upstream":
                raise RuntimeError(f"connect: {peer.name} cannot connect to {dest}: {why}")
            unavailable[peer.name] = why
            log(f"  {peer.name}: unavailable ({why})")
            continue
        active.append(peer)
        if peer.denied is None:
            continue
        if _samples(_ask(workers, bare, peer.denied, 1, 0), 1) is None:
            raise RuntimeError(f"connect: bare cannot reach the decoy {peer.denied}")
        r = _ask(workers, peer, peer.denied, 1, 0)
        out = r.get("out", "").strip()
        if out.startswith("refused"):
            denials[peer.name] = f"{peer.denied[0]}:{peer.denied[1]} {out}"
        elif peer.worker.startswith("ours"):
            raise RuntimeError(f"connect: {peer.name} did not refuse {peer.denied}: "
                               f"{r['err']} {out[:200]!r}")
        else:
            denials[peer.name] = f"{peer.denied[0]}:{peer.denied[1]} NOT refused: {out[:80]!r}"
    return active, unavailable, denials


def run(rounds=10, connects=2000, warmup=200, quick=False,
        log=lambda s: print(s, file=sys.stderr)):
    if quick:
        rounds, connects, warmup = 2, 500, 100
    sys.path.insert(0, str(ROOT / "tests"))
    from dnsserver import TestDnsServer
    dns = TestDnsServer({DNS_NAME: [HOST]})
    listeners = [_listen(HOST)]
    port = listeners[0].getsockname()[1]
    listeners += [_listen(DENIED_HOST, port), _listen(HOST)]  # decoys for the denial check
    peers = _peers(port, listeners[2].getsockname()[1], dns.address)
    dest = (HOST, port)
    workers = start_workers()
    workers["ours_python"] = Worker(OURS_PY, env={"SANDLOCK_NO_FASTPATH": "1"})
    try:
        imports = check_imports(workers)
        for name, want in (("ours", True), ("ours_python", False)):
            if workers[name].ask({"op": "info"})["fast_path"] is not want:
                raise RuntimeError(f"connect: worker {name}: the C fast path should be "
                                   f"{'loaded' if want else 'off'} (make helper)")
        supervised = {}
        for p in peers:
            if p.worker.startswith("ours"):
                info = workers["ours"].ask({"op": "info", "policy": {**FS, **p.policy}})
                supervised[p.name] = info["net_supervised"]
        log(f"connect: {HOST}:{port}, {rounds} rounds x {connects} connects")
        active, unavailable, denials = _verify(workers, peers, dest, log)
        samples = {p.name: [] for p in active}
        round_medians = {p.name: [] for p in active}
        for i, order in enumerate(rotations(active, rounds)):
            for peer in order:
                r = _ask(workers, peer, dest, connects, warmup)
                ns = _samples(r, connects)
                if ns is None:
                    raise RuntimeError(f"connect: {peer.name} failed in round {i + 1}: "
                                       f"{r['err']} {r.get('out', '')[:200]!r}")
                samples[peer.name] += ns
                round_medians[peer.name].append(stats(ns, unit=1e3)["median"])
            log(f"  {i + 1}/{rounds} rounds")
    finally:
        for w in workers.values():
            w.close()
        for s in listeners:
            s.close()
    st = {name: stats(ns, unit=1e3) for name, ns in samples.items()}
    ratios = {}
    for p in peers:
        if p.worker.startswith("ours") and p.name in st:
            med = st[p.name]["median"]
            ratios[p.name] = {
                "vs_bare": med / st["bare"]["median"],
                "added_us": med - st["bare"]["median"],
                "upstream": p.upstream,
                "vs_upstream": (med / st[p.upstream]["median"]) if p.upstream in st else None}
    return {"name": NAME, "rounds": rounds, "connects": connects, "warmup": warmup,
            "server": f"{HOST}:{port}", "imports": imports, "fs": FS,
            "peers": {p.name: p.about for p in peers}, "supervised": supervised,
            "denials": denials, "unavailable": unavailable, "stats": st,
            "round_medians": round_medians, "ratios": ratios}


def _target(result, name):
    r = result["ratios"][name]
    if result["supervised"][name]:
        ok = r["added_us"] <= TARGET_SUPERVISOR_US
        return (f"supervisor path: ≤ {TARGET_SUPERVISOR_US} µs added: "
                f"{r['added_us']:+.1f} µs, {'met' if ok else 'MISSED'}")
    ok = r["vs_bare"] <= TARGET_LANDLOCK
    return (f"Landlock path: within {TARGET_LANDLOCK - 1:.0%} of bare: "
            f"{r['vs_bare']:.2f}x, {'met' if ok else 'MISSED'}")


def markdown(result):
    st, rm = result["stats"], result["round_medians"]
    out = ["## connect() cost", "",
           f"µs per TCP `connect()` to a listener on {result['server']} run by the "
           f"benchmark, timed inside the sandboxed process (`{PY}`, `perf_counter_ns` "
           f"around `socket.connect` alone). {result['rounds']} rounds × "
           f"{result['connects']} connects per peer (after {result['warmup']} untimed "
           "ones per run), interleaved round by round with the first peer rotating, "
           f"samples pooled. Sandboxes: read-only {', '.join(SYSTEM)}, writable /dev/null.",
           ""]
    out += [f"- **{name}**: {about}" for name, about in result["peers"].items()]
    out += ["", "| peer | connect path | median µs | p99 µs | mean µs | round medians µs |",
            "|---|---|--:|--:|--:|---|"]
    for name in result["peers"]:
        if name in st:
            s = st[name]
            path = {True: "supervisor", False: "Landlock only"}.get(
                result["supervised"].get(name), "")
            out.append(f"| {name} | {path} | {s['median']:.1f} | {s['p99']:.1f} | "
                       f"{s['mean']:.1f} | {min(rm[name]):.1f}–{max(rm[name]):.1f} |")
        else:
            out.append(f"| {name} | | unavailable | | | |")
    out += ["", "| ours | vs bare | added µs | vs upstream | in words |",
            "|---|--:|--:|---|---|"]
    for name, r in result["ratios"].items():
        up = (f"{r['vs_upstream']:.2f}x ({r['upstream']})" if r["vs_upstream"] is not None
              else f"n/a: {r['upstream']} unavailable")
        words = verdict(r["vs_bare"], "bare")
        if r["vs_upstream"] is not None:
            words += "; " + verdict(r["vs_upstream"], r["upstream"])
        out.append(f"| {name} | {r['vs_bare']:.2f}x | {r['added_us']:+.1f} | {up} | {words} |")
    out += ["", "Refusal check (a listener is there; a bare connect reaches it):", ""]
    out += [f"- {name}: {what}" for name, what in result["denials"].items()]
    out += [f"- {name} unavailable: {why}" for name, why in result["unavailable"].items()]
    out += ["", "Targets (upstream measured 170–230 µs per connect earlier, bare about 30 µs):",
            ""]
    out += [f"- {name}: {_target(result, name)}" for name in result["ratios"]
            if not name.endswith("_python")]  # a reference: the fast path switched off
    return "\n".join(out) + "\n"


def plot(result, ax):
    """Horizontal bars: median µs per connect per peer, p99 as a tick."""
    names = [n for n in result["peers"] if n in result["stats"]][::-1]
    med = [result["stats"][n]["median"] for n in names]
    p99 = [result["stats"][n]["p99"] for n in names]
    colors = [COLORS[n.split("_")[0]] for n in names]
    ax.barh(names, med, color=colors)
    ax.plot(p99, range(len(names)), "k|", markersize=14, label="p99")
    for y, (m, p) in enumerate(zip(med, p99)):
        ax.text(max(m, p) + max(p99) * 0.01, y, f"{m:.1f} (p99 {p:.0f})", va="center",
                fontsize=8)
    ax.set_xlim(right=max(p99) * 1.25)
    ax.set_xlabel("µs per connect(): median bar, p99 tick")
    ax.set_title(f"connect() to loopback, timed in the sandbox: {result['rounds']} × "
                 f"{result['connects']} connects per peer")
    ax.legend(fontsize=8, loc="lower right")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--connects", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="2 rounds x 500 connects")
    a = p.parse_args(argv)
    ensure_setup()
    result = run(a.rounds, a.connects, a.warmup, quick=a.quick)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
