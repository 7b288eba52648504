/* thread_own_files: try to start a thread (CLONE_THREAD) with an fd table of its own (no
 * CLONE_FILES); prints "refused ERRNO" or "started". A sandbox refuses it: the supervisor
 * reads and duplicates a process's fds as the caller's. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static int thread_main(void *arg) {
    (void)arg;
    for (;;)
        pause();
}

int main(void) {
    char *stack = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack == MAP_FAILED)
        return 2;
    int flags = CLONE_VM | CLONE_FS | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
    if (clone(thread_main, stack + (1 << 16), flags, NULL) < 0) {
        printf("refused %d\n", errno);
        return 0;
    }
    printf("started\n");
    fflush(stdout);
    _exit(0);
}
