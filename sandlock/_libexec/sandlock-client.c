/*
 * sandlock-client: the `sandlock` command's fast path (installed as .venv/bin/sandlock by
 * `make`; sandlock/service/server.py is the other end).
 *
 * For `sandlock run|net-run|pipe ...` it asks the user's CLI service to run the command
 * (a warm Python process: no interpreter start, no imports), handing it this process's
 * stdin, stdout, stderr and working directory (SCM_RIGHTS) and its environment (the
 * service reads this process's other attributes — limits, nice value, umask, signals... —
 * from the kernel); it relays the signals it receives (those not ignored when it started)
 * and exits with the status the service reports. Everything else, and every case it is unsure of,
 * runs today's Python CLI in this process (exec `python -P -m sandlock ARGS`), so behaviour
 * never depends on which path ran:
 *   - another subcommand, -h/--help, -i/--interactive, or a terminal on fd 0, 1 or 2 (a
 *     terminal's foreground and job control need the program in this session);
 *   - SANDLOCK_SERVICE=0;
 *   - this process under no_new_privs, a seccomp filter, or another restriction the
 *     service would not carry over (see confined());
 *   - a service too busy to take the connection at once (its backlog full);
 *   - no service yet (one is started in the background for the next call) or one that
 *     does not answer within 2 s, refuses this client (service/peer.py), or goes away
 *     before it said "accepted". The command runs only after this client said "go", so a
 *     client that fell back never has it run twice;
 *   - a socket whose listener is not a service of ours: another uid, or a process confined
 *     otherwise than this one (no_new_privs, seccomp, capabilities, namespaces differ) —
 *     what a sandbox allowed to write the socket's directory could put there to collect
 *     the next caller's environment and terminal. Nothing is sent to it, and a service is
 *     started in the background (the real one, if alive, notices its socket is gone and
 *     exits; the new one replaces the impostor's socket).
 * SANDLOCK_PYTHON overrides the interpreter built in (SANDLOCK_PYTHON_DEFAULT);
 * SANDLOCK_SERVICE_DEBUG=1 says on stderr whether the service took the command, or why not.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SANDLOCK_PYTHON_DEFAULT
#define SANDLOCK_PYTHON_DEFAULT "python3"
#endif
#define REPLY_MS 2000
#define MAX_REQUEST (1 << 20)

extern char **environ;

static const char *python(void) {
    const char *p = getenv("SANDLOCK_PYTHON");
    return p != NULL && *p ? p : SANDLOCK_PYTHON_DEFAULT;
}

/* Today's CLI, in this process. */
static void fall_back(int argc, char **argv) {
    const char *py = python();
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (args == NULL)
        _exit(125);
    args[0] = (char *)py;
    args[1] = "-P";  /* never the working directory on the module path */
    args[2] = "-m";
    args[3] = "sandlock";
    for (int i = 1; i < argc; i++)
        args[i + 3] = argv[i];
    execvp(py, args);
    fprintf(stderr, "sandlock: cannot run %s: %s\n", py, strerror(errno));
    _exit(125);
}

static ssize_t read_file(const char *path, char *buf, size_t len);
static int status_field(const char *text, const char *field, char *out, size_t outlen);

/* Under no_new_privs or a seccomp filter (any Landlock sandbox of an unprivileged process,
 * Sandlock's, bubblewrap's): never the service, which runs commands with its own
 * confinement — and never starting one, which would inherit this process's. */
static int confined(void) {
    static char text[8192];
    char v[64];
    if (read_file("/proc/self/status", text, sizeof text) <= 0)
        return 1;
    if (status_field(text, "NoNewPrivs", v, sizeof v) != 0 || strcmp(v, "\t0") != 0
        || status_field(text, "Seccomp", v, sizeof v) != 0 || strcmp(v, "\t0") != 0)
        return 1;
    /* Restrictions the service does not read from the kernel and take on (it takes limits,
     * scheduling, nice, affinity, umask, I/O priority, OOM score, personality, signals):
     * a process holding one runs the CLI in-process, which keeps it. */
    if (prctl(PR_GET_SECUREBITS, 0, 0, 0, 0) != 0)
        return 1;
    long mdwe = prctl(66 /* PR_GET_MDWE */, 0, 0, 0, 0);
    if (mdwe > 0)
        return 1;
    int mode = 0;
    if (syscall(SYS_get_mempolicy, &mode, NULL, 0, NULL, 0) != 0 || mode != 0 /* MPOL_DEFAULT */)
        return 1;
    return 0;
}

static int eligible(int argc, char **argv) {
    const char *off = getenv("SANDLOCK_SERVICE");
    if (off != NULL && strcmp(off, "0") == 0)
        return 0;
    if (argc < 3 || (strcmp(argv[1], "run") && strcmp(argv[1], "net-run")
                     && strcmp(argv[1], "pipe")))
        return 0;
    for (int i = 2; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help") || !strcmp(argv[i], "-i")
            || !strcmp(argv[i], "--interactive"))
            return 0;
    for (int fd = 0; fd < 3; fd++)
        if (isatty(fd) || fcntl(fd, F_GETFD) < 0)
            return 0;
    if (confined()) {
        if (getenv("SANDLOCK_SERVICE_DEBUG") != NULL)
            fprintf(stderr, "sandlock: service: not used: this process is confined "
                            "(no_new_privs, seccomp, securebits, MDWE or a memory "
                            "policy)\n");
        return 0;
    }
    return 1;
}

static char dir[sizeof ((struct sockaddr_un *)0)->sun_path];  /* the service's directory */

static int socket_path(struct sockaddr_un *sa) {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    /* not /tmp/sandlock-UID: registry.py makes that a HOME when there is none */
    int n = xdg != NULL && *xdg
                ? snprintf(dir, sizeof dir, "%s/sandlock", xdg)
                : snprintf(dir, sizeof dir, "/tmp/sandlock-service-%u", geteuid());
    if (n < 0 || (size_t)n >= sizeof dir)
        return -1;
    /* Only a directory of this user's alone: a socket someone else placed is never used. */
    struct stat st;
    if (lstat(dir, &st) == 0 && (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()
                                 || (st.st_mode & 077)))
        return -1;
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    n = snprintf(sa->sun_path, sizeof sa->sun_path, "%s/service.sock", dir);
    return n < 0 || (size_t)n >= sizeof sa->sun_path ? -1 : 0;
}

/* A process's /proc status line `field`, value only; 0 on success. */
static int status_field(const char *text, const char *field, char *out, size_t outlen) {
    size_t fl = strlen(field);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        if (strncmp(p, field, fl) == 0 && p[fl] == ':') {
            const char *v = p + fl + 1, *end = strchr(v, '\n');
            size_t n = end ? (size_t)(end - v) : strlen(v);
            if (n >= outlen)
                return -1;
            memcpy(out, v, n);
            out[n] = 0;
            return 0;
        }
    }
    return -1;
}

static ssize_t read_file(const char *path, char *buf, size_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n >= 0)
        buf[n] = 0;
    return n;
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* Whether process `pid` holds the service's lock: a POSIX write lock (the service takes
 * it with lockf) on service.lock in the service's directory, a regular file of this
 * user's with no other name. F_GETLK names the holder; /proc/locks would too, but its
 * read synchronizes RCU (milliseconds). */
static int holds_lock(pid_t pid) {
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/service.lock", dir);
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    int held = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()
               && st.st_nlink == 1 && fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type == F_WRLCK
               && fl.l_pid == pid;
    close(fd);  /* this process held no lock on it: closing releases nothing of anyone's */
    return held;
}

/* Why the listener at the other end of `sock` is not a service of ours, or NULL: it must
 * be of this uid, confined exactly as this process is (the fields below, and the same
 * namespaces), hold the service's lock, and still be the process that listened (its
 * pidfd, so the pid was not reused). The service checks its clients the same way
 * (service/peer.py). The lock tells the service from a process listening for a sandbox:
 * a supervisor performs a multi-threaded sandbox's listen() itself
 * (supervisor/connect.py), so such a socket's listener is an unconfined process of the
 * user's — one that holds no lock on this directory's file. */
static const char *not_ours(int sock) {
    static const char *const fields[] = {"Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp",
                                         "Seccomp_filters", "CapInh", "CapPrm", "CapEff",
                                         "CapBnd", "CapAmb", "Speculation_Store_Bypass",
                                         "SpeculationIndirectBranch"};
    static const char *const namespaces[] = {"mnt", "pid", "net", "user", "uts", "ipc",
                                             "cgroup", "time", "root"};
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid())
        return "its listener is of another uid";
    int pidfd;
    len = sizeof pidfd;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) != 0)
        return "its listener is gone";
    static char mine[8192], theirs[8192];
    char path[64], a[512], b[512];
    const char *why = NULL;
    snprintf(path, sizeof path, "/proc/%d/status", (int)cred.pid);
    if (read_file("/proc/self/status", mine, sizeof mine) <= 0
        || read_file(path, theirs, sizeof theirs) <= 0)
        why = "its listener's status cannot be read";
    for (size_t i = 0; why == NULL && i < sizeof fields / sizeof *fields; i++) {
        if (status_field(mine, fields[i], a, sizeof a) != 0)
            continue;  /* a field this kernel does not show: the same for both */
        if (status_field(theirs, fields[i], b, sizeof b) != 0 || strcmp(a, b) != 0)
            why = "its listener is confined otherwise than this process";
    }
    for (size_t i = 0; why == NULL && i < sizeof namespaces / sizeof *namespaces; i++) {
        struct stat s1, s2;
        /* "root": the root directory (chroot), a jail as much as a namespace is */
        const char *sub = strcmp(namespaces[i], "root") == 0 ? "" : "ns/";
        snprintf(path, sizeof path, "/proc/self/%s%s", sub, namespaces[i]);
        if (stat(path, &s1) != 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/%s%s", (int)cred.pid, sub, namespaces[i]);
        if (stat(path, &s2) != 0 || s1.st_ino != s2.st_ino || s1.st_dev != s2.st_dev)
            why = "its listener is in other namespaces or another root directory";
    }
    if (why == NULL && !holds_lock(cred.pid))
        why = "its listener does not hold the service's lock";
    if (why == NULL && syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) != 0)
        why = "its listener is gone";
    close(pidfd);
    return why;
}

/* A service for the next call, detached from this one (its own session, no terminal). */
static void start_service(void) {
    pid_t pid = fork();
    if (pid < 0)
        return;
    if (pid == 0) {
        if (setsid() < 0 || fork() != 0)
            _exit(0);
        /* Nothing of this caller's that is not the service's own: no fds beyond 0-2, no
         * blocked or ignored signals (each request takes its client's from the kernel). */
        syscall(SYS_close_range, 3, ~0U, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int sig = 1; sig < NSIG; sig++)
            signal(sig, SIG_DFL);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
        }
        const char *py = python();
        execlp(py, py, "-P", "-m", "sandlock", "service", "run", "--log", (char *)NULL);
        _exit(127);
    }
    waitpid(pid, NULL, 0);
}

struct buf {
    char *p;
    size_t len, cap;
};

static int put(struct buf *b, const void *data, size_t n) {
    if (b->len + n > MAX_REQUEST)
        return -1;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 65536;
        while (cap < b->len + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

static int put_u32(struct buf *b, uint32_t v) { return put(b, &v, 4); }  /* little-endian hosts */

static int put_strings(struct buf *b, char **v, int n) {
    if (put_u32(b, (uint32_t)n))
        return -1;
    for (int i = 0; i < n; i++)
        if (put(b, v[i], strlen(v[i]) + 1))
            return -1;
    return 0;
}

static int request(struct buf *b, int argc, char **argv) {
    int envc = 0;
    while (environ[envc] != NULL)
        envc++;
    return put(b, "SLK1", 4) || put_u32(b, 1) || put_strings(b, argv + 1, argc - 1)
           || put_strings(b, environ, envc);
}

static int send_request(int sock, struct buf *b, int cwd) {
    int fds[4] = {0, 1, 2, cwd};
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov = {b->p, b->len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                        .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)b->len ? 0 : -1;
}

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    unsigned char s = (unsigned char)sig;
    if (write(sig_pipe[1], &s, 1) < 0) {
        /* full: the signal is dropped, as a pending standard signal merges */
    }
    errno = saved;
}

static const int RELAYED[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};

int main(int argc, char **argv) {
    if (!eligible(argc, argv))
        fall_back(argc, argv);
    struct sockaddr_un sa;
    if (socket_path(&sa) != 0)
        fall_back(argc, argv);
    /* Non-blocking: a service whose backlog is full (EAGAIN) is not waited for. */
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock < 0)
        fall_back(argc, argv);
    if (connect(sock, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int err = errno;
        if (err == ENOENT || err == ECONNREFUSED)
            start_service();
        if (err == EAGAIN && getenv("SANDLOCK_SERVICE_DEBUG") != NULL)
            fprintf(stderr, "sandlock: service: not used: it is busy\n");
        fall_back(argc, argv);
    }
    int flags = fcntl(sock, F_GETFL);
    if (flags < 0 || fcntl(sock, F_SETFL, flags & ~O_NONBLOCK) != 0)
        fall_back(argc, argv);
    const char *why = not_ours(sock);
    if (why != NULL) {
        if (getenv("SANDLOCK_SERVICE_DEBUG") != NULL)
            fprintf(stderr, "sandlock: service: not used: %s\n", why);
        close(sock);
        start_service();
        fall_back(argc, argv);
    }
    struct buf b = {0};
    int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0 || request(&b, argc, argv) != 0 || send_request(sock, &b, cwd) != 0)
        fall_back(argc, argv);
    close(cwd);
    free(b.p);
    char reply[512];
    struct pollfd pf = {sock, POLLIN, 0};
    if (poll(&pf, 1, REPLY_MS) != 1)
        fall_back(argc, argv);
    ssize_t n = recv(sock, reply, sizeof reply - 1, 0);
    if (n < 1 || reply[0] != 'A') {
        if (n > 1 && reply[0] == 'F' && getenv("SANDLOCK_SERVICE_DEBUG") != NULL) {
            reply[n] = 0;
            fprintf(stderr, "sandlock: service: %s\n", reply + 1);
        }
        fall_back(argc, argv);
    }
    if (getenv("SANDLOCK_SERVICE_DEBUG") != NULL)
        fprintf(stderr, "sandlock: service: accepted\n");
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        fall_back(argc, argv);
    struct sigaction act = {0};
    act.sa_handler = on_signal;
    sigemptyset(&act.sa_mask);
    for (size_t i = 0; i < sizeof RELAYED / sizeof *RELAYED; i++) {
        struct sigaction old;
        /* One ignored when this started (nohup, a background job) is not relayed: the
         * in-process CLI would not have received it either. */
        if (sigaction(RELAYED[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(RELAYED[i], &act, NULL);
    }
    signal(SIGPIPE, SIG_IGN);
    if (send(sock, "G", 1, MSG_NOSIGNAL) != 1)
        fall_back(argc, argv);  /* it never ran: "go" did not reach it */
    int last_signal = 0, first = 1;
    for (;;) {
        struct pollfd p[2] = {{sock, POLLIN, 0}, {sig_pipe[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents & POLLIN) {
            unsigned char s;
            while (read(sig_pipe[0], &s, 1) == 1) {
                char m[2] = {'S', (char)s};
                last_signal = s;
                send(sock, m, 2, MSG_NOSIGNAL);
            }
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            n = recv(sock, reply, sizeof reply, 0);
            if (first && n >= 1 && reply[0] == 'F') {
                /* "go" came too late, or it could not take this process's state: nothing
                 * ran */
                if (getenv("SANDLOCK_SERVICE_DEBUG") != NULL) {
                    reply[n < (ssize_t)sizeof reply ? n : (ssize_t)sizeof reply - 1] = 0;
                    fprintf(stderr, "sandlock: service: %s\n", reply + 1);
                }
                fall_back(argc, argv);
            }
            first = 0;
            if (n == 5 && reply[0] == 'X') {
                int32_t status;
                memcpy(&status, reply + 1, 4);
                return status & 0xff;
            }
            if (n < 0 && errno == EINTR)
                continue;
            break;
        }
    }
    /* The service's child died before it told a status: killed by a signal we relayed
     * (as the in-process CLI would have been), or by someone else. */
    if (last_signal != 0) {
        signal(last_signal, SIG_DFL);
        raise(last_signal);
    }
    fprintf(stderr, "sandlock: the CLI service ended before it reported the command's "
                    "status\n");
    return 125;
}
