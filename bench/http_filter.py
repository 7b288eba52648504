"""HTTP filter cost: keep-alive GET latency and throughput through the filter, versus the
same requests sent directly, and versus the upstream wheel's HTTP proxy with the same rule.

A program (the system /usr/bin/python3) sends N GETs over one keep-alive connection to a
server this benchmark runs, timing each request/response with perf_counter_ns; the
throughput is N over the time of the whole loop. HTTP: to 127.0.0.2; intercepted HTTPS: to
bench.test (resolved by a DNS server the benchmark runs) with Sandlock's CA injected and
the upstream verified against the benchmark's test CA. Peers interleaved round by round.

    python bench/http_filter.py [--quick]
"""

import http.server
import os
import ssl
import sys
import tempfile
import threading
from dataclasses import dataclass

import harness
from harness import ROOT, UPSTREAM_VERSION, check_imports, rotations, \
    start_workers, stats

NAME = "http_filter"
HOST, NAME_TLS = "127.0.0.2", "bench.test"
PY = "/usr/bin/python3"
SYSTEM = ["/usr", "/lib", "/lib64", "/bin", "/etc"]
TARGET_P50_MS = 1.0

PROG = r"""
import http.client, socket, ssl, sys, time
scheme, name, port, n, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cafile = None if sys.argv[6] == "-" else sys.argv[6]
ip = sys.argv[7] if sys.argv[7] != "-" else \
    socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
sock = socket.create_connection((ip, port))
if scheme == "https":
    ctx = ssl.create_default_context(cafile=cafile)
    sock = ctx.wrap_socket(sock, server_hostname=name)
conn = http.client.HTTPConnection(name, port)
conn.sock = sock
ts = []
t_start = 0
for i in range(warm + n):
    if i == warm:
        t_start = time.perf_counter_ns()
    t0 = time.perf_counter_ns()
    conn.request("GET", "/api/item", headers={"Host": f"{name}:{port}"})
    r = conn.getresponse()
    body = r.read()
    t1 = time.perf_counter_ns()
    if r.status != 200:
        print("status", r.status, body[:100])
        sys.exit(3)
    if i >= warm:
        ts.append(t1 - t0)
total = time.perf_counter_ns() - t_start
print(total, " ".join(map(str, ts)))
"""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are separate writes

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _server(host, tls_ctx=None):
    srv = http.server.ThreadingHTTPServer((host, 0), _Handler)
    if tls_ctx is not None:
        srv.socket = tls_ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@dataclass
class Peer:
    name: str
    worker: str
    policy: dict | None
    about: str


def run(rounds=6, requests=1000, quick=False, log=lambda s: print(s, file=sys.stderr)):
    if quick:
        rounds, requests = 2, 200
    sys.path.insert(0, str(ROOT / "tests"))
    import trustme
    from dnsserver import TestDnsServer
    ca = trustme.CA()
    tls_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(NAME_TLS).configure_cert(tls_ctx)
    work = tempfile.mkdtemp(prefix="sandlock-bench-http-")
    os.chmod(work, 0o755)
    ca_file = os.path.join(work, "ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    os.chmod(ca_file, 0o644)
    # Upstream's interception takes its CA as files (http_ca, http_key).
    mitm = trustme.CA(key_type=trustme.KeyType.RSA)  # in case only RSA CAs are accepted
    mitm_ca, mitm_key = os.path.join(work, "mitm-ca.pem"), os.path.join(work, "mitm-key.pem")
    mitm.cert_pem.write_to_path(mitm_ca)
    mitm.private_key_pem.write_to_path(mitm_key)
    os.chmod(mitm_ca, 0o644)
    plain, secure = _server(HOST), _server("127.0.0.1", tls_ctx)
    dns = TestDnsServer({NAME_TLS: ["127.0.0.1"]})
    hport, sport = plain.server_address[1], secure.server_address[1]
    fs = {"fs_readable": SYSTEM + [work], "fs_writable": ["/dev/null"]}
    http_rule = {"net_allow": [f"{HOST}:{hport}"], "http_allow": [f"GET {HOST}/api/*"],
                 "http_ports": [hport]}
    https_rule = {"net_allow": [f"{NAME_TLS}:{sport}"], "net_allow_private": True,
                  "dns_servers": [dns.address], "http_allow": [f"GET {NAME_TLS}/api/*"],
                  "http_ports": [sport], "http_inject_ca": True, "http_upstream_ca": ca_file}
    kinds = {
        "http": ([Peer("bare", "plain", None, "direct (plain `subprocess.run`)"),
                  Peer("ours", "ours", {**fs, **http_rule},
                       f'ours: `http_allow=["GET {HOST}/api/*"]` (the filter)'),
                  Peer("upstream", "upstream", {**fs, **http_rule},
                       f"upstream {UPSTREAM_VERSION}, the same rule (its proxy)")],
                 ("http", HOST, hport, None)),
        "https": ([Peer("bare", "plain", None, "direct TLS (plain `subprocess.run`)"),
                   Peer("ours", "ours", {**fs, **https_rule},
                        "ours: the same rule, HTTPS intercepted (injected CA)"),
                   Peer("upstream", "upstream",
                        {**fs, "net_allow": [f"127.0.0.1:{sport}"],
                         "http_allow": ["GET 127.0.0.1/api/*"], "http_ports": [sport],
                         "http_ca": mitm_ca, "http_key": mitm_key},
                        f"upstream {UPSTREAM_VERSION}, the same rule, its interception "
                        "(http_ca/http_key)")],
                  ("https", NAME_TLS, sport, ca_file)),
    }
    os.environ.setdefault("SANDLOCK_CERTS_DIR", os.path.join(work, "certs"))
    workers = start_workers()
    out = {"name": NAME, "rounds": rounds, "requests": requests}
    try:
        out["imports"] = check_imports(workers)
        for kind, (peers, (scheme, name, port, cafile)) in kinds.items():
            def argv(n, warm, peer):
                bare = peer.policy is None  # trusts the test CA, cannot resolve bench.test
                up = peer.worker == "upstream" and scheme == "https"  # trusts its MITM CA
                trust = cafile if bare and cafile else mitm_ca if up else "-"
                return [PY, "-I", "-S", "-c", PROG, scheme, "127.0.0.1" if up else name,
                        str(port), str(n), str(warm), trust,
                        "127.0.0.1" if (bare or up) and scheme == "https" else "-"]
            samples, totals, unavailable = {}, {}, {}
            for p in peers:
                r = _ask(workers, p, argv(5, 0, p), name)
                if _parse(r, 5) is None:
                    why = f"{r.get('err') or ''} {r.get('out', '')[:160]!r}".strip()
                    if p.worker != "upstream":
                        raise RuntimeError(f"http_filter/{kind}: {p.name} failed: {why}")
                    unavailable[p.name] = why
                    continue
                samples[p.name], totals[p.name] = [], []
            active = [p for p in peers if p.name in samples]
            for i, order in enumerate(rotations(active, rounds)):
                for p in order:
                    parsed = _parse(_ask(workers, p, argv(requests, 50, p), name), requests)
                    if parsed is None:
                        raise RuntimeError(f"http_filter/{kind}: {p.name} failed in round "
                                           f"{i + 1}")
                    total, ns = parsed
                    samples[p.name] += ns
                    totals[p.name].append(requests / (total / 1e9))
                log(f"  {kind}: {i + 1}/{rounds} rounds")
            out[kind] = {"peers": {p.name: p.about for p in peers},
                         "stats": {k: stats(v, unit=1e6) for k, v in samples.items()},
                         "throughput": {k: sorted(v)[len(v) // 2] for k, v in totals.items()},
                         "unavailable": unavailable}
    finally:
        for w in workers.values():
            w.close()
        plain.shutdown()
        secure.shutdown()
    return out


def _ask(workers, peer, argv, name):
    if peer.policy is None:
        return workers["plain"].ask({"op": "subprocess_run", "argv": argv, "capture": True})
    return workers[peer.worker].ask({"op": "api_run", "argv": argv, "capture": True,
                                     "policy": peer.policy})


def _parse(r, n):
    try:
        parts = [int(x) for x in r.get("out", "").split()]
    except ValueError:
        return None
    if not r.get("ok") or len(parts) != n + 1:
        return None
    return parts[0], parts[1:]


def markdown(result):
    lines = ["## HTTP filter", "",
             f"Keep-alive GETs over one connection, timed inside the sandbox (`{PY}`, "
             f"`http.client`): {result['rounds']} interleaved rounds × {result['requests']} "
             "requests per peer (after 50 untimed ones); latency per request/response, "
             "throughput = requests over the loop's time (median over rounds).", ""]
    for kind in ("http", "https"):
        r = result.get(kind)
        if not r:
            continue
        st, tp = r["stats"], r["throughput"]
        bare = st["bare"]
        lines += [f"### {kind.upper()}", "",
                  "| peer | p50 ms | p99 ms | added p50 ms | added p99 ms | requests/s |",
                  "|---|--:|--:|--:|--:|--:|"]
        for name, about in r["peers"].items():
            if name not in st:
                lines.append(f"| {about} | n/a: {r['unavailable'].get(name, '')[:80]} "
                             "| | | | |")
                continue
            s = st[name]
            lines.append(f"| {about} | {s['median']:.3f} | {s['p99']:.3f} | "
                         f"{s['median'] - bare['median']:+.3f} | "
                         f"{s['p99'] - bare['p99']:+.3f} | {tp[name]:,.0f} |")
        if kind == "https" and "upstream" in r["unavailable"]:
            lines += ["", f"Upstream {UPSTREAM_VERSION}'s interception could not be measured: "
                      "its Python API fails with `sandlock_create failed` (no reason given) when "
                      "`http_ca`/`http_key` are set (RSA or ECDSA CA alike), and warns that "
                      "`http_inject_ca` and `http_ca_out` are \"not wired through FFI\"."]
        added = st["ours"]["median"] - bare["median"]
        lines.append("")
        lines.append(f"Target: p50 added latency ≤ {TARGET_P50_MS} ms: {added:+.3f} ms, "
                     f"{'met' if added <= TARGET_P50_MS else 'MISSED'}.")
        if "upstream" in tp and st["upstream"]["median"] > 20:
            lines.append("Upstream's proxy pays a delayed-ACK stall (~40 ms) on every "
                         "response here: it writes head and body separately without "
                         "TCP_NODELAY (ours sets it on both of its sockets).")
        if "upstream" in tp:
            ratio = tp["ours"] / tp["upstream"]
            lines.append(f"Target: throughput ≥ half of upstream's proxy: "
                         f"{ratio:.2f}x of upstream, {'met' if ratio >= 0.5 else 'MISSED'}.")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    harness.main(__doc__, run, markdown)
