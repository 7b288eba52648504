/* The kernel's own fork rate from the calling process: n children that _exit(0) at once,
 * then reaped. Loaded by bench/worker.py (op fork_floor) into the worker that runs fork():
 * what any COW fork of that process costs before a clone runs a single instruction.
 * Returns the nanoseconds spent, or -1. */
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

long long fork_floor(int n) {
    pid_t *pids = calloc((size_t)n, sizeof(pid_t));
    int made = 0;
    struct timespec a, b;
    if (!pids)
        return -1;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (; made < n; made++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        if (pid < 0)
            break;
        pids[made] = pid;
    }
    for (int i = 0; i < made; i++)  /* only these: the worker may have other children */
        waitpid(pids[i], NULL, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    free(pids);
    if (made < n)
        return -1;
    return (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
}
