/*
 * The sandbox's root: the trampoline's first process, which stays outside the sandbox as
 * the parent of the program and the keeper of its process tree.
 *
 * Membership: every process of the sandbox is a descendant of this one. It is a child
 * subreaper, so orphans (a double-forked daemon, a session leader of its own) are handed
 * to it instead of to init; nothing in the sandbox can leave the tree, whatever process
 * group or session it makes (setsid/setpgid are allowed). Pids in the tree cannot be
 * reused before this process reaps them, so no signal it sends reaches a stranger.
 *
 * The end: when the program exits, when the parent asks (SIGTERM), or when the parent
 * dies (PR_SET_PDEATHSIG delivers SIGTERM), every member is stopped (SIGSTOP, repeated
 * until a walk of the tree finds no process it has not stopped: a stopped process cannot
 * fork, and a fork already inside the kernel shows up in the next walk), then killed,
 * then reaped. Then this process ends as the program ended (the same exit code, or the
 * same signal), so the parent sees the program's status.
 *
 * Limits (sandlock/limits.py writes them to fd 8, the control socket, which also carries
 * the reason of an end this process decided): the tree's resident memory is summed every
 * tick and the tree killed past the limit (reason 'M'); its CPU time is held to a share
 * of one core by stopping every member for the rest of each 100 ms window once the share
 * is used (members already stopped by someone else are left as they are).
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
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sandlock-init.h"

#define MAX_MEMBERS 32768
#define MAX_ROUNDS 1000
#define WINDOW_NS 100000000LL /* CPU share window: 100 ms */
#define TICK_NS 10000000LL    /* how often limits are checked: 10 ms */

static pid_t members[MAX_MEMBERS];
static int n_members;
static pid_t stopped[MAX_MEMBERS];  /* stopped by this process (the end, or throttling) */
static int n_stopped;

static int known(const pid_t *set, int n, pid_t pid) {
    for (int i = 0; i < n; i++)
        if (set[i] == pid)
            return 1;
    return 0;
}

/* The children of every thread of `pid`, appended to `members` (no duplicates). */
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
        char buf[8192];
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = 0;
        for (char *p = strtok(buf, " \n"); p; p = strtok(NULL, " \n")) {
            pid_t c = (pid_t)atoi(p);
            if (c > 0 && n_members < MAX_MEMBERS && !known(members, n_members, c))
                members[n_members++] = c;
        }
    }
    closedir(d);
}

/* Every descendant of this process, breadth first. */
static void walk(void) {
    n_members = 0;
    add_children(getpid());
    for (int i = 0; i < n_members; i++)
        add_children(members[i]);
}

/* Stop every member (repeated until a walk finds nobody new), kill them all, reap. */
static void end_tree(void) {
    for (int round = 0; round < MAX_ROUNDS; round++) {
        walk();
        int fresh = 0;
        for (int i = 0; i < n_members; i++) {
            if (!known(stopped, n_stopped, members[i])) {
                kill(members[i], SIGSTOP);
                if (n_stopped < MAX_MEMBERS)
                    stopped[n_stopped++] = members[i];
                fresh = 1;
            }
        }
        if (!fresh)
            break;
    }
    for (int i = 0; i < n_members; i++)
        kill(members[i], SIGKILL);
    for (int i = 0; i < n_stopped; i++)
        kill(stopped[i], SIGKILL);
    while (waitpid(-1, NULL, __WALL) > 0 || errno == EINTR)
        ;
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Field `n` (1-based, after the comm) of /proc/PID/stat, or -1. */
static long long stat_field(pid_t pid, int n) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0)
        return -1;
    buf[len] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p += 2; /* field 3, the state */
    for (int i = 3; i < n && p; i++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? atoll(p) : -1;
}

static char stat_state(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0)
        return 0;
    buf[len] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

/* Resident memory of the tree, in bytes (statm's resident pages of each member). */
static long long tree_rss(void) {
    long long total = 0, page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n_members; i++) {
        char path[64], buf[256];
        snprintf(path, sizeof path, "/proc/%d/statm", members[i]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = 0;
        long long size, resident;
        if (sscanf(buf, "%lld %lld", &size, &resident) == 2)
            total += resident * page;
    }
    return total;
}

/* CPU time (clock ticks) of the live members and of the reaped ones (our children's). */
static long long tree_cpu(void) {
    long long total = 0;
    for (int i = 0; i < n_members; i++) {
        /* utime, stime, and the cutime, cstime of the children it reaped itself */
        for (int f = 14; f <= 17; f++) {
            long long v = stat_field(members[i], f);
            if (v > 0)
                total += v;
        }
    }
    struct rusage ru;
    if (getrusage(RUSAGE_CHILDREN, &ru) == 0) {
        long hz = sysconf(_SC_CLK_TCK);
        total += (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * hz +
                 (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * hz / 1000000;
    }
    return total;
}

static long long memory_limit = -1; /* bytes */
static int cpu_share = -1;          /* percent of one core */
static int throttled;
static pid_t throttled_set[MAX_MEMBERS];
static int n_throttled;

static void throttle(int on) {
    if (on) {
        n_throttled = 0;
        for (int i = 0; i < n_members; i++) {
            if (stat_state(members[i]) == 'T')
                continue; /* stopped by someone else (a shell's job control): theirs */
            if (kill(members[i], SIGSTOP) == 0 && n_throttled < MAX_MEMBERS)
                throttled_set[n_throttled++] = members[i];
        }
    } else {
        for (int i = 0; i < n_throttled; i++)
            kill(throttled_set[i], SIGCONT);
        n_throttled = 0;
    }
    throttled = on;
}

/* A limits line from the control socket: "memory BYTES" or "cpu PERCENT". */
static void control(int fd) {
    char buf[256];
    ssize_t len = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
    if (len <= 0)
        return;
    buf[len] = 0;
    long long value;
    if (sscanf(buf, "memory %lld", &value) == 1)
        memory_limit = value;
    else if (sscanf(buf, "cpu %lld", &value) == 1)
        cpu_share = (int)value;
}

static void say(int fd, char reason) {
    if (fd >= 0)
        send(fd, &reason, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* End as the program ended (a wait status; a bare signal number is "killed by it"). */
static void mirror(int status) {
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
    struct itimerspec tick = {{0, TICK_NS}, {0, TICK_NS}};
    timerfd_settime(tfd, 0, &tick, NULL);
    long long window_start = now_ns(), window_cpu = -1, debt = 0;
    long hz = sysconf(_SC_CLK_TCK);
    int status = 0, program_done = 0;
    for (;;) {
        struct pollfd p[3] = {{sfd, POLLIN, 0}, {tfd, POLLIN, 0}, {ctl, POLLIN, 0}};
        if (poll(p, ctl >= 0 ? 3 : 2, -1) < 0 && errno != EINTR)
            break;
        if (ctl >= 0 && (p[2].revents & POLLIN))
            control(ctl);
        if (p[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == sizeof si) {
                if (si.ssi_signo == SIGTERM) {
                    say(ctl, 'K');
                    end_tree();
                    mirror(SIGKILL); /* as the program died: killed */
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
                mirror(status);
            }
        }
        if (p[1].revents & POLLIN) {
            uint64_t ticks;
            if (read(tfd, &ticks, sizeof ticks) < 0)
                continue;
            if (memory_limit < 0 && cpu_share < 0)
                continue;
            walk();
            if (memory_limit >= 0 && tree_rss() > memory_limit) {
                say(ctl, 'M');
                end_tree();
                mirror(SIGKILL);
            }
            if (cpu_share >= 0) {
                long long t = now_ns();
                long long cpu = tree_cpu();
                long long budget = (long long)cpu_share * WINDOW_NS / 100;
                if (window_cpu < 0 || t - window_start >= WINDOW_NS) {
                    if (window_cpu >= 0) {
                        /* What the window used past its share is owed by the next ones:
                         * over any second the tree stays at its share. */
                        long long used = (cpu - window_cpu) * (1000000000LL / hz);
                        debt = debt + used - budget;
                        if (debt < 0)
                            debt = 0;
                    }
                    if (throttled)
                        throttle(0);
                    window_start = t;
                    window_cpu = cpu;
                }
                if (!throttled) {
                    long long used_ns = (cpu - window_cpu) * (1000000000LL / hz);
                    if (used_ns + debt >= budget)
                        throttle(1);
                }
            }
        }
    }
    end_tree();
    _exit(127);
}
