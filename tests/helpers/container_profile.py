"""Run a command as in a container under Docker's default seccomp profile (containerd's
RuntimeDefault, which Kubernetes uses, has the same rules) without its capability-gated
entries, as a container without added capabilities gets it.

    python3 container_profile.py -- COMMAND [ARG...]

The rules below are those of moby's profiles/seccomp/default.json for x86-64: every other
syscall fails with EPERM; ptrace and process_vm_readv/writev are allowed (kernel >= 4.8),
socket() for every family but AF_VSOCK, personality() for five values, clone() without
namespace flags, clone3() fails with ENOSYS. Entries gated on CAP_SYS_ADMIN (mount,
unshare, setns, fsopen, ...) and CAP_SYS_PTRACE (pidfd_getfd, kcmp, process_madvise) are
left out. Started as root, the bounding set is reduced to Docker's default capabilities.
"""

import ctypes
import errno
import os
import sys

ALLOWED = """
accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown clock_adjtime
clock_getres clock_gettime clock_nanosleep close close_range connect copy_file_range creat
dup dup2 dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2
epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat
faccessat2 fadvise64 fallocate fanotify_mark fchdir fchmod fchmodat fchown fchownat fcntl
fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstatfs fsync
ftruncate futex futex_waitv futimesat getcpu getcwd getdents getdents64 getegid geteuid
getgid getgroups getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom
getresgid getresuid getrlimit get_robust_list getrusage getsid getsockname getsockopt
get_thread_area gettid gettimeofday getuid getxattr inotify_add_watch inotify_init
inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy io_getevents io_pgetevents
ioprio_get ioprio_set io_setup io_submit io_uring_enter io_uring_register io_uring_setup
kill landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lgetxattr link
linkat listen listxattr llistxattr lremovexattr lseek lsetxattr lstat madvise membarrier
memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap
mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedsend mq_unlink mremap
msgctl msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep
newfstatat open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc
pkey_free pkey_mprotect poll ppoll prctl pread64 preadv preadv2 prlimit64 process_mrelease
pselect6 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recvfrom
recvmmsg recvmsg remap_file_pages removexattr rename renameat renameat2 restart_syscall
rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn
rt_sigsuspend rt_sigtimedwait rt_tgsigqueueinfo sched_getaffinity sched_getattr
sched_getparam sched_get_priority_max sched_get_priority_min sched_getscheduler
sched_rr_get_interval sched_setaffinity sched_setattr sched_setparam sched_setscheduler
sched_yield seccomp select semctl semget semop semtimedop sendfile sendmmsg sendmsg sendto
setfsgid setfsuid setgid setgroups setitimer setpgid setpriority setregid setresgid
setresuid setreuid setrlimit set_robust_list setsid setsockopt set_thread_area
set_tid_address setuid setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd
signalfd4 socketpair splice stat statfs statx symlink symlinkat sync sync_file_range
syncfs sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime
timer_settime timerfd_create timerfd_gettime timerfd_settime times tkill truncate umask
uname unlink unlinkat utime utimensat utimes vfork vmsplice wait4 waitid write writev
ptrace process_vm_readv process_vm_writev arch_prctl modify_ldt
""".split()
DOCKER_CAPS = ("chown", "dac_override", "fsetid", "fowner", "mknod", "net_raw", "setgid",
               "setuid", "setfcap", "setpcap", "net_bind_service", "sys_chroot", "kill",
               "audit_write")
CAP_NUMBERS = {"chown": 0, "dac_override": 1, "fowner": 3, "fsetid": 4, "kill": 5,
               "setgid": 6, "setuid": 7, "setpcap": 8, "net_bind_service": 10,
               "net_raw": 13, "sys_chroot": 18, "mknod": 27, "audit_write": 29,
               "setfcap": 31}
AF_VSOCK = 40
CLONE_NAMESPACES = 0x7E020000
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)


def _filter():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from sandlock.syscall_filter import _seccomp
    sc = _seccomp()
    f = sc.SyscallFilter(sc.ERRNO(errno.EPERM))
    for name in ALLOWED:
        try:
            f.add_rule(sc.ALLOW, name)
        except (RuntimeError, ValueError, OSError):
            pass  # not a syscall on this architecture
    f.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.NE, AF_VSOCK))
    for value in PERSONALITIES:
        f.add_rule(sc.ALLOW, "personality", sc.Arg(0, sc.EQ, value))
    f.add_rule(sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NAMESPACES, 0))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    return f


def main(argv):
    if argv[:1] != ["--"] or len(argv) < 2:
        sys.exit("usage: container_profile.py -- COMMAND [ARG...]")
    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() == 0:
        keep = {CAP_NUMBERS[c] for c in DOCKER_CAPS}
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
        for cap in range(last + 1):
            if cap not in keep and libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                sys.exit(f"PR_CAPBSET_DROP {cap}: {os.strerror(ctypes.get_errno())}")
    else:
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: needed to load a filter unprivileged
    _filter().load()
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
