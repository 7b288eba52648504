"""`sandlock learn [-p base.yaml] [-o policy.yaml] -- CMD`: run a command once, watching what
it uses, and write the smallest YAML policy under which it does the same again.

The learning run: reads allowed everywhere but the user's secrets (still hidden: a read of
one is listed, never granted) and observed (supervisor.explain, every path call); writes
captured in a copy-on-write layer of the working directory, discarded at the end; the
network, DNS and HTTP in report-only mode (every connection and request recorded as it
would have been refused, and let through; unix sockets stay refused). Nothing the command
does outlives the run but what it sent over the network, and what it wrote where a base
policy (-p) grants writing: those grants are real.

The policy written: `filesystem.system: true` for the system directories; other reads
grouped to the directories the files were in (the file itself where that directory is too
wide: /, the home directory, /tmp, or one holding a secret); never a secret, never a
directory too wide to write in; names the program chose escaped in every comment; writes to the directories files were created in (the files
themselves when only existing files were written); each destination by the name it was
reached through (`host:port`), HTTP requests as exact rules; a comment on each line says
what needed it. What learn refused to grant is listed at the top.
"""

from __future__ import annotations

import json
import os
import tempfile

from .errors import PolicyError

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc", "/opt",
          "/proc", "/sys", "/dev")
NEVER = ("/proc", "/sys", "/dev", "/run")  # not file data a policy grants by path


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def run_learning(cmd, base_fields: dict, cwd: str, timeout: float | None):
    """(Result, observed file accesses [(path, access, program)], audit records)."""
    from .policy_file import merge_fields, system_fields
    from .sandbox import BranchAction, Sandbox
    log = tempfile.NamedTemporaryFile(prefix="sandlock-learn-", suffix=".jsonl", delete=False)
    log.close()
    fields = merge_fields(system_fields(), base_fields)
    fields.update(fs_readable=["/"], workdir=cwd, cwd=cwd,
                  fs_writable=list(fields.get("fs_writable") or []) + [cwd],
                  on_exit=BranchAction.ABORT, on_error=BranchAction.ABORT,
                  report_only=True, explain=True, audit_log=log.name,
                  protect_user_files=True, net_allow_private=True)
    # Every HTTP request through the filter (recorded as it would be refused): a rule
    # no request matches.
    fields["http_allow"] = ["GET */sandlock-learn-matches-nothing"]  # every host, any port
    fields.pop("net_allow", None)  # the learnt policy names its destinations itself
    sink: list = []
    sb = Sandbox(**fields)
    object.__setattr__(sb, "_learn_sink", sink)
    try:
        result = sb.run(cmd, timeout=timeout)
        with open(log.name) as f:
            records = [json.loads(x) for x in f if x.strip()]
    finally:
        os.unlink(log.name)
    return result, sink, records


def _comment(text: str) -> str:
    """Text the program chose (file and program names), safe inside a YAML comment: no
    line break or control character can end the comment and add a key."""
    from netpolicy.text import printable
    return printable(str(text)).replace("\n", " ").replace("\r", " ")


def _too_wide(path: str, home: str, secrets) -> bool:
    """A directory never granted whole: /, the home directory, /tmp, /var/tmp, and any
    directory that holds a secret or persistence vector of the user's."""
    return path in ("/", "", home, "/tmp", "/var/tmp", "/root", "/home") or any(
        _beneath(s, path) for s in secrets)


def _group_reads(paths, home: str, secrets=()) -> tuple[dict[str, list[str]], list[str]]:
    """(directory or file to grant -> the files that needed it, listings not granted)."""
    out: dict[str, list[str]] = {}
    skipped = []
    for p in sorted(paths):
        parent = os.path.dirname(p)
        # A directory read (listed, or opened as a directory) is granted itself; a file,
        # with the directory it is in, unless that directory is too wide (then the file).
        if os.path.isdir(p):
            if _too_wide(p, home, secrets):
                skipped.append(p)
                continue
            target = p
        else:
            target = p if _too_wide(parent, home, secrets) else parent
        out.setdefault(target, []).append(p)
    # A grant beneath another adds nothing.
    keep = {t: v for t, v in out.items()
            if not any(o != t and _beneath(t, o) for o in out)}
    for t, v in out.items():
        if t not in keep:
            owner = next(o for o in keep if _beneath(t, o))
            keep[owner] += v
    return keep, skipped


def build_policy(result, observed, records, cwd: str, base_fields: dict) -> tuple[str, dict]:
    """(YAML text, fields) of the policy the observation calls for."""
    from .home_policy import persistence_paths, secret_paths
    home = os.path.realpath(os.path.expanduser("~"))
    secrets = [os.path.realpath(p) for p in (*secret_paths(home), *persistence_paths(home))]
    refused, reads, writes, creates = [], set(), set(), set()
    why: dict[str, str] = {}     # a read or written path -> what needed it
    made: dict[str, str] = {}    # a directory files were created in -> which
    for path, access, prog in observed:
        if any(_beneath(path, n) for n in NEVER):
            continue
        if any(_beneath(path, s) for s in secrets):
            refused.append(f"{access} {_comment(path)} (by {_comment(prog)}): a secret or "
                           f"persistence vector of the user's")
            continue
        if access == "read" or access == "execute":
            if any(_beneath(path, s) for s in SYSTEM):
                continue
            if os.path.exists(path):  # reads of what does not exist need no grant
                reads.add(path)
                why.setdefault(path, f"{access} by {_comment(prog)}")
        elif access == "create":
            where = os.path.dirname(path)
            if _too_wide(where, home, secrets):
                refused.append(f"create {_comment(path)} (by {_comment(prog)}): granting "
                               f"{_comment(where)} whole would be too wide")
                continue
            creates.add(where)
            made.setdefault(where, f"create {_comment(os.path.basename(path))} by "
                                   f"{_comment(prog)}")
        else:
            writes.add(path)
            why.setdefault(path, f"{access} by {_comment(prog)}")
    write_grants = sorted(creates) + sorted(w for w in writes
                                            if not any(_beneath(w, c) for c in creates))
    grouped, skipped = _group_reads(reads, home, secrets)
    read_grants = {t: v for t, v in grouped.items()
                   if not any(_beneath(t, w) for w in write_grants)}
    refused += [f"listing {_comment(p)}: granting it whole would be too wide"
                for p in skipped]
    # The network: what report-only recorded, by name where the program used one.
    allow, http, private = {}, {}, False
    for rec in records:
        if rec.get("decision") != "would-deny":
            continue
        host, port, proto = rec.get("host"), rec.get("port"), rec.get("protocol")
        if host:  # a name reaching a private address: only allow_private lets rules do that
            try:
                import ipaddress
                ip = ipaddress.ip_address(str(rec.get("address")))
                private = private or not ip.is_global
            except ValueError:
                pass
        if proto in ("http", "https") and rec.get("method"):
            target = host or rec.get("address")
            spec = f"{target}:{port}" if port not in (80, 443, None) else target
            path = rec.get("path") or "/"
            if "*" in path or any(c.isspace() for c in path):
                refused.append(f"{_comment(rec['method'])} {_comment(spec)}"
                               f"{_comment(path)}: a path no rule can name exactly")
            else:
                http[f"{rec['method']} {spec}{path}"] = "requested"
            allow.setdefault(f"{target}:{port}", f"{proto} request")
        elif proto == "tls":
            allow.setdefault(f"{host or rec.get('address')}:{port}", "TLS connection")
        elif proto in ("tcp", "udp") and port is not None:
            addr = host or rec.get("address")
            if proto == "udp" and port == 53:
                continue  # DNS: answered by Sandlock for the names below
            spec = f"{addr}:{port}" if proto == "tcp" else f"udp://{addr}:{port}"
            allow.setdefault(spec, f"{proto} connection")
    fields: dict = {}
    argv = " ".join(result.argv) if hasattr(result, "argv") else "the command"
    lines = [f"# Learnt by `sandlock learn` ({_comment(argv)})"]
    for r in refused:
        lines.append(f"# NOT GRANTED: {r}")
    lines += ["version: 1", "filesystem:", "  system: true  # /usr, /etc, /lib ... read-only",
              "  protect: true  # the user's secrets hidden, startup files kept, always"]
    if read_grants:
        lines.append("  read:")
        for t, files in sorted(read_grants.items()):
            shown = ", ".join(_comment(os.path.relpath(f, t) if f != t else
                                       os.path.basename(f))
                              for f in files[:3]) + (" ..." if len(files) > 3 else "")
            lines.append(f"    - {json.dumps(t)}  # read: {shown}")
        fields["fs_readable"] = sorted(read_grants)
    if write_grants:
        lines.append("  write:")
        for w in write_grants:
            lines.append(f"    - {json.dumps(w)}  # {made.get(w) or why.get(w, 'written')}")
        fields["fs_writable"] = write_grants
    if allow or private:
        lines.append("network:")
        if allow:
            lines.append("  allow:")
            for spec, what in allow.items():
                lines.append(f"    - {json.dumps(spec)}  # {what}")
            fields["net_allow"] = list(allow)
        if private:
            lines.append("  allow_private: true  # a name the program used resolves to a "
                         "private or loopback address")
            fields["net_allow_private"] = True
    dns = base_fields.get("dns_servers")
    if dns and allow:
        lines.append("dns:")
        lines.append(f"  servers: {json.dumps(list(dns))}  # from the base policy")
        fields["dns_servers"] = list(dns)
    if http:
        lines.append("http:")
        lines.append("  allow:")
        for rule in http:
            lines.append(f"    - {json.dumps(rule)}")
        fields["http_allow"] = list(http)
    return "\n".join(lines) + "\n", fields


def main(a) -> int:
    from .cli import EXIT_SANDLOCK, _say
    from .errors import SandlockError
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        _say("error: no command given (usage: sandlock learn [-p base.yaml] "
             "[-o policy.yaml] -- CMD)")
        return EXIT_SANDLOCK
    base: dict = {}
    if a.policy:
        from .policy_file import load_policy
        try:
            base = load_policy(a.policy).fields
        except PolicyError as e:
            _say(f"error: {e}")
            return EXIT_SANDLOCK
    cwd = os.getcwd()
    try:
        result, observed, records = run_learning(cmd, base, cwd, a.timeout)
    except SandlockError as e:
        _say(f"error: {e}")
        return EXIT_SANDLOCK
    result.argv = cmd
    text, _ = build_policy(result, observed, records, cwd, base)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
        _say(f"policy written to {a.output} (the command exited {result.exit_code}; its "
             f"changes to {cwd} were discarded)")
    else:
        print(text, end="")
    return 0 if result.success else (result.exit_code if result.exit_code > 0 else 1)
