/* The supervisor's fast path, in C (sandlock/supervisor/fastpath.py): connect(), the
 * looking calls of a copy-on-write workspace that has not changed yet, and forks within a
 * max_processes budget Python lent.
 *
 * The Python supervisor thread waits for notifications by calling sl_fast_wait(), which
 * runs without the GIL. For a listener the Python side has enabled, this code receives the
 * notification itself and answers, without Python, calls of three kinds:
 *
 *  1. CONTINUE for a TCP socket (AF_INET/AF_INET6, SOCK_STREAM) of a single-threaded
 *     process when Landlock decides every TCP destination (the listener's SL_CONTINUE_TCP
 *     flag): exactly what supervisor/connect.py decides in that case.
 *  2. An on-behalf connect to a destination the Python decision code has already allowed
 *     for this listener (sl_fast_learn: socket family, address, port), performed on a
 *     duplicate of the child's socket by a worker thread with no effective capabilities.
 *  3. CONTINUE for a call that only looks at a path (cow_read_only) in a workspace whose
 *     layer holds no change yet (SL_COW_PRISTINE, cleared by Python before the first):
 *     the workspace is then the workdir itself, which Landlock keeps read-only. After a
 *     change, CONTINUE for an fstat of an fd whose file carries no identity of the layer
 *     (cow_fd_stat): the kernel's answer is then the one supervisor/cow_reads.py writes.
 *  4. CONTINUE for clone/fork/vfork under max_processes (SL_FORK_BUDGET), exactly as
 *     supervisor/lifecycle.py would without a policy_fn: a clone whose flags the filter
 *     refuses (syscall_filter.clone_refusal) goes to Python; a thread is continued; a
 *     process-creating call spends one of the tokens Python lent (sl_fast_fork_lend: forks
 *     it already counted as let through, supervisor/forks.py) and is recorded (caller,
 *     time) for Python to take back as forks in flight (sl_fast_fork_take). No token, or
 *     no room to record one: Python's.
 *
 * Everything else (other syscalls, unknown destinations, any failure along the way) is
 * handed to Python with the notification already received. This code never denies and
 * never decides a destination itself: it only replays verdicts Python gave, and Python
 * forgets them (sl_fast_flush) whenever their inputs change (DNS pins, expiry).
 *
 * Invariants, where they are enforced below:
 *  - The address is copied out of the child once (process_vm_readv) and the copy is what
 *    is looked up and connected to.
 *  - The pidfd is checked against the notification (ID_VALID) after it is opened, so the
 *    duplicated socket is the caller's even if its pid number was reused.
 *  - A blocking connect never runs on the waiting thread: workers do it, and a worker's
 *    call is shut down when its caller's notification disappears (the caller died).
 *  - Answers go through the entry's own duplicate of the listener, so a listener closed
 *    and its number reused meanwhile can never receive another filter's answer.
 *  - The wait (wait_events) reports each listener at most once per readiness, so it is
 *    received from once: a receive with nothing pending would block the loop. The epoll
 *    set and the listeners polled directly change together (sl_fast_add/remove).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "fastpath.h"

#if defined(__x86_64__)
#define SL_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SL_ARCH AUDIT_ARCH_AARCH64
#else
#error "unsupported architecture"
#endif

#define SL_CONTINUE_TCP 1u   /* listener flag: Landlock decides every TCP destination */
#define SL_COW_PRISTINE 2u   /* listener flag: its copy-on-write layer has no change yet */
#define SL_FORK_BUDGET 4u    /* listener flag: forks spend tokens Python lent */
#define FORK_RING 64         /* forks let through here that Python has not taken back */
#define MAX_LISTENER_FD 4096
#define CACHE_SLOTS 128      /* allowed destinations remembered per listener */
#define MAX_INFLIGHT 32      /* on-behalf connects per listener (Python: MAX_DEFERRED) */
#define MAX_WORKERS 128
#define QUEUE_LEN 256
#define ORPHAN_CHECK_MS 200
#define WORKER_IDLE_MS 1000  /* an idle worker leaves after this long */
#define MAX_DIRECT 8         /* listeners polled directly (more: the epoll set alone) */

struct dest {
    uint8_t used, family, len;
    uint16_t port;
    uint8_t addr[16];
    int64_t expires_ns;      /* CLOCK_MONOTONIC; INT64_MAX: until flushed */
};

struct entry {
    int own;                 /* our duplicate of the listener: every answer goes here */
    unsigned flags;
    int refs;                /* the table's reference + one per job in flight */
    int inflight;
    int fork_tokens;         /* forks Python counted in advance and lent to this code */
    int n_forked;            /* forked[]'s entries */
    struct { int32_t tid; int64_t at_ns; } forked[FORK_RING];
    struct dest cache[CACHE_SLOTS];
    char cow_lower[PATH_MAX]; /* the workspace's workdir ("" if none): sl_fast_cow_lower */
};

struct job {
    struct entry *e;
    uint64_t id;
    int sock;                /* our duplicate of the child's socket */
    int shut;                /* its caller is gone */
    socklen_t len;
    unsigned char addr[128];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;    /* everything below */
static pthread_cond_t queued = PTHREAD_COND_INITIALIZER;
static struct entry *table[MAX_LISTENER_FD];
static struct job *queue[QUEUE_LEN];
static int q_head, q_count;
static struct job *running[QUEUE_LEN + MAX_WORKERS];        /* jobs handed out, not done */
static int n_running, n_workers, n_idle;
static pid_t owner_pid;
static uint64_t stat_continue, stat_connect, stat_python, stat_cow, stat_fork;

/* The epoll set's members, kept by sl_fast_add/sl_fast_remove (with lock), which change the
 * set and these together, so they never disagree: */
static int direct[MAX_DIRECT];    /* the first members that fit, polled directly */
static int n_direct, n_indirect;  /* how many are in direct[], how many are not */
static int watch_efd = -1;        /* an eventfd the wait polls: the set changed */
static pid_t watch_owner;         /* the process that made watch_efd (lazily, in its wait) */

static struct epoll_event pending_events[16];                        /* the waiting thread's only */
static int ev_pos, ev_count;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void unref(struct entry *e) {  /* with lock held */
    if (--e->refs == 0) {
        close(e->own);
        free(e);
    }
}

/* The interface version fastpath.py expects (a stale build is not used). */
int sl_fast_version(void) {
    return 7;
}

/* Called by each new Supervisor before its thread starts, so with no other caller. In a
 * forked child the parent's table, workers and lock state are not ours: start empty (the
 * inherited fds are the parent's business: close-on-exec). */
void sl_fast_init(void) {
    if (owner_pid == getpid())
        return;
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&queued, NULL);
    for (int fd = 0; fd < MAX_LISTENER_FD; fd++) {
        if (owner_pid != 0 && table[fd] != NULL)
            close(table[fd]->own);  /* inherited duplicates; jobs' sockets went with
                                     * the parent's workers (their memory is leaked) */
        table[fd] = NULL;
    }
    q_head = q_count = n_running = n_workers = n_idle = 0;
    /* An inherited watch_efd is the parent's (its number may have been closed and reused
     * here since): never closed, written or polled; the wait makes this process's own. */
    n_direct = n_indirect = 0;
    ev_pos = ev_count = 0;
    owner_pid = getpid();
}

/* Add `listener` to the epoll set `epfd` (EPOLLIN, data.fd = listener), or remove it: the
 * set and the members the wait polls directly change together, under the lock, in one call
 * (Python cannot be interrupted between the two). 0, or -errno from epoll_ctl, in which
 * case nothing changed. A removal comes before the listener is closed. */
int sl_fast_add(int epfd, int listener) {
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = listener};
    pthread_mutex_lock(&lock);
    int rc = epoll_ctl(epfd, EPOLL_CTL_ADD, listener, &ev) == 0 ? 0 : -errno;
    if (rc == 0) {
        if (n_direct < MAX_DIRECT)
            direct[n_direct++] = listener;
        else
            n_indirect++;
        if (watch_efd >= 0 && watch_owner == getpid()) {
            uint64_t one = 1;
            if (write(watch_efd, &one, sizeof one) < 0) {
                /* the counter is full: the wait is woken already */
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int sl_fast_remove(int epfd, int listener) {
    pthread_mutex_lock(&lock);
    int rc = epoll_ctl(epfd, EPOLL_CTL_DEL, listener, NULL) == 0 ? 0 : -errno;
    if (rc == 0) {
        int i = 0;
        while (i < n_direct && direct[i] != listener)
            i++;
        if (i < n_direct)
            direct[i] = direct[--n_direct];
        else if (n_indirect > 0)
            n_indirect--;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int sl_fast_enable(int listener, unsigned flags) {
    if (listener < 0 || listener >= MAX_LISTENER_FD)
        return -EINVAL;
    struct entry *e = calloc(1, sizeof *e);
    if (e == NULL)
        return -ENOMEM;
    e->own = fcntl(listener, F_DUPFD_CLOEXEC, 0);
    if (e->own < 0) {
        int err = errno;
        free(e);
        return -err;
    }
    e->flags = flags;
    e->refs = 1;
    pthread_mutex_lock(&lock);
    if (table[listener] != NULL)
        unref(table[listener]);
    table[listener] = e;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* The workdir of the listener's copy-on-write workspace (canonical): after the layer's
 * first change, a listing from the start of a directory fd under it goes to Python. */
int sl_fast_cow_lower(int listener, const char *path) {
    if (listener < 0 || listener >= MAX_LISTENER_FD || strlen(path) >= PATH_MAX)
        return -EINVAL;
    pthread_mutex_lock(&lock);
    struct entry *e = table[listener];
    if (e != NULL)
        memcpy(e->cow_lower, path, strlen(path) + 1);
    pthread_mutex_unlock(&lock);
    return e != NULL ? 0 : -ENOENT;
}

/* Called before the listener is closed: its number may be reused at once. */
void sl_fast_disable(int listener) {
    if (listener < 0 || listener >= MAX_LISTENER_FD)
        return;
    pthread_mutex_lock(&lock);
    if (table[listener] != NULL) {
        unref(table[listener]);
        table[listener] = NULL;
    }
    pthread_mutex_unlock(&lock);
}

/* The key of a sockaddr of a socket of `family`; 0 if it is not one we remember. */
static int dest_of(int family, const unsigned char *sa, size_t len, struct dest *d) {
    uint16_t fam;
    if (len < sizeof fam)
        return 0;
    memcpy(&fam, sa, sizeof fam);
    if (fam != family)
        return 0;
    memset(d, 0, sizeof *d);
    d->family = (uint8_t)family;
    if (family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in in;
        memcpy(&in, sa, sizeof in);
        d->port = ntohs(in.sin_port);
        d->len = 4;
        memcpy(d->addr, &in.sin_addr, 4);
        return 1;
    }
    if (family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, sa, sizeof in6);
        if (in6.sin6_scope_id != 0)
            return 0;  /* link-local scopes: Python's business every time */
        d->port = ntohs(in6.sin6_port);
        d->len = 16;
        memcpy(d->addr, &in6.sin6_addr, 16);
        return 1;
    }
    return 0;
}

static int same(const struct dest *a, const struct dest *b) {
    return a->family == b->family && a->len == b->len && a->port == b->port
           && memcmp(a->addr, b->addr, a->len) == 0;
}

/* Remember that Python allowed an on-behalf TCP connect of a `family` socket to the
 * sockaddr `sa` on this listener, until `expires_ns` (CLOCK_MONOTONIC; <0: until flushed). */
int sl_fast_learn(int listener, int family, const unsigned char *sa, size_t len,
                  int64_t expires_ns) {
    struct dest d;
    if (listener < 0 || listener >= MAX_LISTENER_FD || !dest_of(family, sa, len, &d))
        return -EINVAL;
    d.used = 1;
    d.expires_ns = expires_ns < 0 ? INT64_MAX : expires_ns;
    int64_t now = now_ns();
    int rc = -ENOSPC;
    pthread_mutex_lock(&lock);
    struct entry *e = table[listener];
    if (e == NULL) {
        rc = -ENOENT;
    } else {
        int free_slot = -1;
        for (int i = 0; i < CACHE_SLOTS; i++) {
            struct dest *c = &e->cache[i];
            if (c->used && same(c, &d)) {
                free_slot = i;
                break;
            }
            if (free_slot < 0 && (!c->used || c->expires_ns <= now))
                free_slot = i;
        }
        if (free_slot >= 0) {
            e->cache[free_slot] = d;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Forget the verdicts of one listener (-1: of all). */
void sl_fast_flush(int listener) {
    pthread_mutex_lock(&lock);
    for (int fd = 0; fd < MAX_LISTENER_FD; fd++) {
        if (table[fd] != NULL && (listener < 0 || fd == listener))
            memset(table[fd]->cache, 0, sizeof table[fd]->cache);
    }
    pthread_mutex_unlock(&lock);
}

/* Clear `flags` of a listener (SL_COW_PRISTINE before its layer's first change). */
void sl_fast_clear(int listener, unsigned flags) {
    if (listener < 0 || listener >= MAX_LISTENER_FD)
        return;
    pthread_mutex_lock(&lock);
    if (table[listener] != NULL)
        table[listener]->flags &= ~flags;
    pthread_mutex_unlock(&lock);
}

/* Lend `n` fork tokens to a listener's budget (replacing what is left of earlier ones:
 * Python takes those back first). 0, or -ENOENT. */
int sl_fast_fork_lend(int listener, int n) {
    if (listener < 0 || listener >= MAX_LISTENER_FD || n < 0)
        return -EINVAL;
    int rc = -ENOENT;
    pthread_mutex_lock(&lock);
    struct entry *e = table[listener];
    if (e != NULL && (e->flags & SL_FORK_BUDGET)) {
        e->fork_tokens = n > FORK_RING ? FORK_RING : n;
        rc = e->fork_tokens;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Take back a listener's tokens: *unused gets those not spent, tids[]/at_ns[] (room for
 * FORK_RING) the forks let through since the last call. Returns their number. After
 * this no fork is let through here until the next lend. */
int sl_fast_fork_take(int listener, int32_t *tids, int64_t *at_ns, int *unused) {
    *unused = 0;
    if (listener < 0 || listener >= MAX_LISTENER_FD)
        return 0;
    int n = 0;
    pthread_mutex_lock(&lock);
    struct entry *e = table[listener];
    if (e != NULL) {
        *unused = e->fork_tokens;
        e->fork_tokens = 0;
        n = e->n_forked;
        for (int i = 0; i < n; i++) {
            tids[i] = e->forked[i].tid;
            at_ns[i] = e->forked[i].at_ns;
        }
        e->n_forked = 0;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

void sl_fast_stats(uint64_t out[6]) {
    pthread_mutex_lock(&lock);
    out[5] = stat_fork;
    out[0] = stat_continue;
    out[1] = stat_connect;
    out[2] = stat_python;
    out[3] = (uint64_t)n_running;
    out[4] = stat_cow;
    pthread_mutex_unlock(&lock);
}

void count_cow(void) {
    pthread_mutex_lock(&lock);
    stat_cow++;
    pthread_mutex_unlock(&lock);
}

int respond(int listener, uint64_t id, int error, unsigned flags) {
    struct seccomp_notif_resp resp = {.id = id, .val = 0, .error = error, .flags = flags};
    return ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
}

static int id_valid(int listener, uint64_t id) {
    return ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0;
}

/* A worker acts with no effective capabilities, whatever the supervisor holds: the fast
 * path serves only sandboxes that keep none (as supervisor/loop.py's _act_as does). */
static int drop_effective_caps(void) {
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) != 0)
        return -1;
    if (d[0].effective == 0 && d[1].effective == 0)
        return 0;
    d[0].effective = d[1].effective = 0;
    return (int)syscall(SYS_capset, &h, d);
}

static void finish(struct job *j, int error) {
    pthread_mutex_lock(&lock);
    /* Out of running[] and closed, under the lock, before the answer: once answered the
     * id is invalid, and the orphan check must not take the job for an orphan and shut
     * the (now connected) socket down; nor shut down a number reused after this close. */
    close(j->sock);
    for (int i = 0; i < n_running; i++) {
        if (running[i] == j) {
            running[i] = running[--n_running];
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    respond(j->e->own, j->id, error, 0);
    pthread_mutex_lock(&lock);
    j->e->inflight--;
    unref(j->e);
    pthread_mutex_unlock(&lock);
    free(j);
}

static void *worker(void *arg) {
    (void)arg;
    int caps_ok = drop_effective_caps() == 0;
    for (;;) {
        pthread_mutex_lock(&lock);
        n_idle++;
        while (q_count == 0) {
            /* Idle for WORKER_IDLE_MS: leave, so that the process returns to the threads
             * it had before a burst (submit() starts workers again as needed). */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += WORKER_IDLE_MS / 1000;
            until.tv_nsec += (long)(WORKER_IDLE_MS % 1000) * 1000000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            if (pthread_cond_timedwait(&queued, &lock, &until) == ETIMEDOUT && q_count == 0) {
                n_idle--;
                n_workers--;
                pthread_mutex_unlock(&lock);
                return NULL;
            }
        }
        n_idle--;
        struct job *j = queue[q_head];
        q_head = (q_head + 1) % QUEUE_LEN;
        q_count--;
        pthread_mutex_unlock(&lock);
        if (!caps_ok) {
            finish(j, -EPERM);  /* fail closed: never act with the supervisor's privilege */
            continue;
        }
        /* A caller that died while its job was queued: nothing to connect for (a shutdown
         * before the connect would not stop it). */
        pthread_mutex_lock(&lock);
        int gone = j->shut || !id_valid(j->e->own, j->id);
        pthread_mutex_unlock(&lock);
        if (gone) {
            finish(j, -ECONNABORTED);
            continue;
        }
        int rc = connect(j->sock, (struct sockaddr *)j->addr, j->len);
        finish(j, rc == 0 ? 0 : -errno);
    }
    return NULL;
}

/* Queue `j` for a worker, starting one if none is idle. With lock held; 0 or -1. */
static int submit(struct job *j) {
    /* Never queue behind busy workers (other sandboxes' blocked connects): without an
     * idle worker or room for a new one, Python takes the call (its own pool and quotas). */
    if (n_idle <= q_count && n_workers >= MAX_WORKERS)
        return -1;
    if (n_idle <= q_count) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        int rc = pthread_create(&t, &attr, worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            return -1;
        n_workers++;
    }
    queue[(q_head + q_count) % QUEUE_LEN] = j;
    q_count++;
    running[n_running++] = j;
    pthread_cond_signal(&queued);
    return 0;
}

int read_proc(pid_t pid, const char *file, char *buf, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return 0;
}

static pid_t tgid_of(pid_t tid) {
    char buf[1024];
    if (read_proc(tid, "status", buf, sizeof buf) != 0)
        return -1;
    char *p = strstr(buf, "\nTgid:");
    return p != NULL ? (pid_t)atoi(p + 6) : -1;
}

static int num_threads(pid_t pid) {
    char buf[1024];
    if (read_proc(pid, "stat", buf, sizeof buf) != 0)
        return -1;
    char *p = strrchr(buf, ')');  /* the command name may contain anything but ')' last */
    if (p == NULL)
        return -1;
    p += 2;  /* field 3 (state) */
    for (int field = 3; field < 20; field++) {
        p = strchr(p, ' ');
        if (p == NULL)
            return -1;
        p++;
    }
    return atoi(p);  /* field 20: num_threads */
}

/* Our duplicate of the caller's fd `child_fd`, or -1. fd tables belong to the thread
 * group: a pidfd on the process, whose id is read for a thread that is not the leader.
 * Checked with ID_VALID once opened: the caller was alive all along, so neither number
 * can have been reused. */
int dup_child_fd(int listener, const struct seccomp_notif *n, int child_fd) {
    int pidfd = (int)syscall(SYS_pidfd_open, n->pid, 0);
    if (pidfd < 0 && (errno == EINVAL || errno == ENOENT)) {
        pid_t tgid = tgid_of(n->pid);
        if (tgid > 0)
            pidfd = (int)syscall(SYS_pidfd_open, tgid, 0);
    }
    if (pidfd < 0)
        return -1;
    if (!id_valid(listener, n->id)) {
        close(pidfd);
        return -1;
    }
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, child_fd, 0);
    close(pidfd);
    return fd;
}

#define CLONE_NAMESPACES (0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 \
                          | 0x10000000 | 0x20000000 | 0x40000000)
#define CLONE_FILES_ 0x00000400
#define CLONE_THREAD_ 0x00010000

/* clone/fork/vfork under SL_FORK_BUDGET (the kinds 4 above). 1: answered; 0: Python's. */
static int fast_fork(int listener, const struct seccomp_notif *n) {
    int process = 1;
    if (n->data.nr == SYS_clone) {
        uint64_t fl = n->data.args[0];
        /* syscall_filter.clone_refusal (without a policy_fn): Python refuses these. */
        if ((fl & CLONE_NAMESPACES) || (fl & (CLONE_FILES_ | CLONE_THREAD_)) == CLONE_FILES_
            || (fl & (CLONE_FILES_ | CLONE_THREAD_)) == CLONE_THREAD_)
            return 0;
        process = !(fl & CLONE_THREAD_);  /* supervisor/forks.py is_process */
    }
    int ok = 0;
    pthread_mutex_lock(&lock);
    struct entry *e = table[listener];
    if (e != NULL && (e->flags & SL_FORK_BUDGET)) {
        if (!process) {
            ok = 1;
        } else if (e->fork_tokens > 0 && e->n_forked < FORK_RING) {
            e->fork_tokens--;
            e->forked[e->n_forked].tid = (int32_t)n->pid;
            e->forked[e->n_forked].at_ns = now_ns();
            e->n_forked++;
            stat_fork++;
            ok = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    if (ok)
        respond(listener, n->id, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE);  /* ENOENT: died */
    return ok;
}

/* 1: answered here; 0: Python's. */
static int fast(int listener, struct seccomp_notif *n, int caps_dropped) {
    if (n->data.arch == SL_ARCH && (n->data.nr == SYS_clone
#ifdef SYS_fork
                                    || n->data.nr == SYS_fork || n->data.nr == SYS_vfork
#endif
                                    ))
        return fast_fork(listener, n);
    if (n->data.arch == SL_ARCH && n->data.nr != SYS_connect && cow_read_only(n)) {
        char lower[PATH_MAX];
        pthread_mutex_lock(&lock);
        struct entry *e = table[listener];
        int pristine = e != NULL && (e->flags & SL_COW_PRISTINE);
        if (pristine)
            stat_cow++;
        if (e != NULL && !pristine)
            memcpy(lower, e->cow_lower, strlen(e->cow_lower) + 1);
        pthread_mutex_unlock(&lock);
        if (!pristine)
            return e != NULL && (cow_fd_stat(listener, n) || cow_getdents(listener, n, lower));
        respond(listener, n->id, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE);  /* ENOENT: died */
        return 1;
    }
    if (!caps_dropped || n->data.nr != SYS_connect || n->data.arch != SL_ARCH)
        return 0;
    pthread_mutex_lock(&lock);
    struct entry *e = table[listener];
    unsigned flags = e != NULL ? e->flags : 0;
    int has_cache = 0;
    if (e != NULL)
        for (int i = 0; i < CACHE_SLOTS && !has_cache; i++)
            has_cache = e->cache[i].used;
    pthread_mutex_unlock(&lock);
    if (e == NULL || (!(flags & SL_CONTINUE_TCP) && !has_cache))
        return 0;
    int child_fd = (int)n->data.args[0];
    /* Threads are counted before the fd is duplicated: counted after, a second thread
     * could swap the fd for a UDP socket right after our duplicate and exit before the
     * count, and the kernel would connect that socket to the re-read address. A caller
     * found alone stays alone (it is blocked here), and an exited thread has released the
     * fd table before it leaves the count. */
    int single = (flags & SL_CONTINUE_TCP) && num_threads(n->pid) == 1;
    uint32_t len = (uint32_t)n->data.args[2];
    if (child_fd < 0 || len < sizeof(struct sockaddr_in) || len > 128)
        return 0;
    int sock = dup_child_fd(listener, n, child_fd);
    if (sock < 0)
        return 0;
    int domain = 0, type = 0;
    socklen_t ol = sizeof domain;
    if (getsockopt(sock, SOL_SOCKET, SO_DOMAIN, &domain, &ol) != 0
        || (ol = sizeof type, getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &ol)) != 0
        || (domain != AF_INET && domain != AF_INET6) || type != SOCK_STREAM) {
        close(sock);
        return 0;
    }
    if (single) {
        /* Landlock checks the port whatever address the kernel re-reads, and no other
         * thread can swap the fd number for another socket before it does. */
        close(sock);
        respond(listener, n->id, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE);  /* ENOENT: died */
        pthread_mutex_lock(&lock);
        stat_continue++;
        pthread_mutex_unlock(&lock);
        return 1;
    }
    struct job *j = calloc(1, sizeof *j);
    if (j == NULL) {
        close(sock);
        return 0;
    }
    struct iovec local = {j->addr, len}, remote = {(void *)(uintptr_t)n->data.args[1], len};
    struct dest d;
    if (syscall(SYS_process_vm_readv, n->pid, &local, 1, &remote, 1, 0) != (ssize_t)len
        || !dest_of(domain, j->addr, len, &d)) {
        close(sock);
        free(j);
        return 0;
    }
    int64_t now = now_ns();
    int queued_ok = 0;
    pthread_mutex_lock(&lock);
    e = table[listener];
    if (e != NULL && e->inflight < MAX_INFLIGHT) {
        for (int i = 0; i < CACHE_SLOTS; i++) {
            struct dest *c = &e->cache[i];
            if (c->used && c->expires_ns > now && same(c, &d)) {
                j->e = e;
                j->id = n->id;
                j->sock = sock;
                j->len = len;
                e->refs++;
                e->inflight++;
                if (submit(j) == 0) {
                    queued_ok = 1;
                    stat_connect++;
                } else {
                    e->refs--;
                    e->inflight--;
                }
                break;
            }
        }
    }
    if (!queued_ok)
        stat_python++;
    pthread_mutex_unlock(&lock);
    if (!queued_ok) {
        close(sock);
        free(j);
    }
    return queued_ok;
}

/* Shut down the socket of every on-behalf connect whose caller is gone. */
static void abort_orphans(void) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_running; i++) {
        struct job *j = running[i];
        if (!id_valid(j->e->own, j->id)) {  /* at every check: its connect may start later */
            shutdown(j->sock, SHUT_RDWR);
            j->shut = 1;
        }
    }
    pthread_mutex_unlock(&lock);
}

/* Wait up to wait_ms for events of the epoll set `epfd` into pending_events; their number,
 * or -1 with errno. With at most MAX_DIRECT listeners, they are poll(2)ed directly instead
 * of through the set. A poll waiter is woken by the listener's own wake-up, which (with
 * SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP, which the loop sets at attach) runs this thread on
 * the CPU of the task that trapped, as the answer then runs that task on ours; epoll's
 * relay of the same wake-up lets the scheduler pick any CPU. In a VM a wake-up on another
 * CPU costs an IPI and a halt exit: ~45 us per trapped call there, ~7 us on one CPU
 * (measured on this project's 2-CPU VM; a fork under max_processes went from +50 us to
 * none). A listener added meanwhile wakes the poll through watch_efd, and the next
 * wait polls it too. Each listener appears once in the result: one readiness must lead
 * to one RECV at most (a second one would block until that sandbox's next call). */
static int wait_events(int epfd, int wait_ms) {
    struct pollfd p[1 + MAX_DIRECT];
    int n = -1;
    pthread_mutex_lock(&lock);
    if (watch_owner != getpid()) {
        watch_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);  /* -1: the epoll set alone */
        watch_owner = getpid();
    }
    if (n_indirect == 0 && n_direct > 0 && watch_efd >= 0) {
        n = n_direct;
        for (int i = 0; i < n; i++)
            p[1 + i] = (struct pollfd){direct[i], POLLIN, 0};
    }
    pthread_mutex_unlock(&lock);
    if (n < 0)
        return epoll_wait(epfd, pending_events, 16, wait_ms);
    p[0] = (struct pollfd){watch_efd, POLLIN, 0};
    int r = poll(p, 1 + n, wait_ms);
    if (r <= 0)
        return r;
    if (p[0].revents & POLLIN) {
        uint64_t count;
        if (read(watch_efd, &count, sizeof count) < 0) {
            /* drained by nobody else: EAGAIN cannot happen after POLLIN */
        }
    }
    int k = 0;
    for (int i = 1; i <= n; i++) {
        if (p[i].revents & POLLNVAL)  /* cannot happen (removed before closed): the set */
            return epoll_wait(epfd, pending_events, 16, 0);
        /* POLLIN/HUP/ERR have epoll's values. */
        if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) {
            pending_events[k].events = p[i].revents & (POLLIN | POLLHUP | POLLERR);
            pending_events[k].data.fd = p[i].fd;
            k++;
        }
    }
    return k;
}

/* Wait on `epfd` (the supervisor's epoll set of listeners) for up to timeout_ms (-1: no
 * limit). Returns the fd of an event for Python with *events set; *received is 1 if the
 * notification was received into `out` (Python must answer it). Returns -ETIMEDOUT when
 * the time ran out, -errno on an epoll error. */
int sl_fast_wait(int epfd, int timeout_ms, struct seccomp_notif *out, uint32_t *events,
                 int *received) {
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_ns() + (int64_t)timeout_ms * 1000000;
    /* What this thread does for the sandboxes served here (they keep no capabilities) it
     * does with none: duplicating fds, reading memory and /proc. Python re-applies its own
     * per-sandbox set after every return (loop.py). If the drop fails, Python does all. */
    int caps_dropped = drop_effective_caps() == 0;
    for (;;) {
        while (ev_pos < ev_count) {
            struct epoll_event ev = pending_events[ev_pos++];
            int fd = ev.data.fd;
            *events = ev.events;
            *received = 0;
            pthread_mutex_lock(&lock);
            int ours = fd >= 0 && fd < MAX_LISTENER_FD && table[fd] != NULL;
            pthread_mutex_unlock(&lock);
            if (!ours || !(ev.events & EPOLLIN))
                return fd;
            memset(out, 0, sizeof *out);
            if (ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, out) != 0) {
                if (ev.events & (EPOLLHUP | EPOLLERR)) {
                    *events = ev.events & ~(uint32_t)EPOLLIN;
                    return fd;
                }
                continue;  /* the task died between the wait and the receive */
            }
            if (fast(fd, out, caps_dropped))
                continue;
            *received = 1;
            return fd;
        }
        int64_t left = deadline - now_ns();
        if (left <= 0)
            return -ETIMEDOUT;
        pthread_mutex_lock(&lock);
        int busy = n_running > 0;
        pthread_mutex_unlock(&lock);
        int wait_ms = deadline == INT64_MAX ? -1 : (int)((left + 999999) / 1000000);
        if (busy && (wait_ms < 0 || wait_ms > ORPHAN_CHECK_MS))
            wait_ms = ORPHAN_CHECK_MS;
        ev_pos = 0;
        ev_count = wait_events(epfd, wait_ms);
        if (ev_count < 0) {
            int err = errno;
            ev_count = 0;
            if (err != EINTR)
                return -err;
        }
        if (busy)
            abort_orphans();
    }
}
