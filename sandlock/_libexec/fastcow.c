/* The supervisor's fast path for a copy-on-write workspace (seccomp backend; see
 * fastconnect.c, which receives the notifications and calls these, and
 * supervisor/fastpath.py): which calls only look (continued while the layer holds no
 * change), and after the first change the fstat and getdents calls that need nothing of
 * the layer. Each function answers a notification itself (1) or leaves it to Python (0).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "fastpath.h"

/* O_TMPFILE's own bit. glibc's __O_TMPFILE includes O_DIRECTORY, and masking with it sent
 * every directory open (opendir: git, find, ls) to Python, which opens the same untouched
 * directory of the workdir and injects it (cow_calls._open, LOWER without writes). */
#define TMPFILE_BIT 020000000

/* A path call of a copy-on-write workspace that only looks (supervisor/cow_reads.py,
 * cow_calls.py): stat family, access, readlink, xattr reads, getcwd, chdir, exec, and
 * opens for reading that create and truncate nothing. While the layer holds no change
 * the workspace is the workdir itself, read-only under Landlock: the kernel may do these
 * calls as the sandbox, with the sandbox's own rights, and whatever it re-reads (another
 * path, other flags) stays under those rights. openat2 (flags in memory) goes to Python.
 * Python decides the same (cow_calls.only_looks, dispatch._with_workspace): keep the two in step. */
int cow_read_only(const struct seccomp_notif *n) {
    switch (n->data.nr) {
#ifdef SYS_stat
    case SYS_stat: case SYS_lstat: case SYS_access: case SYS_readlink:
#endif
#ifdef SYS_fstat
    case SYS_fstat:
#endif
    case SYS_newfstatat: case SYS_statx: case SYS_faccessat: case SYS_faccessat2:
    case SYS_readlinkat: case SYS_getxattr: case SYS_lgetxattr: case SYS_listxattr:
    case SYS_llistxattr: case SYS_getcwd: case SYS_chdir: case SYS_execve: case SYS_execveat:
    case SYS_getdents64:
#ifdef SYS_getdents
    case SYS_getdents:
#endif
        return 1;
#ifdef SYS_open
    case SYS_open:
        return (n->data.args[1] & (O_ACCMODE | O_CREAT | O_TRUNC | TMPFILE_BIT)) == O_RDONLY;
#endif
    case SYS_openat:
        return (n->data.args[2] & (O_ACCMODE | O_CREAT | O_TRUNC | TMPFILE_BIT)) == O_RDONLY;
    default:
        return 0;
    }
}

/* cow/location.py IDENTITY: on a file of the layer copied from the workdir, the identity
 * a stat reports for it (fastpath.py checks this name against Python's). */
#define IDENTITY_XATTR "user.sandlock.identity"

const char *sl_fast_identity_xattr(void) {
    return IDENTITY_XATTR;
}

/* The fd an fstat names: fstat(fd), or newfstatat/statx(fd, "" or NULL, AT_EMPTY_PATH)
 * (the path's first byte copied out); -1 for any other form (a path: Python's). */
static int fd_stat_form(const struct seccomp_notif *n) {
    uint64_t path, flags;
    switch (n->data.nr) {
#ifdef SYS_fstat
    case SYS_fstat:
        return (int)n->data.args[0];
#endif
    case SYS_newfstatat:
        path = n->data.args[1];
        flags = n->data.args[3];
        break;
    case SYS_statx:
        path = n->data.args[1];
        flags = n->data.args[2];
        break;
    default:
        return -1;
    }
    if (!(flags & AT_EMPTY_PATH) || (int)n->data.args[0] < 0)  /* AT_FDCWD: Python's */
        return -1;
    if (path == 0)  /* Linux 6.11: a NULL path with AT_EMPTY_PATH is the fd itself */
        return (int)n->data.args[0];
    char first = 1;
    struct iovec local = {&first, 1}, remote = {(void *)(uintptr_t)path, 1};
    if (syscall(SYS_process_vm_readv, n->pid, &local, 1, &remote, 1, 0) != 1 || first != 0)
        return -1;
    return (int)n->data.args[0];
}

/* A listing after the layer's first change (getdents): CONTINUE (1) unless it starts at
 * the beginning of a directory fd on the workdir, which Python may replace by one on the
 * layer's directory (cow_reads.getdents); 0: Python's. A listing under way, or of any
 * other directory (the layer's own fds are current), is the kernel's. */
int cow_getdents(int listener, const struct seccomp_notif *n, const char *lower) {
    if (n->data.nr != SYS_getdents64
#ifdef SYS_getdents
        && n->data.nr != SYS_getdents
#endif
        )
        return 0;
    int child_fd = (int)n->data.args[0];
    char file[32], info[512];
    snprintf(file, sizeof file, "fdinfo/%d", child_fd);
    if (lower[0] == 0 || child_fd < 0 || read_proc(n->pid, file, info, sizeof info) != 0)
        return 0;
    const char *pos = strstr(info, "pos:");
    if (pos == NULL)
        return 0;
    if (strtoll(pos + 4, NULL, 10) == 0) {
        int fd = dup_child_fd(listener, n, child_fd);
        if (fd < 0)
            return 0;
        char self[32], target[PATH_MAX];
        snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
        ssize_t len = readlink(self, target, sizeof target - 1);
        close(fd);
        if (len < 0)
            return 0;
        target[len] = 0;
        size_t ll = strlen(lower);
        if (strncmp(target, lower, ll) == 0 && (target[ll] == 0 || target[ll] == '/'))
            return 0;  /* a workdir directory from the start: Python's */
    }
    respond(listener, n->id, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE);  /* ENOENT: died */
    count_cow();
    return 1;
}

/* An fstat after the layer's first change: CONTINUE (1) unless the file behind the fd
 * carries the layer's identity xattr (a copied-up file: Python reports its identity) or
 * cannot be checked (0: Python's). The kernel re-reads the fd number when it continues:
 * another thread may have put another of the sandbox's own fds there, and the kernel then
 * describes that one, as an fstat outside any workspace would. Nothing is written. */
int cow_fd_stat(int listener, const struct seccomp_notif *n) {
    int child_fd = fd_stat_form(n);
    if (child_fd < 0)
        return 0;
    int fd = dup_child_fd(listener, n, child_fd);
    if (fd < 0)
        return 0;  /* EBADF and the like: Python answers the same error */
    ssize_t r = fgetxattr(fd, IDENTITY_XATTR, NULL, 0);
    int err = errno;
    close(fd);
    if (r >= 0 || (err != ENODATA && err != EOPNOTSUPP))
        return 0;  /* a copy, or unknown (an O_PATH fd: EBADF; mode 000: EACCES) */
    respond(listener, n->id, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE);  /* ENOENT: died */
    count_cow();
    return 1;
}
