"""Copy-on-write workspace cost: wall time of file-heavy commands run with a COW workdir,
against the same sandbox without one, bare execution, and the upstream wheel's COW; and
the COW fork rate of fork(1000) against upstream's.

Workloads (each run from the workdir, a generated git repository of ~2,000 files in 100
directories): `python3 -c 'import json, email, http.client'` (hundreds of opens and stats,
almost all outside the workdir: each still makes a supervisor round trip, since seccomp
cannot filter by path) and `git status --porcelain` (a stat of every tracked file and a
listing of every directory, all inside the workdir). The COW runs end with ABORT (nothing
is written back; the layer is discarded), so every run starts from the same tree. One peer
is no sandbox at all but the overlay backend's kernel floor: the same overlayfs mount in a
fresh user + mount namespace, then the command (bench/overlay_floor.c). Peers
are interleaved round by round; medians of wall time per run (start to exit, as
`Sandbox.run()` / `subprocess.run()` see it).

    python bench/cow.py [--quick]
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from harness import UPSTREAM_VERSION, check_imports, rotations, start_workers, stats

NAME = "cow"
PY = "/usr/bin/python3"
SYSTEM = ["/usr", "/lib", "/lib64", "/bin", "/etc"]
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent", "GIT_OPTIONAL_LOCKS": "0"}


@dataclass
class Peer:
    name: str
    worker: str
    policy: dict | None
    about: str


def make_repo(root, dirs=100, files=20):
    os.makedirs(root)
    for d in range(dirs):
        sub = os.path.join(root, f"pkg{d:03d}")
        os.mkdir(sub)
        for f in range(files):
            with open(os.path.join(sub, f"mod{f:02d}.py"), "w") as fh:
                fh.write(f"# module {d}.{f}\nVALUE = {d * files + f}\n" * 20)
    env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=root, env=env, check=True)
    # An index written in the second its files were is "racy": every `git status` then
    # reads all of them again, and with optional locks off (GIT_ENV, which every peer
    # runs with) never records that they are clean. A repository is older than that.
    time.sleep(1.1)
    subprocess.run(["git", "update-index", "--refresh", "-q"], cwd=root, env=env,
                   check=True)


def _peers(repo, storage, floor=None):
    base = {"fs_readable": SYSTEM + [repo], "fs_writable": ["/dev/null"], "cwd": repo,
            "env": GIT_ENV}
    cow = {"fs_readable": SYSTEM, "fs_writable": ["/dev/null"], "cwd": repo, "env": GIT_ENV,
           "workdir": repo, "fs_storage": storage, "on_exit": "abort", "on_error": "abort"}
    up_cow = {k: v for k, v in cow.items() if k != "fs_storage"}
    return [
        Peer("bare", "plain", None, "bare (`subprocess.run`, same cwd)"),
        Peer("ours", "ours", base, "ours, workdir readable, no COW"),
        Peer("ours_cow", "ours", {**cow, "workspace_backend": "overlay"},
             "ours, COW `workdir`, overlay backend (ABORT at exit)"),
        Peer("ours_cow_seccomp", "ours", {**cow, "workspace_backend": "seccomp"},
             "ours, COW `workdir`, seccomp backend (ABORT at exit)"),
        *([Peer("overlay_floor", "plain", {"argv": floor},
                "overlayfs alone, no sandbox (the backend's kernel floor: "
                "bench/overlay_floor.c)")]
          if floor else []),
        Peer("upstream", "upstream", base, f"upstream {UPSTREAM_VERSION}, no COW"),
        Peer("upstream_cow", "upstream", up_cow,
             f"upstream {UPSTREAM_VERSION}, COW `workdir` (ABORT at exit)"),
    ]


def _ask(workers, peer, argv, repo):
    if peer.policy is None:
        return workers["plain"].ask({"op": "subprocess_run", "argv": argv, "cwd": repo,
                                     "env": GIT_ENV})
    if peer.name == "overlay_floor":
        return workers["plain"].ask({"op": "subprocess_run", "argv": peer.policy["argv"] + argv,
                                     "cwd": repo, "env": GIT_ENV})
    return workers[peer.worker].ask({"op": "api_run", "argv": argv, "policy": peer.policy})


def run(rounds=6, per_round=10, quick=False, log=lambda s: print(s, file=sys.stderr)):
    if quick:
        rounds, per_round = 2, 3
    tmp = tempfile.mkdtemp(prefix="sandlock-bench-cow-")
    repo, storage = os.path.join(tmp, "repo"), os.path.join(tmp, "store")
    make_repo(repo)
    workloads = {
        "python_imports": [PY, "-c", "import json, email, http.client"],
        "git_status": ["git", "status", "--porcelain"],
    }
    workers = start_workers()
    out = {"name": NAME, "rounds": rounds, "per_round": per_round,
           "repo": "git repository, 100 directories x 20 files"}
    try:
        out["imports"] = check_imports(workers)
        floor = _overlay_floor(tmp, repo, log)
        peers = _peers(repo, storage, floor)
        out["peers"] = {p.name: p.about for p in peers}
        for wname, argv in workloads.items():
            samples, unavailable = {}, {}
            for p in peers:
                r = _ask(workers, p, argv, repo)
                if not r["ok"]:
                    if p.worker != "upstream":
                        raise RuntimeError(f"cow/{wname}: {p.name} failed: {r['err']}")
                    unavailable[p.name] = (r["err"] or "")[:200]
                    log(f"  {wname}/{p.name}: unavailable ({unavailable[p.name]})")
                    continue
                samples[p.name] = []
            active = [p for p in peers if p.name in samples]
            for i, order in enumerate(rotations(active, rounds)):
                for p in order:
                    for _ in range(per_round):
                        r = _ask(workers, p, argv, repo)
                        if not r["ok"]:
                            raise RuntimeError(f"cow/{wname}: {p.name}: {r['err']}")
                        samples[p.name].append(r["ns"])
                log(f"  {wname}: {i + 1}/{rounds} rounds")
            out[wname] = {"stats": {n: stats(v) for n, v in samples.items()},
                          "unavailable": unavailable}
        if floor and os.listdir(floor[2]):
            raise RuntimeError("cow: the overlayfs-alone peer wrote to its upper directory "
                               "(its runs are then not alike)")
        leftover = os.listdir(storage) if os.path.isdir(storage) else []
        out["layers_left_behind"] = len(leftover)
        out["fork"] = _fork_rates(workers, rounds, log, tmp)
    finally:
        for w in workers.values():
            w.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _overlay_floor(tmp, repo, log):
    """bench/overlay_floor.c built for this run, with the upper and work directories every
    run of it shares (the workloads write nothing, checked at the end): its argv prefix,
    or None (no C compiler, or no unprivileged overlay mount here)."""
    exe = os.path.join(tmp, "overlay_floor")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "overlay_floor.c")
    cp = subprocess.run(["cc", "-O2", "-o", exe, src], capture_output=True, text=True)
    if cp.returncode != 0:
        log(f"  overlayfs alone: not measured (cc: {cp.stderr.strip()[:200]})")
        return None
    upper, work = os.path.join(tmp, "floor-upper"), os.path.join(tmp, "floor-work")
    os.mkdir(upper)
    os.mkdir(work)
    argv = [exe, repo, upper, work]
    cp = subprocess.run(argv + ["true"], cwd=repo, capture_output=True, text=True)
    if cp.returncode != 0:
        log(f"  overlayfs alone: not measured ({cp.stderr.strip()[:200]})")
        return None
    return argv


FORK_N = 1000
FORK_INIT_MB = (0, 200)  # a trivial init_fn; one that loads a 200 MB model


def _floor_lib(tmp, log):
    """bench/fork_floor.c, built for this run; None without a C compiler."""
    out = os.path.join(tmp, "fork_floor.so")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_floor.c")
    cp = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", out, src],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        log(f"  fork floor: not measured (cc: {cp.stderr.strip()[:200]})")
        return None
    return out


def _fork_rates(workers, rounds, log, tmp):
    """fork(1000) with an init_fn building 0 or 200 MB (every page written) and a work_fn
    printing its id: clones per second, wall time of fork() to every clone done (ours:
    fork() + wait()), ours' own figure for the forking alone (the init process's loop),
    and the kernel's floor: raw fork + _exit from our worker's process."""
    import statistics
    policy = {"fs_readable": SYSTEM, "fs_writable": ["/dev/null"]}
    lib = _floor_lib(tmp, log)
    out = {"n": FORK_N, "unavailable": {}, "floor": None, "caller_anon_mib": None}
    floor = []
    for mb in FORK_INIT_MB:
        res = {"ours": [], "ours_forking": [], "upstream": []}
        for i in range(rounds):
            for name in (("ours", "upstream") if i % 2 == 0 else ("upstream", "ours")):
                if name in out["unavailable"]:
                    continue
                r = workers[name].ask({"op": "fork", "n": FORK_N, "policy": policy,
                                       "init_mb": mb})
                if not r.get("ok"):
                    if name == "ours":
                        raise RuntimeError(f"cow/fork: ours failed: {r.get('err')}")
                    out["unavailable"][name] = (r.get("err") or "")[:200]
                    log(f"  fork/upstream: unavailable ({out['unavailable'][name]})")
                    continue
                res[name].append(FORK_N / (r["ns"] / 1e9))
                if name == "ours":
                    res["ours_forking"].append(FORK_N / r["fork_seconds"])
                    out["caller_anon_mib"] = r["caller_anon_kib"] / 1024
            if lib is not None and mb == 0:
                r = workers["ours"].ask({"op": "fork_floor", "n": FORK_N, "lib": lib})
                if r.get("ok"):
                    floor.append(FORK_N / (r["ns"] / 1e9))
            log(f"  fork (init {mb} MB): {i + 1}/{rounds} rounds")
        out[f"init_{mb}"] = {k: statistics.median(v) if v else None for k, v in res.items()}
    out["floor"] = statistics.median(floor) if floor else None
    return out


def markdown(result):
    lines = ["## Copy-on-write workspace", "",
             f"Wall time per run (ms, median of {result['rounds']} interleaved rounds × "
             f"{result['per_round']} runs), from the workdir: a {result['repo']}. COW runs "
             "end with ABORT. `vs no COW` compares with the same implementation without a "
             "workdir.", ""]
    for wname, title in (("python_imports", "`python3 -c 'import json, email, http.client'`"),
                         ("git_status", "`git status --porcelain`")):
        r = result[wname]
        st = r["stats"]
        bare = st["bare"]["median"]
        lines += [f"### {title}", "", "| peer | median ms | p99 ms | vs bare | vs no COW |",
                  "|---|---:|---:|---:|---:|"]
        for name, about in result["peers"].items():
            if name not in st:
                why = " ".join(r["unavailable"].get(name, "").split())[:80]
                lines.append(f"| {about} | n/a: {why} | | | |")
                continue
            s = st[name]
            base = {"ours_cow": "ours", "ours_cow_seccomp": "ours",
                    "upstream_cow": "upstream"}.get(name)
            vs = f"{s['median'] / st[base]['median']:.2f}x" if base in st else ""
            lines.append(f"| {about} | {s['median']:.2f} | {s['p99']:.2f} | "
                         f"{s['median'] / bare:.2f}x | {vs} |")
        if "ours_cow" in st and "upstream_cow" in st:
            lines.append("")
            lines.append(f"Ours with COW / upstream with COW: "
                         f"{st['ours_cow']['median'] / st['upstream_cow']['median']:.2f}x.")
        lines.append("")
    f = result["fork"]
    lines += ["### COW fork", "",
              f"`fork({f['n']})` with a `work_fn` that prints its id, and an `init_fn` that "
              "builds nothing or a 200 MB model (every page written); median clones per "
              "second over the rounds. The caller is the benchmark's worker process "
              f"({f['caller_anon_mib']:.0f} MiB of anonymous memory: each fork copies their "
              "page-table entries, and each clone's exit tears them down).", "",
              "| peer | init_fn | clones/s, fork() to all done | clones/s, forking alone |",
              "|---|---|---:|---:|"]
    for mb in FORK_INIT_MB:
        r = f[f"init_{mb}"]
        what = f"{mb} MB" if mb else "nothing"
        lines.append(f"| ours | {what} | {r['ours']:.0f} | {r['ours_forking']:.0f} |")
        if r.get("upstream"):
            lines.append(f"| upstream {UPSTREAM_VERSION} (fork() returns when its clones "
                         f"are done) | {what} | {r['upstream']:.0f} | |")
        else:
            why = " ".join(f["unavailable"].get("upstream", "").split())[:80]
            lines.append(f"| upstream {UPSTREAM_VERSION} | {what} | n/a: {why} | |")
    if f.get("floor"):
        lines += ["", f"The kernel's own floor from the same worker process (bench/"
                  f"fork_floor.c: fork + `_exit(0)`, then reap; no sandbox, no Python in "
                  f"the children): {f['floor']:.0f} forks/s."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import json
    quick = "--quick" in sys.argv
    res = run(quick=quick)
    print(json.dumps(res, indent=1))
    print(markdown(res))
