"""The seccomp deny list: every family fails inside the sandbox; ordinary programs work."""

import errno
import json
import os
import shutil
import signal
import subprocess

import pytest

from conftest import IS_ROOT, PY, run_py, sandbox

# name -> python expression returning (ret, errno) for a raw syscall inside the sandbox.
PROBE = """
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return [r, ctypes.get_errno()]
buf = ctypes.create_string_buffer(256)
p = ctypes.addressof(buf)
cases = {
  "io_uring_setup": (425, 8, p), "io_uring_enter": (426, 0, 0, 0, 0, 0, 0),
  "io_uring_register": (427, 0, 0, 0, 0),
  "ptrace": (101, 0, 0, 0, 0), "process_vm_readv": (310, 1, p, 1, p, 1, 0),
  "process_vm_writev": (311, 1, p, 1, p, 1, 0), "bpf": (321, 0, p, 0),
  "perf_event_open": (298, p, 0, -1, -1, 0), "userfaultfd": (323, 0),
  "mount": (165, p, p, p, 0, 0), "umount2": (166, p, 0), "fsopen": (430, p, 0),
  "fsmount": (432, 0, 0, 0), "open_tree": (428, -100, p, 0), "move_mount": (429, 0, p, 0, p, 0),
  "mount_setattr": (442, 0, p, 0, p, 0), "pivot_root": (155, p, p), "chroot": (161, p),
  "unshare_user": (272, 0x10000000), "unshare_net": (272, 0x40000000), "setns": (308, 0, 0),
  "clone_newuser": (56, 0x10000000 | 17, 0, 0, 0, 0),
  "clone_newns": (56, 0x00020000 | 17, 0, 0, 0, 0),
  "keyctl": (250, 0, 0, 0, 0), "add_key": (248, p, p, 0, 0, 0),
  "request_key": (249, p, p, 0, 0), "kexec_load": (246, 0, 0, 0, 0),
  "kexec_file_load": (320, 0, 0, 0, 0, 0), "init_module": (175, 0, 0, p),
  "finit_module": (313, 0, p, 0), "delete_module": (176, p, 0), "reboot": (169, 0, 0, 0, 0),
  "swapon": (167, p, 0), "swapoff": (168, p), "acct": (163, 0),
  "open_by_handle_at": (304, 0, p, 0), "name_to_handle_at": (303, -100, p, p, p, 0),
  "quotactl": (179, 0, p, 0, 0), "pidfd_getfd": (438, 0, 0, 0), "syslog": (103, 3, p, 10),
  "personality_no_aslr": (135, 0x0040000), "personality_read_implies_exec": (135, 0x0400000),
  "tiocsti": (16, 0, 0x5412, p), "tiocsti_high_bits": (16, 0, 0x100005412, p),
  "tioclinux": (16, 0, 0x541C, p),
  "setpgid": (109, 0, 0),
  "shmget": (29, 0, 4096, 0o1600), "semget": (64, 0, 1, 0o1600), "msgget": (68, 0, 0o1600),
  "socket_packet": (41, 17, 3, 0), "socket_udp": (41, 2, 2, 0), "socket_udp6": (41, 10, 2, 0),
  "socket_raw": (41, 2, 3, 1), "socket_icmp_ping": (41, 2, 2, 1),
  "socket_mptcp": (41, 2, 1, 262), "socket_sctp": (41, 2, 1, 132),
  "socket_vsock": (41, 40, 1, 0), "socket_high_bits_family": (41, 0x100000002, 2, 0),
  "socket_bluetooth": (41, 31, 1, 0), "socket_alg": (41, 38, 5, 0),
  "netlink_audit": (41, 16, 3, 9), "netlink_uevent": (41, 16, 2, 15),
  "netlink_generic": (41, 16, 3, 16), "netlink_netfilter": (41, 16, 3, 12),
  "clone3": (435, p, 0),  # size 0: EINVAL unconfined, never a fork
}
names = sys.argv[1:] or list(cases)
res = {name: sc(*cases[name]) for name in names}
res["personality_query"] = sc(135, 0xFFFFFFFF)
res["socket_unix"] = sc(41, 1, 1, 0)
res["socket_tcp"] = sc(41, 2, 1, 0)
res["socket_tcp6"] = sc(41, 10, 1, 6)
res["netlink_route"] = sc(41, 16, 3, 0)
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def probe():
    r = run_py(sandbox(), PROBE)
    assert r.success, r.stderr
    return json.loads(r.stdout)


DENIED = [
    "io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace", "process_vm_readv",
    "process_vm_writev", "bpf", "perf_event_open", "userfaultfd", "mount", "umount2", "fsopen",
    "fsmount", "open_tree", "move_mount", "mount_setattr", "pivot_root", "chroot",
    "unshare_user", "unshare_net", "setns", "clone_newuser", "clone_newns", "keyctl",
    "add_key", "request_key", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "acct", "open_by_handle_at",
    "name_to_handle_at", "quotactl", "pidfd_getfd", "syslog", "personality_no_aslr",
    "personality_read_implies_exec", "tiocsti", "tiocsti_high_bits", "tioclinux", "shmget", "semget", "msgget", "socket_packet", "socket_udp", "socket_udp6",
    "socket_raw", "socket_icmp_ping", "socket_mptcp", "socket_sctp", "socket_vsock",
    "socket_high_bits_family", "socket_bluetooth", "socket_alg", "netlink_audit",
    "netlink_uevent", "netlink_generic", "netlink_netfilter",
]


@pytest.mark.parametrize("name", DENIED)
def test_denied_family_fails_with_eperm(probe, name):
    assert probe[name] == [-1, errno.EPERM], probe[name]


def test_process_groups_and_sessions_are_allowed(probe):
    """Job control needs them; membership is the process tree (sandlock-init.c)."""
    assert probe["setpgid"] == [0, 0]
    r = run_py(sandbox(), "import os\nif os.fork() == 0:\n    os.setsid()\n"
                          "    print(os.getsid(0) == os.getpid(), flush=True)\n    os._exit(0)\nos.wait()")
    assert r.stdout == b"True\n", r.stderr


def test_clone3_is_enosys_so_libc_falls_back(probe):
    assert probe["clone3"] == [-1, errno.ENOSYS]


def test_allowed_neighbours_still_work(probe):
    assert probe["personality_query"][0] >= 0
    for name in ("socket_unix", "socket_tcp", "socket_tcp6", "netlink_route"):
        assert probe[name][0] >= 0, (name, probe[name])


def test_ordinary_programs_work():
    sb = sandbox()
    r = sb.run(["sh", "-c", "echo hello world | tr a-z A-Z | wc -c"])
    assert r.success and r.stdout.strip() == b"12"
    r = sb.run([PY, "-c", "import json, threading, subprocess; "
                "print(subprocess.run(['echo', 'child'], capture_output=True).stdout.decode())"])
    assert r.success and r.stdout.strip() == b"child", r.stderr
    assert sb.run(["git", "--version"]).stdout.startswith(b"git version")
    assert sb.run(["curl", "--version"]).stdout.startswith(b"curl ")


def test_x32_syscall_kills_the_process():
    # getpid (39) through the x32 ABI bit: the filter's architecture check kills.
    code = ("import ctypes; libc = ctypes.CDLL(None); "
            "libc.syscall(ctypes.c_long(0x40000000 | 39)); print('survived')")
    r = run_py(sandbox(), code)
    assert r.stdout == b"" and r.signal == signal.SIGSYS


def test_extra_deny_syscalls_adds_names_and_groups():
    sb = sandbox(extra_deny_syscalls=["getcwd", "mount"])
    r = run_py(sb, "import os\ntry:\n os.getcwd()\nexcept OSError as e: print(e.errno)")
    assert r.stdout.strip() == b"1"
    r = run_py(sandbox(), "import os; print(os.getcwd())")  # control
    assert r.success and r.stdout.strip().startswith(b"/")


def test_extra_allow_sysv_ipc_group():
    code = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
            "r = libc.shmget(0, 4096, 0o1600); print(r >= 0); "
            "r >= 0 and libc.shmctl(r, 0, None)")
    assert run_py(sandbox(), code).stdout.strip() == b"False"
    assert run_py(sandbox(extra_allow_syscalls=["sysv_ipc"]), code).stdout.strip() == b"True"


def test_probe_is_meaningful_outside_the_sandbox():
    """Control: unconfined, the same probes do not fail with EPERM, so EPERM inside comes
    from the filter and not from the probe's arguments."""
    # Only probes that are harmless when they succeed unconfined.
    names = ["socket_udp", "socket_udp6", "personality_no_aslr", "tiocsti",
             "tiocsti_high_bits", "socket_mptcp", "clone3"]
    if IS_ROOT:
        names.append("socket_raw")
    out = json.loads(subprocess.run([PY, "-c", PROBE, *names], capture_output=True,
                                    check=True, stdin=subprocess.DEVNULL).stdout)
    for name in names:
        assert out[name][1] != errno.EPERM, (name, out[name])
    assert out["clone3"][1] != errno.ENOSYS


def test_i386_int80_syscall_kills_the_process(tmp_path):
    cc = shutil.which("cc")
    assert cc, "a C compiler is part of the set-up (scripts/setup-system)"
    src = tmp_path / "int80.c"
    src.write_text('#include <stdio.h>\nint main(void){long r; __asm__ volatile("int $0x80"'
                   ' : "=a"(r) : "a"(20L)); printf("survived %ld\\n", r); return 0;}\n')
    exe = tmp_path / "int80"
    subprocess.run([cc, "-O0", "-o", str(exe), str(src)], check=True)
    os.chmod(tmp_path, 0o755)
    r = sandbox(fs_readable=[tmp_path]).run([str(exe)])
    assert r.stdout == b"" and r.signal == signal.SIGSYS
    control = subprocess.run([str(exe)], capture_output=True)  # i386 getpid works unconfined
    assert control.stdout.startswith(b"survived")
