"""Started as root, the sandbox holds no capabilities unless the policy keeps named ones."""

import json
import os
import stat

import pytest

from conftest import IS_ROOT, free_port, run_py, sandbox

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="capabilities matter only when root")

CAPS = """
import json
caps = {}
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    if k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs"):
        caps[k] = int(v.strip(), 16 if k.startswith("Cap") else 10)
print(json.dumps(caps))
"""


def test_all_capability_sets_empty():
    caps = json.loads(run_py(sandbox(), CAPS).stdout)
    assert caps == {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0,
                    "NoNewPrivs": 1}
    # Control: this test process itself (root) does have capabilities.
    own = {l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/self/status")}
    assert int(own["CapEff"], 16) != 0


def test_block_device_node_cannot_be_created(tmp_path):
    sb = sandbox(fs_writable=[tmp_path])
    code = ("import os, stat, sys\ntry:\n os.mknod(sys.argv[1], 0o600 | stat.S_IFBLK, "
            "os.makedev(8, 0)); print('made')\nexcept OSError as e: print(e.errno)")
    r = run_py(sb, code, str(tmp_path / "sda"))
    assert r.stdout.strip() == b"1" and not (tmp_path / "sda").exists()
    r = run_py(sb, code.replace("S_IFBLK", "S_IFIFO"), str(tmp_path / "fifo"))  # control
    assert r.stdout.strip() == b"made" and stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)


def test_root_cannot_bypass_file_permissions(tmp_path):
    f = tmp_path / "root-only"
    f.write_text("x")
    os.chmod(f, 0o000)
    os.chown(f, 1234, 1234)
    sb = sandbox(fs_readable=[tmp_path])
    r = sb.run(["cat", str(f)])
    assert r.exit_code != 0 and r.stdout == b""  # no CAP_DAC_OVERRIDE


def test_kept_capability_survives_and_works():
    port = free_port()
    while port > 1023:  # a privileged port needs CAP_NET_BIND_SERVICE
        port = 1000 + os.getpid() % 20
    sb = sandbox(keep_capabilities=["CAP_NET_BIND_SERVICE"], net_allow_bind=[port])
    caps = json.loads(run_py(sb, CAPS).stdout)
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == 1 << 10
    code = ("import socket, sys; s = socket.socket(); "
            "s.bind(('127.0.0.1', int(sys.argv[1]))); print('bound')")
    assert run_py(sb, code, str(port)).stdout.strip() == b"bound"
    r = run_py(sandbox(net_allow_bind=[port]), code, str(port))
    assert r.stdout == b"" and b"Permission denied" in r.stderr  # without the capability
