/*
 * sandlock-exec: the trampoline between posix_spawn and the sandboxed program.
 *
 * The Python parent prepares everything (Landlock ruleset fd, BPF program, argv, env) and
 * starts this helper with posix_spawn, which puts it in a new process group, sets stdio,
 * resets signal dispositions and mask, and places these fds:
 *   3 status (a SOCK_SEQPACKET socket): records {int32 step, int32 value}, one per
 *     message; EOF at exec means success. With flag bit 4 the listener record carries the
 *     listener itself (SCM_RIGHTS), else the parent takes it with pidfd_getfd
 *   4 ack (read): one byte from the parent once it holds the seccomp listener
 *   5 Landlock ruleset, or -1 in argv when Landlock is unavailable (degraded)
 *   6 BPF program (struct sock_filter[]), read with pread
 *   7 (flag bit 3) the protection list: records "<kind><path>\0", read with pread:
 *     'e' an empty file of mode 0 (hidden files are covered by it), 'h' a path to hide,
 *     'r' a path to make read-only
 *   8 the control socket of the sandbox's root (sandlock-init.c), -1 in none
 *   9.. (FLAGS >> 8 of them) fds the program gets, at 3, 4, ... once everything else is
 *     closed (a fan-in pipeline's inputs, where upstream puts them)
 *
 * Two processes: this one forks at once. The parent stays outside the sandbox as its root
 * (sandlock-init.c: the subreaper that keeps, limits and finally ends the process tree);
 * the child reports its pid (record ST_CHILD), confines itself as below and execs.
 * argv: sandlock-exec CWD KEEP_CAPS_HEX CAP_LAST DROP_CAPS(0|1) FLAGS
 *       RLIMITS("res:soft:hard,..." or "-") LOWER UPPER WORK RIGHTS -- EXE ARGV0 ARGV...
 * FLAGS: bit 5 = Landlock logs the program's denials to the audit subsystem (ABI 7:
 * LOG_NEW_EXEC_ON; supervisor/landlock_audit.py reads them); bit 6 = a parked start (a
 * CLI-service spare's, started before its call): the child, once forked, waits for the
 * call's stdio, working directory, signals, EXE, ARGV and environment (receive_call;
 * CWD, EXE and ARGV in argv are then placeholders); bits 8.. = passed fds;
 * bit 0 = a Landlock ruleset is at fd 5; bit 1 = become a child subreaper (the
 * sandbox's orphans then stay its descendants: sandlock/supervisor/freeze.py walks them);
 * bit 2 = a copy-on-write workspace of the overlay backend: LOWER (the workdir) is covered
 * by an overlayfs mount whose upper layer is UPPER (WORK is overlayfs' work directory),
 * in a mount namespace of the sandbox's own (and, unless started as root, a user
 * namespace mapping the caller's uid and gid to themselves), and the Landlock ruleset
 * (made for this run alone) gains a rule granting RIGHTS (hex) beneath the overlay's root:
 * a rule on the workdir itself would not reach it (Landlock skips mount points). "-"
 * when unused. Bit 3 = protect the user's files (sandlock/home_policy.py), in the same
 * mount namespace: a hidden directory is covered by an empty read-only tmpfs of mode 0, a
 * hidden file by a read-only bind of the 'e' file, a read-only path by a read-only bind
 * of itself (recursive). Each target is opened once with O_NOFOLLOW and the mount is
 * placed on that fd (move_mount), so a symlink swapped in is never followed; a path gone
 * since the plan is skipped (the supervisor's guard refuses its re-creation).
 * Bit 7 = a private /dev/shm, in the same mount namespace: the directory SANDLOCK_SHM names
 * in the program's environment (a private TMPDIR's .shm, which the ruleset grants) is bound
 * over /dev/shm, and the variable removed (private_shm).
 *
 * Order (the child): close every other fd -> [parked: the call] -> [overlay] -> [protection] ->
 * [private /dev/shm] -> cwd -> rlimits -> capabilities ->
 * NO_NEW_PRIVS -> Landlock -> seccomp (listener) -> handshake -> close-on-exec -> execve.
 * The overlay comes first so that cwd is resolved in the sandbox's own view; its mount
 * propagation is made slave first, so the mount never reaches the caller's namespace.
 * The capabilities a user namespace grants are dropped with the rest (the seccomp
 * filter then refuses mount, unshare and setns: the program cannot do the same).
 * Invariant: the program never runs before the supervisor holds the listener, and never
 * holds the listener itself (it is closed before exec). Any failure exits 127 after
 * reporting the step and errno; nothing is ever run half-confined.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/prctl.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandlock-init.h"

extern char **environ;

/* Step numbers: must match sandlock/launch.py STEPS. */
enum { ST_LISTENER, ST_ARGS, ST_CLOSE_FDS, ST_CHDIR, ST_RLIMIT, ST_SECUREBITS, ST_BOUNDING,
       ST_CAPSET, ST_AMBIENT, ST_NO_NEW_PRIVS, ST_LANDLOCK, ST_SECCOMP_READ, ST_SECCOMP,
       ST_HANDSHAKE, ST_CLOEXEC, ST_EXECVE, ST_SUBREAPER, ST_USERNS, ST_ID_MAP,
       ST_MOUNT_SLAVE, ST_OVERLAY, ST_OVERLAY_RULE, ST_PROTECT, ST_CHILD, ST_FORK,
       ST_CALL, ST_SHM };

enum { FD_STATUS = 3, FD_ACK = 4, FD_RULESET = 5, FD_BPF = 6, FD_PROTECT = 7, FD_CONTROL = 8,
       FD_PASSED = 9, MAX_PASSED = 64 };
static int passed; /* fds FD_PASSED.. kept for the program (FLAGS >> 8) */
static int status_fd = FD_STATUS; /* moved above the passed fds just before the exec */
enum { F_RULESET = 1, F_SUBREAPER = 2, F_OVERLAY = 4, F_PROTECT = 8, F_SEND_LISTENER = 16,
       F_LANDLOCK_LOG = 32, F_PARKED = 64, F_SHM = 128 };
#define MAX_CALL (4 << 20) /* a parked start's call: argv and environment, as ARG_MAX bounds */
#define LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON (1U << 1) /* ABI 7: log the program's denials */

#define SECBITS_SANDBOX 0x2f /* NOROOT, NO_SETUID_FIXUP (each locked), KEEP_CAPS_LOCKED */
#define MAX_BPF_INSNS 4096

static int probing; /* --probe-overlay: failures go to stderr as "step errno" */

static void report(int step, int value) {
    if (probing) {
        char line[32];
        int n = snprintf(line, sizeof line, "%d %d\n", step, value);
        if (n > 0 && write(2, line, (size_t)n) < 0)
            _exit(1);
        return;
    }
    int32_t rec[2] = {step, value};
    ssize_t n;
    do {
        n = write(status_fd, rec, sizeof rec);
    } while (n < 0 && errno == EINTR);
}

static void fail(int step, int err) {
    report(step, err);
    _exit(127);
}

static unsigned long long parse_num(const char *s, int base) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || *end || end == s)
        fail(ST_ARGS, EINVAL);
    return v;
}

static void set_rlimits(const char *spec) {
    if (strcmp(spec, "-") == 0)
        return;
    char buf[512];
    if (strlen(spec) >= sizeof buf)
        fail(ST_ARGS, E2BIG);
    strcpy(buf, spec);
    for (char *item = strtok(buf, ","); item; item = strtok(NULL, ",")) {
        char *soft = strchr(item, ':');
        char *hard = soft ? strchr(soft + 1, ':') : NULL;
        if (!soft || !hard)
            fail(ST_ARGS, EINVAL);
        *soft++ = 0;
        *hard++ = 0;
        struct rlimit rl = {parse_num(soft, 10), parse_num(hard, 10)};
        if (setrlimit((int)parse_num(item, 10), &rl) < 0)
            fail(ST_RLIMIT, errno);
    }
}

/* Root's capabilities never reach the sandbox, except those kept by name. */
static void drop_capabilities(uint64_t keep, int cap_last, int privileged) {
    if (privileged) {
        if (prctl(PR_SET_SECUREBITS, SECBITS_SANDBOX, 0, 0, 0) < 0)
            fail(ST_SECUREBITS, errno);
        for (int cap = 0; cap <= cap_last; cap++)
            if (!(keep & (1ULL << cap)) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
                fail(ST_BOUNDING, errno);
        struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
        struct __user_cap_data_struct data[2];
        for (int i = 0; i < 2; i++) {
            uint32_t part = (uint32_t)(keep >> (32 * i));
            data[i].effective = data[i].permitted = data[i].inheritable = part;
        }
        if (syscall(SYS_capset, &hdr, data) < 0)
            fail(ST_CAPSET, errno);
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        fail(ST_AMBIENT, errno);
    if (privileged)
        for (int cap = 0; cap <= cap_last; cap++)
            if ((keep & (1ULL << cap)) &&
                prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0)
                fail(ST_AMBIENT, errno);
}

static void write_file(const char *path, const char *text, int step) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        fail(step, errno);
    size_t n = strlen(text);
    if (write(fd, text, n) != (ssize_t)n)
        fail(step, errno);
    close(fd);
}

/* A mount namespace of the sandbox's own (and, unless root, a user namespace mapping the
 * caller's uid and gid to themselves), its mounts slaves of ours so that nothing made here
 * reaches the caller's namespace. Returns 1 when a user namespace was entered (its
 * capabilities must then be dropped like root's). */
static int enter_namespace(void) {
    int userns = getuid() != 0;
    if (userns) {
        uid_t uid = getuid();
        gid_t gid = getgid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0)
            fail(ST_USERNS, errno);
        char map[64];
        write_file("/proc/self/setgroups", "deny", ST_ID_MAP);
        snprintf(map, sizeof map, "%u %u 1", (unsigned)uid, (unsigned)uid);
        write_file("/proc/self/uid_map", map, ST_ID_MAP);
        snprintf(map, sizeof map, "%u %u 1", (unsigned)gid, (unsigned)gid);
        write_file("/proc/self/gid_map", map, ST_ID_MAP);
    } else if (unshare(CLONE_NEWNS) < 0) {
        fail(ST_USERNS, errno);
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
        fail(ST_MOUNT_SLAVE, errno);
    return userns;
}

/* The overlay backend's private view of the workdir. */
static void mount_overlay(const char *lower, const char *upper, const char *work) {
    static char opts[3 * 4096 + 64];
    int n = snprintf(opts, sizeof opts,
                     "lowerdir=%s,upperdir=%s,workdir=%s,userxattr",
                     lower, upper, work);
    if (n < 0 || (size_t)n >= sizeof opts)
        fail(ST_OVERLAY, ENAMETOOLONG);
    if (mount("overlay", lower, "overlay", 0, opts) < 0)
        fail(ST_OVERLAY, errno);
}

#define MOUNT_LOCKDOWN (MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | \
                        MOUNT_ATTR_NOEXEC)

/* Place the detached mount `tree` on the object open at `target`. */
static void place(int tree, int target) {
    if (syscall(SYS_move_mount, tree, "", target, "",
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
        fail(ST_PROTECT, errno);
    close(tree);
}

/* An empty read-only tmpfs of mode 0 (nothing to list, nothing to read, nothing to chmod),
 * detached. */
static int empty_tmpfs(void) {
    int fs = (int)syscall(SYS_fsopen, "tmpfs", FSOPEN_CLOEXEC);
    if (fs < 0)
        fail(ST_PROTECT, errno);
    if (syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "mode", "0", 0) < 0 ||
        syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "size", "4k", 0) < 0 ||
        syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        fail(ST_PROTECT, errno);
    int tree = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_LOCKDOWN);
    if (tree < 0)
        fail(ST_PROTECT, errno);
    close(fs);
    return tree;
}

/* A detached read-only copy of the mount tree at `source` (recursive). */
static int readonly_clone(int source, unsigned int lockdown) {
    int tree = (int)syscall(SYS_open_tree, source, "",
                            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE);
    if (tree < 0)
        fail(ST_PROTECT, errno);
    struct mount_attr attr = {.attr_set = lockdown};
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
                sizeof attr) < 0)
        fail(ST_PROTECT, errno);
    return tree;
}

/* The protection list (fd 7): hide secrets, make persistence vectors read-only, and show
 * files in place of others. Records: 'e'PATH the empty file covers are cloned from;
 * 'h'PATH hide; 'r'PATH read-only; 'f'PATH the file the next 'b' records show;
 * 'b'PATH show the last 'f' file here, read-only (a trust bundle with the HTTP
 * filter's CA spliced in, http_inject_ca). */
static void protect(void) {
    static char spec[1 << 20];
    ssize_t n = pread(FD_PROTECT, spec, sizeof spec - 1, 0);
    if (n < 0 || n == (ssize_t)sizeof spec - 1)
        fail(ST_PROTECT, n < 0 ? errno : E2BIG);
    spec[n] = 0;
    int empty = -1, from = -1;
    for (char *p = spec; p < spec + n; p += strlen(p) + 1) {
        char kind = p[0];
        const char *path = p + 1;
        int target = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (target < 0) {
            if ((errno == ENOENT || errno == ENOTDIR) && kind != 'f')
                continue;  /* gone since the plan: nothing to cover */
            fail(ST_PROTECT, errno);
        }
        struct stat st;
        if (fstat(target, &st) < 0)
            fail(ST_PROTECT, errno);
        if (kind == 'e') {
            empty = target;
            continue;
        }
        if (kind == 'f') {
            if (from >= 0)
                close(from);
            from = target;
            continue;
        }
        if (S_ISLNK(st.st_mode)) {
            close(target);  /* a symlink: what it points to is planned separately */
            continue;
        }
        if (kind == 'r')
            place(readonly_clone(target, MOUNT_ATTR_RDONLY), target);
        else if (kind == 'h' && S_ISDIR(st.st_mode))
            place(empty_tmpfs(), target);
        else if (kind == 'h' && empty >= 0)
            place(readonly_clone(empty, MOUNT_LOCKDOWN), target);
        else if (kind == 'b' && from >= 0 && S_ISREG(st.st_mode))
            place(readonly_clone(from, MOUNT_LOCKDOWN), target);
        else
            fail(ST_PROTECT, EINVAL);
        close(target);
    }
    if (empty >= 0)
        close(empty);
    if (from >= 0)
        close(from);
}

/* The overlay's root (now at LOWER) gets `rights` in this run's own ruleset. */
static void allow_overlay(const char *lower, uint64_t rights) {
    struct landlock_path_beneath_attr attr = {.allowed_access = rights};
    attr.parent_fd = open(lower, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (attr.parent_fd < 0)
        fail(ST_OVERLAY_RULE, errno);
    if (syscall(SYS_landlock_add_rule, FD_RULESET, LANDLOCK_RULE_PATH_BENEATH, &attr, 0) < 0)
        fail(ST_OVERLAY_RULE, errno);
    close(attr.parent_fd);
}

/* The sandbox's /dev/shm (flag bit 7): the directory SANDLOCK_SHM names in `env` (a
 * private TMPDIR's .shm: sandlock/private_tmp.py), bound over /dev/shm, so that POSIX
 * semaphores and shared memory (sem_open, shm_open) work without the host's /dev/shm,
 * where other programs' objects are. The variable leaves `env` (every copy of it). The
 * directory is opened without following a symlink in its place (a run before this one
 * of the same sandbox may write its parent), must be a directory of this uid, and is
 * bound as it was opened; /dev/shm is covered by that fd, never by a path re-resolved.
 * Without the variable there is nothing to bind: /dev/shm stays the host's, which the
 * ruleset does not grant (nothing is allowed that was not). */
static void private_shm(char **env) {
    static const char key[] = "SANDLOCK_SHM=";
    const char *src = NULL;
    char **kept = env;
    for (char **p = env; *p != NULL; p++) {
        if (strncmp(*p, key, sizeof key - 1) == 0)
            src = *p + sizeof key - 1;
        else
            *kept++ = *p;
    }
    *kept = NULL;
    if (src == NULL)
        return;
    int dir = open(src, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0)
        fail(ST_SHM, errno);
    struct stat st;
    if (fstat(dir, &st) < 0)
        fail(ST_SHM, errno);
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid())
        fail(ST_SHM, EPERM);
    int target = open("/dev/shm", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (target < 0)
        fail(ST_SHM, errno);
    int tree = (int)syscall(SYS_open_tree, dir, "",
                            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
    if (tree < 0)
        fail(ST_SHM, errno);
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0 ||
        syscall(SYS_move_mount, tree, "", target, "",
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
        fail(ST_SHM, errno);
    close(tree);
    close(target);
    close(dir);
}

/* The listener record, with the listener attached (SCM_RIGHTS): where pidfd_getfd is
 * refused (a container's seccomp profile). Only used when the program's filter leaves
 * sendmsg in the kernel (no network supervision): a trapped sendmsg would wait for the
 * very listener it carries. */
static void send_listener(int listener) {
    int32_t rec[2] = {ST_LISTENER, listener};
    struct iovec iov = {rec, sizeof rec};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &listener, sizeof(int));
    ssize_t n;
    do {
        n = sendmsg(FD_STATUS, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof rec)
        _exit(127); /* the parent is gone, or the channel broke: never run unsupervised */
}

/* The blocked-signal mask (bit n-1: signal n), set by the kernel's call, never with
 * glibc's own signals (32, 33): a child of subprocess or of a shell starts with them
 * unblocked (glibc's fork and posix_spawn clear them), whatever its caller had. */
#define INTERNAL_SIGNALS (3ULL << 31)
static void set_blocked(uint64_t blocked) {
    blocked &= ~INTERNAL_SIGNALS;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &blocked, NULL, sizeof blocked);
}

/* Signals 32 and 33 ignored where `ignored` (bit n-1: signal n) says, default otherwise:
 * glibc's sigaction() refuses them (its own), so the kernel's call, with its struct
 * (handler, flags, restorer, mask: all zero but the handler; mask size 8). */
static void set_internal_signals(uint64_t ignored) {
    for (int sig = 32; sig <= 33; sig++) {
        uint64_t action[4] = {(ignored >> (sig - 1)) & 1 ? (uint64_t)(uintptr_t)SIG_IGN : 0,
                              0, 0, 0};
        syscall(SYS_rt_sigaction, sig, action, NULL, sizeof(uint64_t));
    }
}

/* A parked start (F_PARKED): the child, forked and not yet in any namespace or
 * confinement, waits for its call on the status channel, one message: fds [stdin, stdout,
 * stderr, working directory] (SCM_RIGHTS) and
 *   u64 ignored-signal mask, u64 blocked-signal mask (bit n-1: signal n), CWD\0, EXE\0,
 *   u32 argc, argc strings\0, u32 envc, envc strings\0  (integers little-endian).
 * It takes them as posix_spawn would have given them: stdio at 0-2, the working directory
 * entered by fd (before the namespaces, which carry it over like an inherited one), each
 * signal ignored or default (SIGPIPE and SIGXFSZ stay default: posix_spawn's setsigdef;
 * Python ignores them itself, a caller's do not reach it), the caller's blocked signals
 * blocked (as posix_spawn's child inherits its caller's mask); every other attribute is the
 * parent's, which sends a call only to a start made with the caller's attributes
 * (service/prepared.py). End-of-file: the parent went away, nothing runs. */
static uint32_t call_u32(const char *buf, size_t len, size_t *pos) {
    uint32_t v;
    if (len - *pos < sizeof v)
        fail(ST_CALL, EINVAL);
    memcpy(&v, buf + *pos, sizeof v);
    *pos += sizeof v;
    return v;
}

static char *call_string(char *buf, size_t len, size_t *pos) {
    char *start = buf + *pos, *end = memchr(start, 0, len - *pos);
    if (end == NULL)
        fail(ST_CALL, EINVAL);
    *pos += (size_t)(end - start) + 1;
    return start;
}

static char **call_strings(char *buf, size_t len, size_t *pos) {
    uint32_t n = call_u32(buf, len, pos);
    if (n > len)
        fail(ST_CALL, EINVAL);
    char **v = calloc((size_t)n + 1, sizeof *v);
    if (v == NULL)
        fail(ST_CALL, ENOMEM);
    for (uint32_t i = 0; i < n; i++)
        v[i] = call_string(buf, len, pos);
    return v;
}

static void receive_call(const char **cwd, const char **exe, char ***args, char ***env) {
    char *buf = malloc(MAX_CALL);
    if (buf == NULL)
        fail(ST_CALL, ENOMEM);
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {buf, MAX_CALL};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = sizeof u.buf};
    ssize_t n;
    do {
        n = recvmsg(FD_STATUS, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n <= 0)
        _exit(127); /* discarded, or the parent went away: nothing runs */
    int fds[4], got = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS
            && c->cmsg_len == CMSG_LEN(sizeof fds) && !got) {
            memcpy(fds, CMSG_DATA(c), sizeof fds);
            got = 1;
        }
    if (!got || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
        fail(ST_CALL, EINVAL);
    size_t len = (size_t)n, pos = 0;
    uint64_t ignored, blocked;
    if (len < sizeof ignored + sizeof blocked)
        fail(ST_CALL, EINVAL);
    memcpy(&ignored, buf, sizeof ignored);
    memcpy(&blocked, buf + sizeof ignored, sizeof blocked);
    pos = sizeof ignored + sizeof blocked;
    *cwd = call_string(buf, len, &pos);
    *exe = call_string(buf, len, &pos);
    *args = call_strings(buf, len, &pos);
    *env = call_strings(buf, len, &pos);
    if (pos != len || (*args)[0] == NULL)
        fail(ST_CALL, EINVAL);
    for (int i = 0; i < 4; i++) {  /* above 2 first: 0-2 may be among them (closed here) */
        int moved = fcntl(fds[i], F_DUPFD_CLOEXEC, 10);
        if (moved < 0)
            fail(ST_CALL, errno);
        close(fds[i]);
        fds[i] = moved;
    }
    for (int i = 0; i < 3; i++)
        if (dup2(fds[i], i) < 0)
            fail(ST_CALL, errno);
    if (fchdir(fds[3]) < 0)
        fail(ST_CHDIR, errno);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    for (int sig = 1; sig <= 64; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP || sig == SIGPIPE || sig == SIGXFSZ)
            continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = (ignored >> (sig - 1)) & 1 ? SIG_IGN : SIG_DFL;
        sigaction(sig, &sa, NULL); /* the C library's own (32, 33) refuse: below */
    }
    set_internal_signals(ignored);
    set_blocked(blocked);
}

/* The caller's SIGTERM disposition, the program's (restored in the fork's child below);
 * the trampoline and the root take the default from their first instruction on: their
 * parent's SIGTERM and its death must end them even where the caller ignores it. */
static struct sigaction caller_term;
/* The caller's blocked signals (posix_spawn's child inherits its caller's mask, as a
 * program started by subprocess or a shell does): the program's, restored in the fork's
 * child below; the root blocks exactly what it reads from its signalfd. */
static uint64_t caller_blocked;

/* Fork: the parent becomes the sandbox's root (never returns), the child goes on. */
static void become_root_of_tree(void) {
    pid_t parent = getppid();
    /* Blocked first, for its signalfd: a blocked signal is queued even where the caller
     * ignores it (SIGTERM may be, and the program keeps that), so the death signal
     * below is never dropped. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    /* The root ends the sandbox when the process that started it dies, however it dies. */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0) < 0 || getppid() != parent)
        _exit(127);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        fail(ST_SUBREAPER, errno);
    /* The root reaps its tree: SIGCHLD ignored, as a caller may leave it, would have the
     * kernel reap the program unseen (the root then waited forever). The program gets
     * the caller's disposition back. */
    struct sigaction chld_default, chld_caller;
    memset(&chld_default, 0, sizeof chld_default);
    chld_default.sa_handler = SIG_DFL;
    if (sigaction(SIGCHLD, &chld_default, &chld_caller) < 0)
        fail(ST_FORK, errno);
    pid_t child = fork();
    if (child < 0)
        fail(ST_FORK, errno);
    if (child == 0) {
        sigaction(SIGCHLD, &chld_caller, NULL);
        sigaction(SIGTERM, &caller_term, NULL);
        set_blocked(caller_blocked);
        close(FD_CONTROL);
        /* The program ends with its root, whatever ends the root. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
            fail(ST_FORK, errno);
        if (getppid() != parent && getppid() == 1)
            _exit(127);
        report(ST_CHILD, (int)getpid());
        return;
    }
    sigprocmask(SIG_SETMASK, &set, NULL);  /* none of the caller's blocked ones */
    for (int fd = FD_STATUS; fd <= FD_PROTECT; fd++)
        close(fd);
    for (int fd = FD_PASSED; fd < FD_PASSED + passed; fd++)
        close(fd);  /* the program's, not the root's */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
        for (int fd = 0; fd <= 2; fd++)
            dup2(null, fd);
        close(null);
    }
    /* Keystrokes for the terminal's foreground group are the program's, not ours. */
    signal(SIGINT, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    signal(SIGTSTP, SIG_IGN);
    signal(SIGTTIN, SIG_IGN);
    signal(SIGTTOU, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    run_init(child, fcntl(FD_CONTROL, F_GETFD) < 0 ? -1 : FD_CONTROL);
}

static int load_seccomp(void) {
    static struct sock_filter insns[MAX_BPF_INSNS];
    ssize_t n = pread(FD_BPF, insns, sizeof insns, 0);
    if (n <= 0 || n % sizeof(struct sock_filter) || n == sizeof insns)
        fail(ST_SECCOMP_READ, n < 0 ? errno : EINVAL);
    struct sock_fprog prog = {(unsigned short)(n / sizeof(struct sock_filter)), insns};
    int flags = SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV;
    int listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
    if (listener < 0)
        fail(ST_SECCOMP, errno);
    return listener;
}

int main(int argc, char **argv) {
    syscall(SYS_rt_sigprocmask, SIG_BLOCK, NULL, &caller_blocked, sizeof caller_blocked);
    struct sigaction term_default;
    memset(&term_default, 0, sizeof term_default);
    term_default.sa_handler = SIG_DFL;
    sigaction(SIGTERM, &term_default, &caller_term);
    /* sandlock-exec --probe-overlay LOWER UPPER WORK: can this user mount the overlay
     * backend's view here? Exits 0 if so (its private namespace ends with it). */
    if (argc == 5 && strcmp(argv[1], "--probe-overlay") == 0) {
        probing = 1;
        enter_namespace();
        mount_overlay(argv[2], argv[3], argv[4]);
        return 0;
    }
    /* sandlock-exec --probe-protect: can this user make the mounts of the protection
     * list here (a namespace of its own, a tmpfs, a read-only clone)? */
    if (argc == 2 && strcmp(argv[1], "--probe-protect") == 0) {
        probing = 1;
        enter_namespace();
        int tree = empty_tmpfs();
        int root = open("/", O_PATH | O_CLOEXEC);
        if (root < 0)
            fail(ST_PROTECT, errno);
        close(readonly_clone(root, MOUNT_ATTR_RDONLY));
        close(tree);
        return 0;
    }
    if (argc < 14 || strcmp(argv[11], "--") != 0)
        fail(ST_ARGS, EINVAL);
    const char *cwd = argv[1];
    uint64_t keep = parse_num(argv[2], 16);
    int cap_last = (int)parse_num(argv[3], 10);
    int privileged = (int)parse_num(argv[4], 10);
    int flags = (int)parse_num(argv[5], 10);
    int has_ruleset = flags & F_RULESET;
    passed = (flags >> 8) & 0xffff;
    if (cap_last > 63 || passed > MAX_PASSED)
        fail(ST_ARGS, EINVAL);
    /* glibc's posix_spawn leaves its own signals (32, 33: thread cancellation, setxid)
     * ignored in every child it execs: they get the caller's dispositions back, ignored
     * only where the caller ignores them (the flags' bits 24 and 25), as a program
     * started by fork and exec would have them. */
    set_internal_signals((uint64_t)(flags >> 24) << 31);

    /* Nothing the parent leaked (fds without O_CLOEXEC) reaches the program. */
    if (syscall(SYS_close_range, FD_PASSED + passed, ~0U, 0) < 0)
        fail(ST_CLOSE_FDS, errno);
    become_root_of_tree();
    const char *exe = argv[12];
    char **args = &argv[13], **env = environ;
    if (flags & F_PARKED)
        receive_call(&cwd, &exe, &args, &env);
    if ((flags & (F_OVERLAY | F_PROTECT | F_SHM)) && enter_namespace())
        privileged = 1;  /* the user namespace's capabilities go with the rest */
    if (flags & F_OVERLAY) {
        mount_overlay(argv[7], argv[8], argv[9]);
        if (has_ruleset)
            allow_overlay(argv[7], parse_num(argv[10], 16));
    }
    if (flags & F_PROTECT)
        protect();
    close(FD_PROTECT);
    if (flags & F_SHM)
        private_shm(env);
    if (strcmp(cwd, "-") != 0 && chdir(cwd) < 0)
        fail(ST_CHDIR, errno);
    set_rlimits(argv[6]);
    drop_capabilities(keep, cap_last, privileged);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        fail(ST_NO_NEW_PRIVS, errno);
    if (has_ruleset && syscall(SYS_landlock_restrict_self, FD_RULESET,
                               (flags & F_LANDLOCK_LOG) ? LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON
                                                        : 0) < 0)
        fail(ST_LANDLOCK, errno);

    int listener = load_seccomp();
    if (flags & F_SEND_LISTENER)
        send_listener(listener);
    else
        report(ST_LISTENER, listener);
    char ack = 0;
    ssize_t n;
    do {
        n = read(FD_ACK, &ack, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1 || ack != 1)
        _exit(127); /* the parent went away: never run unsupervised */
    close(listener);
    close(FD_ACK);
    close(FD_RULESET);
    close(FD_BPF);
    if (fcntl(FD_STATUS, F_SETFD, FD_CLOEXEC) < 0)
        fail(ST_CLOEXEC, errno);
    if (passed > 0) {
        /* The status channel moves above everything; the passed fds go to 3, 4, ...
         * (ascending: a target at or above FD_PASSED was moved already). */
        int moved = fcntl(FD_STATUS, F_DUPFD_CLOEXEC, FD_PASSED + passed);
        if (moved < 0)
            fail(ST_CLOEXEC, errno);
        close(FD_STATUS);
        status_fd = moved;
        for (int i = 0; i < passed; i++)
            if (dup2(FD_PASSED + i, FD_STATUS + i) < 0)
                fail(ST_CLOEXEC, errno);
        for (int fd = FD_STATUS + passed; fd < FD_PASSED + passed; fd++)
            if (fd >= FD_PASSED)
                close(fd);
    }

    execve(exe, args, env);
    int err = errno;
    report(ST_EXECVE, err);
    _exit(err == ENOENT ? 127 : 126); /* the shell's codes for "not found" / "cannot run" */
}
