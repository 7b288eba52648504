/* The COW-fork loop and the reaper of the init process (sandlock/clones.py), in C so that
 * nothing runs in the init process between two forks: a Python loop writes to its heap
 * after every fork, and each write to a page shared with the clones is a copy-on-write
 * fault (measured: ~2x slower per clone).
 *
 * Invariant: a clone inherits no fd but 0, 2 and its own stdout pipe. Each clone's pipe is
 * created right before its fork, and its read end leaves the init process (to the caller,
 * over the report socket) within BATCH forks; in the clone, the report socket and every
 * read end still pending are closed before any Python runs. So a fork copies O(1) fds, not
 * one per clone, and no clone can read or forge another's output.
 *
 * The report socket is a SOCK_SEQPACKET unix socket: each sendmsg is one record of whole
 * lines. "P id pid\n" records carry the read ends in the same order (SCM_RIGHTS);
 * "X pid status\n" records report exits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define BATCH 32          /* read ends per record (SCM_MAX_FD is 253) */
#define LINE 48           /* "P %d %d\n" / "X %d %d\n" fit with room to spare */

int sandlock_forkloop_version(void) { return 4; }

static int send_all(int sock, const char *buf, size_t len, const int *fds, int nfds) {
    union {
        char space[CMSG_SPACE(sizeof(int) * BATCH)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.space;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    for (;;) {
        ssize_t r = sendmsg(sock, &msg, MSG_NOSIGNAL);
        if (r >= 0)
            return 0;  /* SEQPACKET: a record is sent whole or not at all */
        if (errno != EINTR)
            return -1;
    }
}

/* Sends the pending "P" lines with their read ends, then closes those ends here. */
static int flush(int sock, char *buf, size_t *len, int *fds, int *nfds) {
    int rc = *len ? send_all(sock, buf, *len, fds, *nfds) : 0;
    int saved = errno;
    for (int k = 0; k < *nfds; k++)
        close(fds[k]);
    *len = 0;
    *nfds = 0;
    errno = saved;
    return rc;
}

/* sandlock_fork_clones(n, sock, pids, forked, after_child): forks n clones. In clone i it
 * returns i, with fd 1 its pipe's write end and nothing else of the loop's open, after
 * calling after_child if it is not NULL (Python's PyOS_AfterFork_Child: it must run before
 * the clone's first bytecode, as in os.fork(), or a GIL request left by another thread of
 * the init process would stall the clone). In the init process it returns -1 once every
 * clone is forked and reported, with pids[i] set; or -2 with errno set (a pipe, a fork or
 * the report failed) and *forked = how many clones exist. */
int sandlock_fork_clones(int n, int sock, int *pids, int *forked, void (*after_child)(void)) {
    char buf[BATCH * LINE];
    int pending[BATCH];
    size_t len = 0;
    int npending = 0;
    *forked = 0;
    for (int i = 0; i < n; i++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0) {
            /* Out of fds (a low max_open_files): hand the pending read ends over first. */
            if (errno != EMFILE || npending == 0)
                goto failed;
            if (flush(sock, buf, &len, pending, &npending) < 0)
                return -2;
            if (pipe2(p, O_CLOEXEC) < 0)
                goto failed;
        }
        pid_t pid = fork();
        if (pid == 0) {
            /* The clone: its stdout is its pipe; nothing of the loop stays open. fd 1 is
             * normally taken (the init process keeps it open), so neither end is 1. */
            if (p[1] != 1 && dup2(p[1], 1) < 0)
                _exit(71);
            if (p[0] != 1)
                close(p[0]);
            if (p[1] != 1)
                close(p[1]);
            close(sock);
            for (int k = 0; k < npending; k++)
                close(pending[k]);
            if (after_child)
                after_child();
            return i;
        }
        int saved = errno;
        close(p[1]);
        if (pid < 0) {
            close(p[0]);
            errno = saved;
            goto failed;
        }
        pids[i] = pid;
        *forked = i + 1;
        pending[npending++] = p[0];
        len += (size_t)snprintf(buf + len, LINE, "P %d %d\n", i, (int)pid);
        if (npending == BATCH && flush(sock, buf, &len, pending, &npending) < 0)
            return -2;
    }
    if (flush(sock, buf, &len, pending, &npending) < 0)
        return -2;
    return -1;
failed: {
        int saved = errno;
        flush(sock, buf, &len, pending, &npending);
        errno = saved;
        return -2;
    }
}

static int cmp_pid(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* sandlock_reap(n, pids, sock): waits until the n clones have exited, reporting each as
 * "X pid status\n" (children init_fn started are reaped silently). Lines are sent in
 * batches: whatever has exited is reported before the next blocking wait. Sorts pids.
 * Returns 0, or -1 with errno (the wait or the report failed). */
int sandlock_reap(int n, int *pids, int sock) {
    char buf[BATCH * LINE];
    size_t len = 0;
    int left = n, lines = 0;
    qsort(pids, (size_t)n, sizeof(int), cmp_pid);
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, lines ? WNOHANG : 0);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            return -1;
        if (pid > 0 && bsearch(&pid, pids, (size_t)n, sizeof(int), cmp_pid)) {
            len += (size_t)snprintf(buf + len, LINE, "X %d %d\n", (int)pid, status);
            lines++;
            left--;
        }
        if ((pid == 0 || lines == BATCH || left == 0) && lines) {
            if (send_all(sock, buf, len, NULL, 0) < 0)
                return -1;
            len = 0;
            lines = 0;
        }
    }
    return 0;
}
