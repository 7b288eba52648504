/*
 * sandlock-client: the `sandlock` command's fast path (installed as .venv/bin/sandlock by
 * `make`; sandlock/service/server.py is the other end).
 *
 * For `sandlock run|net-run|pipe ...` it asks the user's CLI service to run the command
 * (a warm Python process: no interpreter start, no imports), handing it this process's
 * stdin, stdout, stderr and working directory (SCM_RIGHTS), its environment, umask, nice
 * value, CPU affinity and resource limits; it relays the signals it receives and exits
 * with the status the service reports. Everything else, and every case it is unsure of,
 * runs today's Python CLI in this process (exec `python -P -m sandlock ARGS`), so behaviour
 * never depends on which path ran:
 *   - another subcommand, -h/--help, -i/--interactive, or a terminal on fd 0, 1 or 2 (a
 *     terminal's foreground and job control need the program in this session);
 *   - SANDLOCK_SERVICE=0;
 *   - no service yet (one is started in the background for the next call) or one that
 *     does not answer within 2 s, refuses this client (service/peer.py), or goes away
 *     before it said "accepted". The command runs only after this client said "go", so a
 *     client that fell back never has it run twice.
 * SANDLOCK_PYTHON overrides the interpreter built in (SANDLOCK_PYTHON_DEFAULT);
 * SANDLOCK_SERVICE_DEBUG=1 says on stderr whether the service took the command, or why not.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
    return 1;
}

static int socket_path(struct sockaddr_un *sa) {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    char dir[sizeof sa->sun_path];
    int n = xdg != NULL && *xdg ? snprintf(dir, sizeof dir, "%s/sandlock", xdg)
                                : snprintf(dir, sizeof dir, "/tmp/sandlock-%u", geteuid());
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

/* A service for the next call, detached from this one (its own session, no terminal). */
static void start_service(void) {
    pid_t pid = fork();
    if (pid < 0)
        return;
    if (pid == 0) {
        if (setsid() < 0 || fork() != 0)
            _exit(0);
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
    mode_t mask = umask(022);
    umask(mask);
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0);
    if (errno != 0)
        return -1;
    if (put(b, "SLK1", 4) || put_u32(b, 1) || put_strings(b, argv + 1, argc - 1)
        || put_strings(b, environ, envc) || put_u32(b, (uint32_t)mask) || put(b, &nice, 4))
        return -1;
    for (int r = 0; r < 16; r++) {
        struct rlimit rl;
        if (getrlimit(r, &rl) != 0)
            return -1;
        uint64_t v[2] = {rl.rlim_cur, rl.rlim_max};
        if (put(b, v, sizeof v))
            return -1;
    }
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) != 0)
        return -1;
    return put_u32(b, sizeof cpus) || put(b, &cpus, sizeof cpus);
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
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0)
        fall_back(argc, argv);
    if (connect(sock, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (errno == ENOENT || errno == ECONNREFUSED)
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
    for (size_t i = 0; i < sizeof RELAYED / sizeof *RELAYED; i++)
        sigaction(RELAYED[i], &act, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (send(sock, "G", 1, MSG_NOSIGNAL) != 1)
        fall_back(argc, argv);  /* it never ran: "go" did not reach it */
    int last_signal = 0;
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
