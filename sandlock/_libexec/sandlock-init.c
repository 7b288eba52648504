/*
 * The sandbox's root: the trampoline's first process, which stays outside the sandbox as
 * the parent of the program and the keeper of its process tree.
 *
 * Membership: every process of the sandbox is a descendant of this one. It is a child
 * subreaper, so orphans (a double-forked daemon, a session leader of its own) are handed
 * to it instead of to init; nothing in the sandbox can leave the tree, whatever process
 * group or session it makes (setsid/setpgid are allowed). The tree is walked through
 * /proc/PID/task/TID/children, read to its end. A process inside may reap its own
 * children, so a pid seen in a walk can be free and reused by a stranger before it is
 * signalled: every signal goes through a pidfd opened first and checked, by its parent
 * links, to be in the tree still (signal_member).
 *
 * The end: when the program exits, when the parent asks (SIGTERM), or when the parent
 * dies (PR_SET_PDEATHSIG delivers SIGTERM), every member found by a walk is killed, and
 * the walk repeated until it finds nobody: a process with SIGKILL pending cannot fork
 * (copy_process refuses), a fork already inside the kernel shows up in the next walk, and
 * the children of a killed process are handed to this one and killed in turn. Then this
 * process ends as the program ended (the same exit code, or the same signal), so the
 * parent sees the program's status.
 *
 * Limits (sandlock/limits.py writes them to fd 8, the control socket, which also carries
 * the reason of an end this process decided): the tree's memory (the proportional share
 * of each member's resident pages, and every 100 ms the pages of the memfds its members
 * hold) is summed every tick and the tree killed past the limit (reason 'M'); its CPU
 * time is held to a share of one core by stopping every member for the rest of each
 * 100 ms window once the share is used (members already stopped by someone else are left
 * as they are). CPU time is the larger of what the kernel accounted to the live members
 * (and to the children they reaped) and what sampling sees running at each tick: a child
 * that lives less than a tick and is reaped by nobody is counted by the sampling.
 *
 * This process is outside the sandbox's Landlock domain, so with Landlock's signal scope
 * (ABI 6) no sandboxed process can signal it, and the seccomp filter refuses ptrace.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sandlock-init.h"

#define MAX_MEMBERS 32768
#define HASH_SLOTS 65536      /* twice MAX_MEMBERS */
#define MAX_ROUNDS 2000
#define WINDOW_NS 100000000LL /* CPU share window: 100 ms */
#define TICK_NS 10000000LL    /* how often limits are checked: 10 ms */

/* A set of pids, emptied by bumping its generation (open addressing, load <= 1/2). A slot
 * is taken when its generation is the current one; generation 0 is never current, so a
 * zeroed set (current == 0 until the first clear) is empty. */
struct pidset {
    pid_t pid[HASH_SLOTS];
    unsigned gen[HASH_SLOTS];
    unsigned current;
};

static void pidset_clear(struct pidset *s) {
    if (++s->current == 0) {
        memset(s->gen, 0, sizeof s->gen);
        s->current = 1;
    }
}

/* Insert `pid`; 1 if it was already there. */
static int pidset_put(struct pidset *s, pid_t pid) {
    if (s->current == 0)
        pidset_clear(s);
    unsigned h = ((unsigned)pid * 2654435761u) % HASH_SLOTS;
    while (s->gen[h] == s->current) {
        if (s->pid[h] == pid)
            return 1;
        h = (h + 1) % HASH_SLOTS;
    }
    s->gen[h] = s->current;
    s->pid[h] = pid;
    return 0;
}

static int pidset_has(const struct pidset *s, pid_t pid) {
    if (s->current == 0)
        return 0;
    unsigned h = ((unsigned)pid * 2654435761u) % HASH_SLOTS;
    while (s->gen[h] == s->current) {
        if (s->pid[h] == pid)
            return 1;
        h = (h + 1) % HASH_SLOTS;
    }
    return 0;
}

static pid_t members[MAX_MEMBERS];
static int n_members;
static struct pidset member_set;

/* Add `pid` to this walk's members once. */
static void add_member(pid_t pid) {
    if (n_members >= MAX_MEMBERS || pidset_has(&member_set, pid))
        return;
    pidset_put(&member_set, pid);
    members[n_members++] = pid;
}

/* The children of every thread of `pid`, read to the end of each list. */
static void add_children(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d)
        return; /* gone: its children were handed to us */
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char cpath[320];
        snprintf(cpath, sizeof cpath, "/proc/%d/task/%s/children", pid, e->d_name);
        int fd = open(cpath, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        char buf[4096];
        ssize_t len;
        long value = -1;
        while ((len = read(fd, buf, sizeof buf)) > 0) { /* one page a read at most */
            for (ssize_t i = 0; i < len; i++) {
                if (buf[i] >= '0' && buf[i] <= '9') {
                    value = (value < 0 ? 0 : value * 10) + (buf[i] - '0');
                } else if (value >= 0) {
                    add_member((pid_t)value);
                    value = -1;
                }
            }
        }
        if (value >= 0)
            add_member((pid_t)value);
        close(fd);
    }
    closedir(d);
}

/* Every descendant of this process, breadth first. */
static void walk(void) {
    n_members = 0;
    pidset_clear(&member_set);
    add_children(getpid());
    for (int i = 0; i < n_members; i++)
        add_children(members[i]);
}

static pid_t parent_of(pid_t pid);

/* A pidfd on `pid` if it is (still) in the tree, else -1: opened first, then checked, so
 * it can only name the process that was checked (or one gone since, harmlessly). */
static int member_pidfd(pid_t pid) {
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0)
        return -1;
    pid_t self = getpid(), p = pid;
    for (int depth = 0; depth < 4096; depth++) {
        p = parent_of(p);
        if (p == self)
            return pfd;
        if (p <= 1)
            break;
    }
    close(pfd);
    return -1;
}

static void signal_member(pid_t pid, int sig) {
    int pfd = member_pidfd(pid);
    if (pfd >= 0) {
        syscall(SYS_pidfd_send_signal, pfd, sig, NULL, 0);
        close(pfd);
    }
}

static void reap_some(void) {
    while (waitpid(-1, NULL, WNOHANG | __WALL) > 0)
        ;
}

/* Kill every member, and again, until a walk finds nobody. */
static void end_tree(void) {
    struct timespec pause = {0, 1000000}; /* 1 ms for the kills to land */
    for (int round = 0; round < MAX_ROUNDS; round++) {
        reap_some();
        walk();
        if (n_members == 0)
            return;
        for (int i = 0; i < n_members; i++)
            signal_member(members[i], SIGKILL);
        nanosleep(&pause, NULL);
    }
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The start of /proc/PID/FILE in `buf` (NUL-terminated), or 0 if it cannot be read. */
static int read_proc(pid_t pid, const char *file, char *buf, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, buf, size - 1);
    close(fd);
    if (len <= 0)
        return 0;
    buf[len] = 0;
    return 1;
}

/* /proc/PID/stat's fields after the comm (field 3, the state, first), or NULL. */
static char *stat_rest(pid_t pid, char *buf, size_t size) {
    if (!read_proc(pid, "stat", buf, size))
        return NULL;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p + 2 : NULL;
}

/* Field `n` (3 = the state) of a stat_rest() string. */
static long long field(const char *rest, int n) {
    const char *p = rest;
    for (int i = 3; i < n && p; i++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? atoll(p) : -1;
}

static pid_t parent_of(pid_t pid) {
    char buf[1024];
    char *rest = stat_rest(pid, buf, sizeof buf);
    return rest ? (pid_t)field(rest, 4) : -1;
}

/* The tree's memory in bytes: resident pages from each member's statm (cheap), and only
 * when that sum is past `limit`, the proportional share from smaps_rollup (Pss: a page
 * several members share is counted once in all; it walks the page tables, so it is read
 * only when it can make a difference, RSS being an upper bound of it). */
static long long tree_memory(long long limit) {
    static long page;
    if (!page)
        page = sysconf(_SC_PAGESIZE);
    long long total = 0;
    char buf[2048];
    for (int i = 0; i < n_members; i++) {
        char *p = read_proc(members[i], "statm", buf, sizeof buf) ? strchr(buf, ' ') : NULL;
        if (p)
            total += atoll(p + 1) * page;
    }
    if (total <= limit)
        return total;
    total = 0;
    for (int i = 0; i < n_members; i++) {
        char *p = read_proc(members[i], "smaps_rollup", buf, sizeof buf) ?
            strstr(buf, "\nPss:") : NULL;
        if (p)
            total += atoll(p + 5) * 1024;
    }
    return total;
}

/* Pages held in memfds the members have open (written, not necessarily mapped: no RSS
 * shows them), each memfd counted once. */
static long long tree_memfds(void) {
    static unsigned long long inodes[4096];
    int n_inodes = 0;
    long long total = 0;
    for (int i = 0; i < n_members; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd", members[i]);
        DIR *d = opendir(path);
        if (!d)
            continue;
        struct dirent *e;
        int budget = 4096;
        while ((e = readdir(d)) && budget-- > 0) {
            if (e->d_name[0] == '.')
                continue;
            char link[320], target[64];
            snprintf(link, sizeof link, "/proc/%d/fd/%s", members[i], e->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n < 7 || strncmp(target, "/memfd:", 7) != 0)
                continue;
            struct stat st;
            if (stat(link, &st) < 0)
                continue;
            int seen = 0;
            for (int k = 0; k < n_inodes; k++)
                if (inodes[k] == (unsigned long long)st.st_ino)
                    seen = 1;
            if (seen)
                continue;
            if (n_inodes < 4096)
                inodes[n_inodes++] = (unsigned long long)st.st_ino;
            total += (long long)st.st_blocks * 512;
        }
        closedir(d);
    }
    return total;
}

/* CPU accounting across ticks: each member's utime+stime as last seen, and what members
 * that left the tree had used by then (`departed`). A member seen for the first time
 * while running is charged a whole tick as well: a process that lives less than a tick,
 * reaped by nobody, leaves no other trace. */
static pid_t seen_pid[MAX_MEMBERS];
static long long seen_cpu[MAX_MEMBERS];
static int n_seen;
static struct pidset seen_set;
static long long departed;

/* Clock ticks of CPU the tree has used so far; `fresh_running` gets how many members are
 * running now that were not members at the previous call. */
static long long tree_cpu(int *fresh_running) {
    static long long now_cpu[MAX_MEMBERS];
    long long total = 0;
    *fresh_running = 0;
    for (int i = 0; i < n_members; i++) {
        char buf[1024];
        char *rest = stat_rest(members[i], buf, sizeof buf);
        long long cpu = 0;
        if (rest) {
            cpu = field(rest, 14) + field(rest, 15);
            if (rest[0] == 'R' && !pidset_has(&seen_set, members[i]))
                (*fresh_running)++;
        }
        now_cpu[i] = cpu;
        total += cpu;
    }
    /* members gone since the last call: what they had used stays used */
    for (int i = 0; i < n_seen; i++)
        if (!pidset_has(&member_set, seen_pid[i]))
            departed += seen_cpu[i];
    pidset_clear(&seen_set);
    for (int i = 0; i < n_members; i++) {
        seen_pid[i] = members[i];
        seen_cpu[i] = now_cpu[i];
        pidset_put(&seen_set, members[i]);
    }
    n_seen = n_members;
    return total + departed;
}

static long long memory_limit = -1; /* bytes */
static int cpu_share = -1;          /* percent of one core */
static int throttled;
static int throttled_fds[MAX_MEMBERS]; /* pidfds: SIGCONT reaches exactly those stopped */
static int n_throttled;

static void throttle(int on) {
    if (on) {
        n_throttled = 0;
        for (int i = 0; i < n_members; i++) {
            char buf[1024];
            char *rest = stat_rest(members[i], buf, sizeof buf);
            if (!rest || rest[0] == 'T' || rest[0] == 't')
                continue; /* stopped by someone else (a shell's job control): theirs */
            int pfd = member_pidfd(members[i]);
            if (pfd < 0)
                continue;
            if (syscall(SYS_pidfd_send_signal, pfd, SIGSTOP, NULL, 0) == 0 &&
                n_throttled < MAX_MEMBERS)
                throttled_fds[n_throttled++] = pfd;
            else
                close(pfd);
        }
    } else {
        for (int i = 0; i < n_throttled; i++) {
            syscall(SYS_pidfd_send_signal, throttled_fds[i], SIGCONT, NULL, 0);
            close(throttled_fds[i]);
        }
        n_throttled = 0;
    }
    throttled = on;
}

/* A limits line from the control socket: "memory BYTES" or "cpu PERCENT". 0 once the
 * other end has closed it (it would otherwise stay readable: poll must stop watching). */
static int control(int fd) {
    char buf[256];
    ssize_t len = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
    if (len == 0 || (len < 0 && errno != EAGAIN && errno != EINTR))
        return 0;
    if (len < 0)
        return 1;
    buf[len] = 0;
    long long value;
    if (sscanf(buf, "memory %lld", &value) == 1)
        memory_limit = value;
    else if (sscanf(buf, "cpu %lld", &value) == 1)
        cpu_share = (int)value;
    return 1;
}

static void say(int fd, char reason) {
    if (fd >= 0)
        send(fd, &reason, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* End as the program ended (a wait status; a bare signal number is "killed by it"),
 * first telling it on the control socket ("W" + int32): a parent that ignores SIGCHLD
 * (a caller's disposition, inherited) has the kernel reap this process, status unseen. */
static void mirror(int ctl, int status) {
    if (ctl >= 0) {
        char rec[5] = {'W'};
        int32_t st = status;
        memcpy(rec + 1, &st, sizeof st);
        send(ctl, rec, sizeof rec, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        kill(getpid(), sig);
        _exit(128 + sig);
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 127);
}

void run_init(pid_t program, int ctl) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (sfd < 0 || tfd < 0) {
        end_tree();
        _exit(127);
    }
    /* Armed by the first limit (control): a tree without limits is never woken for
     * them, nor one started ahead of its call (launch.Parked: its limits come with it). */
    struct itimerspec tick = {{0, TICK_NS}, {0, TICK_NS}};
    int armed = 0;
    long long window_start = now_ns(), window_cpu = -1, debt = 0, window_sampled = 0;
    long long memfd_bytes = 0;
    unsigned tick_count = 0;
    long hz = sysconf(_SC_CLK_TCK);
    int status = 0, program_done = 0;
    for (;;) {
        struct pollfd p[3] = {{sfd, POLLIN, 0}, {tfd, POLLIN, 0}, {ctl, POLLIN, 0}};
        if (poll(p, ctl >= 0 ? 3 : 2, -1) < 0 && errno != EINTR)
            break;
        if (ctl >= 0 && (p[2].revents & (POLLIN | POLLHUP | POLLERR)) && !control(ctl)) {
            close(ctl); /* the reason of an end can no longer be told: nobody listens */
            ctl = -1;
        }
        if (!armed && (memory_limit >= 0 || cpu_share >= 0)) {
            timerfd_settime(tfd, 0, &tick, NULL);
            armed = 1;
        }
        if (p[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == sizeof si) {
                if (si.ssi_signo == SIGTERM) {
                    say(ctl, 'K');
                    end_tree();
                    mirror(ctl, SIGKILL); /* as the program died: killed */
                }
            }
            pid_t pid;
            int st;
            while ((pid = waitpid(-1, &st, WNOHANG | __WALL)) > 0) {
                if (pid == program) {
                    status = st;
                    program_done = 1;
                }
            }
            if (program_done) {
                end_tree();
                mirror(ctl, status);
            }
        }
        if (p[1].revents & POLLIN) {
            uint64_t ticks;
            if (read(tfd, &ticks, sizeof ticks) < 0)
                continue;
            if (memory_limit < 0 && cpu_share < 0)
                continue;
            walk();
            if (memory_limit >= 0) {
                if (tick_count++ % 10 == 0)
                    memfd_bytes = tree_memfds();
                if (memfd_bytes + tree_memory(memory_limit - memfd_bytes) > memory_limit) {
                    say(ctl, 'M');
                    end_tree();
                    mirror(ctl, SIGKILL);
                }
            }
            if (cpu_share >= 0) {
                long long t = now_ns();
                int running;
                long long cpu = tree_cpu(&running);
                long long budget = (long long)cpu_share * WINDOW_NS / 100;
                long long ns_per_tick = 1000000000LL / hz;
                if (window_cpu < 0 || t - window_start >= WINDOW_NS) {
                    if (window_cpu >= 0) {
                        /* What the window used past its share is owed by the next ones:
                         * over any second the tree stays at its share. */
                        long long used = (cpu - window_cpu) * ns_per_tick + window_sampled;
                        debt = debt + used - budget;
                        if (debt < 0)
                            debt = 0;
                    }
                    if (throttled)
                        throttle(0);
                    window_start = t;
                    window_cpu = cpu;
                    window_sampled = 0;
                }
                window_sampled += (long long)running * TICK_NS;
                if (!throttled) {
                    long long used_ns = (cpu - window_cpu) * ns_per_tick + window_sampled;
                    if (used_ns + debt >= budget)
                        throttle(1);
                }
            }
        }
    }
    end_tree();
    _exit(127);
}
