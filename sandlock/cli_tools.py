"""The `sandlock` subcommands other than run, net-run and pipe: policy check, audit, check,
workspace, certs, completion. Loaded only when one of them is used."""

from __future__ import annotations

import os
import sys

from .cli import EXIT_SANDLOCK, _protection_notes, _say


def _credential_rows(spec) -> list:
    """Where each secret comes from and which requests carry it: never a secret (none is
    read by `policy check`)."""
    if spec is None:
        return []
    env = dict(spec.env)
    return [("credentials", [f"{n} from {src}" + (f"; ${env[n]} holds a placeholder inside"
                                                   if n in env else "")
                             for n, src in spec.sources]),
            ("http auth", [r.spec for r in spec.rules])]


def policy_check(a) -> int:
    from .errors import SandlockError
    from .policy_file import load_policy, merge_fields, system_fields
    from .sandbox import Sandbox
    from .mcp.toolpolicy import is_tool_policy, report  # an MCP server's per-tool policy
    if is_tool_policy(a.file):
        try:
            print("\n".join(report(a.file)))
        except SandlockError as e:
            _say(f"error: {e}")
            return EXIT_SANDLOCK
        return 0
    try:
        loaded = load_policy(a.file)
        sb = Sandbox(**merge_fields(system_fields() if loaded.system else {}, loaded.fields))
    except SandlockError as e:
        _say(f"error: {e}")
        return EXIT_SANDLOCK
    p = sb.policy
    print(f"{a.file}: valid (version 1){' — ' + loaded.name if loaded.name else ''}")
    rows = [("read", p.fs_readable), ("write", p.fs_writable), ("deny", p.fs_denied),
            ("net allow", [r.spec for r in p.endpoints.allow] or ["(none: no network)"]),
            ("net deny", [r.spec for r in p.endpoints.deny]),
            ("tcp bind", sorted(p.tcp_bind.ports) if not p.tcp_bind.any_port else ["*"]),
            ("unix sockets", p.unix_allow), ("dns servers", p.dns_servers or
                                             (["(system)"] if p.endpoints.hostnames else [])),
            ("http allow", [r.spec for r in p.http.allow] if p.http else []),
            ("http deny", [r.spec for r in p.http.deny] if p.http else []),
            ("http ports", sorted(p.http_ports)),
            *_credential_rows(p.credentials),
            ("audit log", [p.audit_log] if p.audit_log else [])]
    if p.workspace is not None:
        ws = p.workspace
        rows.append(("workdir", [f"{ws.workdir} (copy-on-write: a private layer in "
                                 f"{ws.storage}"
                                 + (f", at most {ws.max_disk} bytes" if ws.max_disk else "")
                                 + ")"]))
        rows.append(("outcome", [f"exit 0: {loaded.fields.get('on_exit', 'commit')}; "
                                 f"otherwise: {loaded.fields.get('on_error', 'abort')}"]))
    for label, values in rows:
        if values:
            print(f"  {label:13} " + "\n  {:13} ".format("").join(str(v) for v in values))
    enforcement = ("Landlock only (port rules)" if not p.net_supervised
                   else "supervisor decides destinations; Landlock bounds TCP ports")
    print(f"  {'network':13} {enforcement}")
    if p.endpoints.hostnames and not p.endpoints.allow_private:
        print(f"  {'ssrf':13} host rules never reach private/loopback/metadata addresses")
    if loaded.timeout:
        print(f"  {'timeout':13} {loaded.timeout:g}s")
    from .policy_report import http_report
    report = http_report(p)
    for note in report.notes:
        print(f"  {'note':13} {note}")
    for note in _protection_notes(p):
        print(f"  {'user files':13} {note}")
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if cmd and loaded.system:
        from .toolchain import toolchain_grants
        for g in toolchain_grants(cmd[0], dict(os.environ, **(loaded.fields.get("env") or {})),
                                  loaded.fields.get("cwd") or None):
            print(f"  {'toolchain':13} read {g.path} ({g.why})")
    for error in report.errors:
        print(f"  {'error':13} {error}")
    return EXIT_SANDLOCK if report.errors else 0


def audit(a) -> int:
    from netpolicy.audit import summarize
    try:
        print(summarize(a.file, a.top, lines=not a.summary))
    except OSError as e:
        _say(f"error: {a.file}: {e.strerror}")
        return EXIT_SANDLOCK
    return 0


def check(a) -> int:
    from .features import FULL_LANDLOCK_ABI, costs, degradations, detect
    from .protect import mode
    f = detect()
    print(f"kernel {os.uname().release}")
    for name, present, purpose in f.report():
        print(f"  [{'ok' if present else '--'}] {name:28} {purpose}")
    namespaces = mode() == "mounts"
    print(f"  [{'ok' if namespaces else '--'}] {'mount namespaces':28} the user's files kept by "
          f"the kernel; overlay workspaces; a private /dev/shm")
    lost = degradations(f)
    for kind, item in costs(f):
        print(f"{'refused here' if kind == 'refused' else 'note'}: {item}")
    if not namespaces:
        print("no mount namespace can be made here (unshare refused: a container's seccomp "
              "profile, or user namespaces restricted): secrets are Landlock-denied paths "
              "(the directories on the way to one accept no new entries), workspaces "
              "use the seccomp backend, and a private TMPDIR comes without a private "
              "/dev/shm (POSIX semaphores and shared memory fail there)")
    if not lost:
        print("all protections available")
        return 0
    for item in lost:
        print(f"missing: {item}")
    if a.allow_degraded and f.landlock_abi >= 1:
        print("usable with --allow-degraded (the protections above are lost)")
        return 0
    print(f"sandlock needs Landlock ABI {FULL_LANDLOCK_ABI} (Linux 6.12+) and seccomp user "
          f"notification; run with --allow-degraded to accept less")
    return 1


def workspace(a) -> int:
    from . import cow
    from .errors import BranchError
    try:
        layer = cow.open_layer(a.layer)
        if a.action == "diff":
            if cow.interrupted(a.layer):
                _say("a commit of this layer was interrupted; `sandlock workspace "
                      "commit` finishes it")
            try:  # what a commit applies: the run's changes as recorded when kept
                changes = cow.kept_changes(layer)
            except BranchError as e:  # kept unchecked: what the layer holds, said so
                _say(f"note: {e}")
                changes = None
            print(cow.table(cow.diff(layer) if changes is None else changes))
        elif a.action == "commit":
            cow.commit(layer)  # the recorded changes (or an interrupted commit's plan)
            _say(f"committed to {layer.lower}")
        else:
            layer.discard()
            _say(f"discarded {a.layer}")
    except (OSError, ValueError, BranchError) as e:
        _say(f"error: {a.layer}: {e}")
        return EXIT_SANDLOCK
    return 0


def certs(a) -> int:
    from netpolicy.tls_intercept import BASENAME, default_certs_dir, open_store
    directory = default_certs_dir()
    cert = directory / f"{BASENAME}-ca-cert.pem"
    if a.action == "init" or not cert.exists():
        if a.action != "init":
            _say(f"error: no CA in {directory}; run `sandlock certs init`")
            return EXIT_SANDLOCK
        existed = cert.exists()
        try:
            open_store(directory)
        except OSError as e:
            _say(f"error: {directory}: {e.strerror}")
            return EXIT_SANDLOCK
        print(f"{'existing' if existed else 'created'} CA: {cert} "
              f"(private key: {directory / (BASENAME + '-ca.pem')}, mode 0600)")
        return 0
    if a.action == "path":
        print(cert)
    else:
        sys.stdout.write(cert.read_text())
    return 0




def completion(a) -> int:
    from .completion import script
    sys.stdout.write(script(a.shell))
    return 0


# -- running sandboxes (sandlock.registry) ---------------------------------------------------

def _uptime(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def ps(a) -> int:
    import json
    import time

    from netpolicy.text import printable
    from .registry import entries
    live = entries()
    if a.json:
        for e in live:
            print(json.dumps({k: e[k] for k in ("name", "pid", "root", "started", "argv",
                                                "cwd", "supervisor")}))
        return 0
    if not live:
        print("no running sandboxes")
        return 0
    width = max(4, *(len(e["name"]) for e in live))
    print(f"{'NAME':{width}}  {'PID':>7}  {'UPTIME':>7}  COMMAND")
    now = time.time()
    for e in live:
        cmd = printable(" ".join(e["argv"]))
        print(f"{printable(e['name']):{width}}  {e['pid']:>7}  "
              f"{_uptime(now - e['started']):>7}  {cmd[:100]}")
    return 0


def _one(target: str):
    from .registry import find
    found = find(target)
    if not found:
        _say(f"error: no running sandbox called {target} (`sandlock ps` lists them)")
        return None
    if len(found) > 1:
        _say(f"error: {len(found)} running sandboxes are called {target}; name one by its "
             f"pid: " + ", ".join(str(e["pid"]) for e in found))
        return None
    return found[0]


def inspect(a) -> int:
    import json
    e = _one(a.target)
    if e is None:
        return EXIT_SANDLOCK
    if a.json:
        print(json.dumps(e["policy"], indent=2, sort_keys=True))
    elif a.toml:
        from .profiles import to_toml
        print(to_toml(e["policy"]), end="")
    else:
        import yaml
        from netpolicy.text import printable
        print(f"# {printable(e['name'])}: pid {e['pid']}, started by pid {e['supervisor']}")
        print(yaml.safe_dump(e["policy"], sort_keys=True, default_flow_style=False), end="")
    return 0


def kill(a) -> int:
    import signal as _signal
    from .registry import kill as kill_entry
    name = a.signal.upper().removeprefix("SIG")
    if name not in ("TERM", "KILL"):
        _say(f"error: -s {a.signal}: expected TERM or KILL")
        return EXIT_SANDLOCK
    e = _one(a.target)
    if e is None:
        return EXIT_SANDLOCK
    kill_entry(e, getattr(_signal, f"SIG{name}"))
    return 0


def profile(a) -> int:
    from .errors import SandlockError
    from .profiles import list_profiles, profiles_dir, read_profile
    if a.profile_command == "list":
        names = list_profiles()
        if not names:
            print(f"no profiles in {profiles_dir()}")
        for n in names:
            print(n)
        return 0
    try:
        prof = read_profile(a.name)
        from .policy_file import merge_fields, system_fields
        from .sandbox import Sandbox
        Sandbox(**(merge_fields(system_fields(), prof.fields) if prof.system
                   else prof.fields))  # checked as a run would check it
    except SandlockError as e:
        _say(f"error: {e}")
        return EXIT_SANDLOCK
    print(f"# {prof.path}")
    if prof.program:
        print(f"# program: {' '.join(prof.program)}")
    if prof.path.endswith(".toml"):
        from .profiles import to_toml
        print(to_toml(prof.fields), end="")
    else:
        with open(prof.path) as f:
            print(f.read(), end="")
    return 0


def why(a) -> int:
    import json

    from .cli import _default_audit_path
    from .why import explain, render
    path = a.file or _default_audit_path()
    records = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    _say(f"warning: {path}:{n}: not a JSON record, skipped")
                    continue
                if isinstance(rec, dict):
                    records.append(rec)
    except OSError as e:
        _say(f"error: {path}: {e.strerror}")
        return EXIT_SANDLOCK
    if a.last:
        records = records[-a.last:]
    entries = explain(records)
    if a.json:
        for e in entries:
            print(json.dumps(e, default=str))
    else:
        print(render(entries))
    return 0


def service(a) -> int:
    """`sandlock service run|status|stop` (sandlock/service/server.py)."""
    from .service import server
    if a.action == "run":
        if a.log:
            where = server._own_directory(server.directory())
            fd = os.open(os.path.join(where, "service.log"),
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            os.dup2(fd, 2)
            os.close(fd)
        try:
            return server.serve(idle=a.idle)
        except OSError as e:
            _say(f"error: service: {e}")
            return EXIT_SANDLOCK
    reply = server.request(server.KIND_STATUS if a.action == "status" else server.KIND_STOP)
    if reply is None or reply[:1] != b"A":
        print("no service is running" if reply is None else
              f"the service refused: {reply[1:].decode(errors='replace')}")
        return 1 if a.action == "status" else 0
    print(reply[1:].decode(errors="replace").rstrip() if a.action == "status" else "stopped")
    return 0
