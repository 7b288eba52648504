"""Sandlock demo: an "agent" runs a shell script in a sandbox; some actions are allowed,
some are refused by the kernel, and the output explains which rule decided. Then: a web
tool under `sandlock net-run`, an HTTP rule, and a copy-on-write workspace.

Run it with `make demo` (sets everything up first) or `.venv/bin/python examples/demo.py`.
"""

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

from sandlock import Sandbox, system_denied, system_devices, system_readable


def tcp_server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    hits = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            hits.append(1)
            c.sendall(b"hello from the allowed service\n")
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    return srv, hits


def main():
    home = tempfile.mkdtemp(prefix="sandlock-demo-")
    project = os.path.join(home, "project")
    ssh = os.path.join(home, ".ssh")
    os.makedirs(project)
    os.makedirs(ssh)
    with open(os.path.join(project, "README.md"), "w") as f:
        f.write("# a project the agent may work on\n")
    with open(os.path.join(ssh, "id_ed25519"), "w") as f:
        f.write("-----BEGIN FAKE KEY----- not really a key\n")
    with open(os.path.join(home, "notes.txt"), "w") as f:
        f.write("personal notes outside the project\n")
    api, api_hits = tcp_server()
    other, other_hits = tcp_server()
    api_port, other_port = api.getsockname()[1], other.getsockname()[1]

    policy = Sandbox(
        fs_readable=system_readable() + [home],   # the whole home is readable...
        fs_denied=system_denied() + [ssh],        # ...except ~/.ssh
        fs_writable=system_devices() + [project], # only the project is writable
        net_allow=[f":{api_port}"],               # TCP to one port only
        clean_env=True,
    )

    script = textwrap.dedent(f"""
        step() {{ printf '\\n$ %s\\n' "$1"; sh -c "$1" 2>&1 | sed 's/^/  /'; }}
        step 'ls {project}'
        step 'echo "build ok" > {project}/build.log && cat {project}/build.log'
        step 'cat {home}/notes.txt'
        step 'cat {ssh}/id_ed25519'
        step 'rm {home}/notes.txt'
        step 'chmod 777 {home}/notes.txt'
        step 'python3 -c "import socket; print(socket.create_connection((\\"127.0.0.1\\", {api_port})).recv(64).decode().strip())"'
        step 'python3 -c "import os, socket; e = socket.socket().connect_ex((\\"127.0.0.1\\", {other_port})); print(\\"connect:\\", os.strerror(e) if e else \\"ok\\")"'
    """)
    print("Sandlock demo: an agent's shell script runs under this policy:")
    print(f"  readable : system directories + {home} (except {ssh})")
    print(f"  writable : {project}")
    print(f"  network  : TCP connect to port {api_port} only")
    result = policy.run(["sh", "-c", script], timeout=30)
    print(result.stdout.decode())
    print("What happened, and why:")
    explain = [
        ("listing and writing inside the project", "allowed: the project is in fs_writable"),
        ("reading ~/notes.txt", "allowed: the home directory is readable"),
        ("reading ~/.ssh/id_ed25519", "refused by Landlock (EACCES): ~/.ssh is in fs_denied, "
         "carved out of the readable home"),
        ("rm ~/notes.txt", "refused by Landlock: the home is read-only"),
        ("chmod ~/notes.txt", "refused by the supervisor (EPERM): Landlock does not cover "
         "metadata, so chmod/chown/utimes/xattr are trapped and allowed only under fs_writable"),
        (f"connect to port {api_port}", "allowed by a Landlock TCP rule (no supervisor round trip)"),
        (f"connect to port {other_port}", "refused by Landlock (EACCES): no rule for that port"),
    ]
    for what, why in explain:
        print(f"  - {what}: {why}")
    print("\nThe supervisor's record of what it refused (Result.denials):")
    for d in result.denials:
        print(f"  pid {d['pid']} {d['syscall']} -> {d['errno']}: {d['reason']}")
    assert os.path.exists(os.path.join(home, "notes.txt")), "notes.txt must survive"
    print(f"\nThe refused side effects did not happen: ~/notes.txt is intact "
          f"(mode {oct(os.stat(os.path.join(home, 'notes.txt')).st_mode & 0o777)}), "
          f"the service on port {other_port} saw {len(other_hits)} connections, "
          f"the allowed one saw {len(api_hits)}.")
    api.close()
    other.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = f"hello from {self.server.server_address[0]}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.hits += 1

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.hits += 1
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def http_server(host):
    srv = http.server.ThreadingHTTPServer((host, 0), _Handler)
    srv.hits = 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def net_run_demo():
    """Part 2: an agent's web tool under `sandlock net-run`, as a user runs it."""
    api, other = http_server("127.0.0.2"), http_server("127.0.0.3")
    api_url = f"http://127.0.0.2:{api.server_address[1]}/v1/status"
    other_url = f"http://127.0.0.3:{other.server_address[1]}/upload"
    audit = os.path.join(tempfile.mkdtemp(prefix="sandlock-audit-"), "audit.jsonl")
    sandlock = [sys.executable, "-m", "sandlock"]
    cmd = sandlock + ["net-run", "--allow", f"127.0.0.2:{api.server_address[1]}",
                      "--audit", audit, "--", "sh", "-c",
                      f"curl -sS -m 5 {api_url}; curl -sS -m 5 {other_url}; true"]
    print("\n" + "=" * 78)
    print("Part 2: an agent tool under net-run (the network policy allows one service)")
    print("$ sandlock net-run --allow 127.0.0.2:%d --audit %s -- \\\n"
          "    sh -c 'curl %s; curl %s'" % (api.server_address[1], audit, api_url, other_url))
    r = subprocess.run(cmd, capture_output=True, text=True)
    for line in (r.stdout + r.stderr).splitlines():
        print("  " + line)
    print("\nThe audit record that explains the refusal (one JSON line per denial):")
    with open(audit) as f:
        for line in f:
            rec = json.loads(line)
            print("  " + json.dumps({k: rec[k] for k in ("decision", "syscall", "protocol",
                                                       "address", "port", "rule", "errno",
                                                       "reason", "argv")}))
    print(f"\nThe allowed service answered {api.hits} request(s); the other one saw "
          f"{other.hits}: the connection never left the sandbox.")
    print("Summarise any audit log with: sandlock audit FILE")
    api.shutdown()
    other.shutdown()


def http_rule_demo():
    """Part 3: an HTTP rule: GET allowed, a POST to the same host refused with 403."""
    api = http_server("127.0.0.2")
    port = api.server_address[1]
    audit = os.path.join(tempfile.mkdtemp(prefix="sandlock-audit-"), "audit.jsonl")
    sandlock = [sys.executable, "-m", "sandlock"]
    get = f"curl -sS -m 5 http://127.0.0.2:{port}/v1/status"
    post = f"curl -sS -m 5 -i -d token=s3cret http://127.0.0.2:{port}/v1/upload"
    cmd = sandlock + ["net-run", "--allow", f"127.0.0.2:{port}", "--http-allow",
                      "GET 127.0.0.2/v1/*", "--http-port", str(port), "--audit", audit, "--",
                      "sh", "-c", f"{get}; {post}; true"]
    print("\n" + "=" * 78)
    print("Part 3: an HTTP rule (the same host: GET allowed, anything else refused)")
    print(f"$ sandlock net-run --allow 127.0.0.2:{port} --http-allow 'GET 127.0.0.2/v1/*' "
          f"--http-port {port} --audit {audit} -- \\\n    sh -c '{get}; {post}'")
    r = subprocess.run(cmd, capture_output=True, text=True)
    for line in (r.stdout + r.stderr).splitlines():
        print("  " + line)
    print("\nThe audit record of the refused request:")
    with open(audit) as f:
        for line in f:
            rec = json.loads(line)
            print("  " + json.dumps({k: rec.get(k) for k in (
                "decision", "protocol", "method", "host", "path", "rule", "reason", "argv")}))
    print(f"\nThe server handled {api.hits} request(s): the GET. The POST (and its token) "
          "never left the sandbox: Sandlock's filter answered it with the 403 above.")
    api.shutdown()


def workspace_demo():
    """Part 4: an agent edits a repository in a copy-on-write workspace: a dry run shows
    what it would change, the real run commits only if the command succeeds."""
    repo = os.path.join(tempfile.mkdtemp(prefix="sandlock-ws-"), "repo")
    os.makedirs(os.path.join(repo, "src"))
    with open(os.path.join(repo, "src", "app.py"), "w") as f:
        f.write("def greet():\n    return 'hello'\n")
    with open(os.path.join(repo, "notes.txt"), "w") as f:
        f.write("scratch notes\n")
    storage = os.path.join(os.path.dirname(repo), "layers")
    edit = ("sed -i s/hello/hi/ src/app.py && rm notes.txt && mkdir docs && "
            "echo '# API' > docs/api.md")
    cmd = [sys.executable, "-m", "sandlock", "run", "--workdir", repo, "--cwd", repo,
           "--fs-storage", storage]
    print("\n" + "=" * 78)
    print("Part 4: a copy-on-write workspace (the agent's edits land in a private layer)")
    print(f"$ sandlock run --workdir {repo} --dry-run -- sh -c \"{edit}\"")
    r = subprocess.run(cmd + ["--dry-run", "--", "sh", "-c", edit], capture_output=True,
                       text=True)
    for line in (r.stdout + r.stderr).splitlines():
        print("  " + line)
    assert open(os.path.join(repo, "src", "app.py")).read().endswith("'hello'\n")
    print("The repository is unchanged: src/app.py still says hello, notes.txt is there.")
    print(f"\n$ sandlock run --workdir {repo} -- sh -c \"{edit}; false\"   "
          "(fails: on_error discards)")
    r = subprocess.run(cmd + ["--", "sh", "-c", edit + "; false"], capture_output=True,
                       text=True)
    for line in r.stderr.splitlines():
        print("  " + line)
    print(f"\n$ sandlock run --workdir {repo} -- sh -c \"{edit}\"   (succeeds: on_exit commits)")
    r = subprocess.run(cmd + ["--", "sh", "-c", edit], capture_output=True, text=True)
    for line in r.stderr.splitlines():
        print("  " + line)
    print("Now src/app.py says:", open(os.path.join(repo, "src", "app.py")).read().split()[-1],
          "and the repository holds:", sorted(os.listdir(repo)))


if __name__ == "__main__":
    # Everything the demo creates (its fake home, audit logs, repository, layers) lives in
    # one scratch directory, removed at the end.
    scratch = tempfile.mkdtemp(prefix="sandlock-demo-")
    tempfile.tempdir = os.environ["TMPDIR"] = scratch
    try:
        main()
        net_run_demo()
        http_rule_demo()
        workspace_demo()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n(the demo removed everything it created, in {scratch})")
