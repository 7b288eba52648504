"""Pipelines of differently-confined stages."""

import subprocess
import sys
import time

from sandlock import ExitReason
from conftest import PY, TcpServer, sandbox


def test_reader_has_data_but_no_network_sender_has_network_but_no_data(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("payload-123\n")
    srv = TcpServer("127.0.0.2")
    try:
        reader = sandbox(fs_readable=[tmp_path])
        sender = sandbox(net_allow=[f"127.0.0.2:{srv.port}"])
        send = ("import socket, sys\nd = sys.stdin.read()\n"
                f"s = socket.create_connection(('127.0.0.2', {srv.port})); print('sent', d.strip())\n"
                f"try:\n open({str(data)!r}).read(); print('sender read data')\n"
                "except OSError as e: print('sender cannot read', e.errno)")
        steal = (f"import socket\ntry:\n socket.create_connection(('127.0.0.2', {srv.port}))"
                 f"; print('reader connected')\nexcept OSError as e: print('reader no net', e.errno)")
        r = (reader.cmd(["sh", "-c", f"cat {data}; {PY} -c \"{steal}\" >&2"])
             | sender.cmd([PY, "-c", send])).run(timeout=30)
        assert r.success, (r.stderr, [s.stderr for s in r.stages])
        assert r.stdout.decode().split("\n")[:2] == ["sent payload-123", "sender cannot read 13"]
        assert b"reader no net 13" in r.stages[0].stderr
        assert srv.accepted == 1  # only the sender's connection
    finally:
        srv.close()


def test_pipeline_timeout_kills_every_stage():
    sb = sandbox()
    t0 = time.monotonic()
    r = (sb.cmd(["sleep", "60"]) | sb.cmd(["cat"]) | sb.cmd(["sleep", "60"])).run(timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert all(s.reason == ExitReason.TIMEOUT for s in r.stages)


def test_cli_pipe():
    r = subprocess.run([sys.executable, "-m", "sandlock", "pipe", "--", "echo", "hello", ":::",
                        "--", "tr", "a-z", "A-Z"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "HELLO\n", r.stderr
    r = subprocess.run([sys.executable, "-m", "sandlock", "pipe", "-t", "0.5", "--", "sleep",
                        "30", ":::", "--", "cat"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 124


def test_a_pipeline_whose_first_stage_times_out_reports_the_timeout():
    """The last stage may end on EOF once the first was killed at the deadline (it raced
    in test_cli_pipe): the pipeline's result still says TIMEOUT."""
    sb = sandbox()
    for _ in range(5):
        r = (sb.cmd(["sleep", "30"]) | sb.cmd(["cat"])).run(timeout=0.3)
        assert r.reason == ExitReason.TIMEOUT and not r.success
        assert r.stages[0].reason == ExitReason.TIMEOUT


ROOT = __import__("os").path.dirname(__import__("os").path.dirname(
    __import__("os").path.abspath(__file__)))
CONSUME = ("from sandlock import inputs\n"
           "print(sorted(inputs.keys()))\n"
           "print(repr(inputs['code']), repr(inputs['data']))\n"
           "import sys; print(repr(sys.stdin.read()))\n")


def test_fan_in_each_producer_under_its_own_policy_read_by_name(tmp_path):
    import os
    from sandlock import Gather, GatherPipeline, NamedStage
    secret = tmp_path / "secret.txt"
    secret.write_text("from-the-secret\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(secret, 0o644)
    reader = sandbox(fs_readable=[str(tmp_path)])      # may read the file
    blind = sandbox()                                  # may not
    consumer = sandbox(fs_readable=[ROOT], env={"PYTHONPATH": ROOT})
    code = reader.cmd(["cat", str(secret)]).as_("code")
    data = blind.cmd(["/bin/sh", "-c", f"echo data-ok; cat {secret} || echo no-read"])
    assert isinstance(code, NamedStage)
    g = code + data.as_("data")
    assert isinstance(g, Gather)
    pipeline = g | consumer.cmd([PY, "-c", CONSUME])
    assert isinstance(pipeline, GatherPipeline)
    r = pipeline.run(timeout=30)
    lines = r.stdout.decode().splitlines()
    assert r.success and lines[0] == "['code', 'data']", (r.stdout, r.stderr)
    assert lines[1] == "'from-the-secret\\n' 'data-ok\\nno-read\\n'"
    assert lines[2] == "''"  # the last producer was stdin too, read above by name
    assert [s.success for s in r.stages] == [True, True, True]
    assert b"Permission denied" in r.stages[1].stderr


def test_fan_in_timeout_bounds_every_stage():
    slow = sandbox().cmd(["sleep", "60"]).as_("slow")
    fast = sandbox().cmd(["echo", "x"]).as_("fast")
    consumer = sandbox().cmd(["cat"])
    start = time.monotonic()
    r = (slow + fast | consumer).run(timeout=1.5)
    assert time.monotonic() - start < 10
    assert r.reason == ExitReason.TIMEOUT and not r.success
    assert r.stages[0].reason == ExitReason.TIMEOUT


def test_fan_in_a_shell_consumer_reads_fds_3_and_on():
    a = sandbox().cmd(["echo", "first"]).as_("a")
    b = sandbox().cmd(["echo", "second"]).as_("b")
    c = sandbox().cmd(["echo", "last"]).as_("c")
    r = (a + b + c | sandbox().cmd(["/bin/sh", "-c", "cat <&3; cat <&4; cat; "
                                    "echo x >&5 2>/dev/null || echo no-5"])).run(timeout=30)
    assert r.stdout.decode().split() == ["first", "second", "last", "no-5"], r.stderr
