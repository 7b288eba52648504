"""Runtime policy (policy_fn) and pipelines, three recipes an agent builder can copy:

1. Install from a local package index, then no network once the tool itself starts.
2. Refuse `curl` and `wget` by their argv, whatever the script around them does.
3. A two-stage pipeline: the reader has the data but no network, the sender has the
   network but cannot read the data.

Everything talks to servers this script starts on 127.0.0.1.
Run it with `.venv/bin/python examples/runtime_policy.py` (after `make setup`).
"""

import errno
import http.server
import os
import sys
import tempfile
import threading

from sandlock import Sandbox

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = os.path.join(HERE, "..", "policies")


def serve(directory):
    """A local HTTP server over `directory` (GET) that also accepts uploads (PUT/POST);
    returns (port, requests seen, bytes uploaded)."""
    seen, uploaded = [], []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=directory, **kw)

        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(f"GET {self.path}")
            super().do_GET()

        def do_PUT(self):
            seen.append(f"PUT {self.path}")
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            uploaded.append(body)
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()
        do_POST = do_PUT

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1], seen, uploaded


def show(title, result):
    print(f"\n== {title}")
    for line in (result.stdout + result.stderr).decode().splitlines():
        print(f"   | {line}")
    for d in result.denials:
        print(f"   denied: {d['syscall']} ({d['errno']}): {d['reason']}")


def setup_then_offline(index_dir, port, seen):
    tool = os.path.join(index_dir, "tool.py")
    with open(tool, "w") as f:
        f.write("import urllib.request, sys\n"
                "try:\n"
                f"    urllib.request.urlopen('http://127.0.0.1:{port}/simple/', timeout=5)\n"
                "    print('tool: reached the network (should not happen)')\n"
                "except OSError as e:\n"
                "    print('tool: no network:', e)\n")

    def revoke_when_the_tool_starts(event, ctx):
        # argv of the exec itself: the shell's own argv also mentions tool.py, in a string.
        if event.syscall == "execve" and event.argv[1:2] == (tool,):
            ctx.restrict_network([])  # from this exec on, no destination passes

    sb = Sandbox.from_policy(os.path.join(POLICIES, "local-index-then-offline.yaml"),
                             fs_readable=[index_dir], policy_fn=revoke_when_the_tool_starts)
    r = sb.run(["/bin/sh", "-c",
                f"curl -sf http://127.0.0.1:{port}/simple/ >/dev/null "
                f"&& echo 'setup: fetched the index'; exec python3 {tool}"], timeout=60)
    show("1. install from the local index, then offline", r)
    print(f"   the index server saw: {seen}")
    return r


def block_downloaders(port):
    def no_downloaders(event, ctx):
        # event.path is the program the kernel runs (argv[0] is what the caller chose)
        if event.syscall in ("execve", "execveat") and event.path and \
                os.path.basename(event.path) in ("curl", "wget"):
            return errno.EACCES  # the exec fails with "Permission denied"
        return None

    sb = Sandbox.from_policy(os.path.join(POLICIES, "local-index-then-offline.yaml"),
                             policy_fn=no_downloaders, policy_fn_events=["exec"])
    r = sb.run(["/bin/sh", "-c", f"curl -s http://127.0.0.1:{port}/ || echo 'curl: refused'; "
                "python3 -c 'print(\"python3: runs as usual\")'"], timeout=60)
    show("2. curl and wget refused by program", r)
    return r


def pipeline(port, uploaded):
    data = tempfile.mkdtemp(prefix="sandlock-data-")
    secret = os.path.join(data, "customers.csv")
    with open(secret, "w") as f:
        f.write("id,name\n1,Ada\n2,Grace\n")
    reader = Sandbox.from_policy(os.path.join(POLICIES, "pipeline-reader.yaml"),
                                 fs_readable=[data])
    sender = Sandbox.from_policy(os.path.join(POLICIES, "pipeline-sender.yaml"),
                                 net_allow=[f"tcp://127.0.0.1:{port}"])
    probe = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}))\" "
             "2>/dev/null && echo 'reader: network reachable (should not happen)' "
             "|| echo 'reader: no network' >&2; cat " + secret)
    send = (f"cat {secret} 2>/dev/null && echo 'sender: read the file (should not happen)' "
            "|| echo 'sender: cannot read the data file' >&2; "
            f"curl -sf --data-binary @- http://127.0.0.1:{port}/upload "
            "&& echo 'sender: uploaded stdin'")
    r = (reader.cmd(["/bin/sh", "-c", probe]) | sender.cmd(["/bin/sh", "-c", send])).run(
        timeout=60)
    show("3. reader | sender pipeline", r)
    for stage in r.stages[:-1]:
        print(f"   reader stage stderr: {stage.stderr.decode().strip()}")
    print(f"   the server received: {b''.join(uploaded)!r}")
    return r


def main():
    index_dir = tempfile.mkdtemp(prefix="sandlock-index-")
    os.makedirs(os.path.join(index_dir, "simple"))
    with open(os.path.join(index_dir, "simple", "index.html"), "w") as f:
        f.write("<a href='demo-pkg/'>demo-pkg</a>\n")
    port, seen, uploaded = serve(index_dir)
    r1 = setup_then_offline(index_dir, port, seen)
    seen_in_step_1 = list(seen)
    r2 = block_downloaders(port)
    r3 = pipeline(port, uploaded)
    ok = (b"setup: fetched the index" in r1.stdout and b"tool: no network" in r1.stdout
          and seen_in_step_1 == ["GET /simple/"]
          and b"curl: refused" in r2.stdout and b"python3: runs as usual" in r2.stdout
          and b"sender: uploaded stdin" in r3.stdout
          and b"".join(uploaded) == b"id,name\n1,Ada\n2,Grace\n")
    print("\nall three behaved as described" if ok else "\nUNEXPECTED RESULT (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
