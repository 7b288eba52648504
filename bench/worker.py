"""Benchmark worker: times one operation per request, under whichever interpreter runs it.

The harness starts one worker per peer interpreter (our venv, the upstream venv, a
plain one) so that every comparison is interleaved in one process tree. Protocol:
one JSON object per line on stdin, one JSON reply per line on stdout:

    {"op": "api_run", "argv": ["/bin/true"], "policy": {"fs_readable": [...]}}
    -> {"ns": 1234567, "ok": true, "err": null}

Timed ops: api_run, subprocess_run (optional "cwd", and "env": added to the worker's
own), cli_run (needs "cli": the command prefix), bwrap_run,
fork (n clones, init_mb of init state) and fork_floor (raw fork + _exit, from this process);
with "capture": true the reply also has "out", the command's stdout as text. Untimed:
info (with "policy": also whether our connect() is supervised under it); api_popen and
subprocess_popen start a long-lived command with stdio on /dev/null and reply
{"ok": true, "pid": ...}; stop {"pid": ...} kills and reaps it. Only info and the api_*
ops import `sandlock`, i.e. whichever one this interpreter finds.

Run as `worker.py run [--no-system] [-r PATH]... -- CMD...` it is instead a minimal
`sandlock run` for an interpreter whose sandlock has no CLI of its own (upstream's
wheel ships only the Python API): it times like a CLI, paying interpreter start-up
and `import sandlock` on every call.
"""

import json
import os
import subprocess
import sys
import time

_sandboxes = {}
_procs = {}  # pid -> a process started by api_popen / subprocess_popen


# policy_fn cannot cross JSON: a name stands for a callback defined here.
_CALLBACKS = {"allow": lambda event, ctx: None}


def _sandbox(policy):
    """One Sandbox per distinct policy, built on first use (kernel objects included)."""
    key = json.dumps(policy, sort_keys=True)
    if key not in _sandboxes:
        from sandlock import Sandbox
        fields = dict(policy)
        if "policy_fn" in fields:
            fields["policy_fn"] = _CALLBACKS[fields["policy_fn"]]
        import sandlock
        for key in ("on_exit", "on_error"):  # enums cannot cross JSON either
            if isinstance(fields.get(key), str):
                fields[key] = getattr(sandlock.BranchAction, fields[key].upper())
        _sandboxes[key] = Sandbox(**fields)
    return _sandboxes[key]


def _bwrap_cmd(argv, policy):
    binds = []
    for path in policy["fs_readable"]:
        if os.path.islink(path):  # merged-usr: /bin -> usr/bin etc.
            binds += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            binds += ["--ro-bind", path, path]
    return ["bwrap", *binds, "--unshare-all", "--die-with-parent", *argv]


def _cli_cmd(req):
    flags = ["--no-system"]  # the API grants nothing by default: match it
    for path in req["policy"]["fs_readable"]:
        flags += ["-r", path]
    return [*req["cli"], "run", *flags, "--", *req["argv"]]


# Each op: request -> (callable to time, check of its result -> error text or None).
def _tail(data):
    return data[-300:].decode(errors="replace")


def _api(req):
    sb = _sandbox(req["policy"])

    def check(r):
        return None if r.success else f"exit {r.exit_code}: {r.error or ''} {_tail(r.stderr)}"
    return (lambda: sb.run(req["argv"])), check


def _process(cmd, cwd=None, env=None):
    def check(cp):
        return None if cp.returncode == 0 else f"exit {cp.returncode}: {_tail(cp.stderr)}"
    # Output captured, as the sandbox APIs' run() do.
    env = {**os.environ, **env} if env else None
    return (lambda: subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                   cwd=cwd, env=env)), check


OPS = {
    "api_run": _api,
    "subprocess_run": lambda req: _process(req["argv"], req.get("cwd"), req.get("env")),
    "cli_run": lambda req: _process(_cli_cmd(req)),
    "bwrap_run": lambda req: _process(_bwrap_cmd(req["argv"], req["policy"])),
}


def _popen(req):
    if req["op"] == "api_popen":
        from sandlock import StdioMode  # ours and upstream's alike
        null = StdioMode.NULL
        proc = _sandbox(req["policy"]).popen(req["argv"], stdin=null, stdout=null, stderr=null)
    else:
        dn = subprocess.DEVNULL
        proc = subprocess.Popen(req["argv"], stdin=dn, stdout=dn, stderr=dn)
    _procs[proc.pid] = proc
    return {"ok": True, "pid": proc.pid}


def _stop(req):
    proc = _procs.pop(req["pid"])
    with proc:  # every Process/Popen here reaps its child (and frees its fds) on exit
        proc.kill()
    return {"ok": True}


_STATE = {}


def _fork_init(mb):
    """init_fn: `mb` MB of state, every page written (a model loaded once)."""
    def init():
        _STATE["model"] = bytearray(os.urandom(1 << 20) * mb) if mb else b"x"
    return init


def _fork_work(i):
    print(i, _STATE["model"][i * 4096 % len(_STATE["model"])])


def _anon_kib():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Anonymous:"))


def _fork(req):
    """fork(n) with init_fn building req["init_mb"] MB and a work_fn printing its id; ours
    also reports the init process's time to fork every clone. Upstream's fork() returns
    once its clones are done; ours once they are forked, so wait() is included."""
    from sandlock import Sandbox
    fields = dict(req["policy"])
    sb = Sandbox(**fields, init_fn=_fork_init(req.get("init_mb", 0)), work_fn=_fork_work)
    anon = _anon_kib()
    t0 = time.perf_counter_ns()
    fr = sb.fork(req["n"])
    if hasattr(fr, "wait"):
        fr.wait()
    ns = time.perf_counter_ns() - t0
    ok = len(fr) == req["n"]
    return {"ns": ns, "ok": ok, "err": None if ok else f"{len(fr)} clones",
            "fork_seconds": getattr(fr, "fork_seconds", None), "caller_anon_kib": anon}


def _fork_floor(req):
    """The kernel's own rate from this process: req["lib"] (bench/fork_floor.c) forks n
    children that _exit at once, then reaps them."""
    import ctypes
    lib = ctypes.CDLL(req["lib"])
    lib.fork_floor.restype = ctypes.c_longlong
    ns = lib.fork_floor(req["n"])
    return {"ns": ns, "ok": ns > 0, "err": None if ns > 0 else "fork failed",
            "caller_anon_kib": _anon_kib()}


def handle(req):
    if req["op"] == "info":
        import sandlock
        reply = {"ok": True, "version": sandlock.__version__, "file": sandlock.__file__,
                 "python": sys.version.split()[0]}
        if "policy" in req:  # ours: does connect() reach the supervisor under this policy?
            compiled = getattr(_sandbox(req["policy"]), "policy", None)
            reply["net_supervised"] = getattr(compiled, "net_supervised", None)
        try:  # ours: is the supervisor's C fast path loaded?
            from sandlock.supervisor.fastpath import fast_path
            reply["fast_path"] = fast_path() is not None
        except ImportError:
            reply["fast_path"] = None
        return reply
    try:
        if req["op"] == "fork":
            return _fork(req)
        if req["op"] == "fork_floor":
            return _fork_floor(req)
        if req["op"] in ("api_popen", "subprocess_popen"):
            return _popen(req)
        if req["op"] == "stop":
            return _stop(req)
        call, check = OPS[req["op"]](req)
        t0 = time.perf_counter_ns()
        result = call()
        ns = time.perf_counter_ns() - t0
        err = check(result)
    except Exception as e:  # reported, not fatal: the harness decides
        return {"ns": None, "ok": False, "err": f"{type(e).__name__}: {e}"}
    reply = {"ns": ns, "ok": err is None, "err": err}
    if req.get("capture"):
        reply["out"] = (result.stdout or b"").decode(errors="replace")
    return reply


def serve():
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(json.dumps(handle(json.loads(line))) + "\n")
            sys.stdout.flush()


def cli_run(args):
    import argparse
    p = argparse.ArgumentParser(prog="worker.py run")
    p.add_argument("-r", "--fs-read", action="append", default=[])
    p.add_argument("--no-system", action="store_true")  # the API's default anyway
    p.add_argument("cmd", nargs="+")
    a = p.parse_args(args)
    from sandlock import Sandbox
    r = Sandbox(fs_readable=a.fs_read).run(a.cmd)
    sys.stdout.buffer.write(r.stdout)
    sys.stderr.buffer.write(r.stderr)
    return r.exit_code


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        sys.exit(cli_run(sys.argv[2:]))
    serve()
