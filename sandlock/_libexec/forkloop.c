/* The COW-fork loop (sandlock/clones.py), in C so that nothing runs in the forking process
 * between two forks: a Python loop writes to its heap after every fork, and each write to
 * a page shared with the clones is a copy-on-write fault (measured: ~2x slower per clone).
 *
 * sandlock_fork_clones(n, pids, forked): forks n children. In child i it returns i (the
 * child then runs work_fn); in the parent it stores each pid in pids[i], sets *forked to
 * how many were created, and returns -1 (errno set if fewer than n).
 */
#include <sys/types.h>
#include <unistd.h>

int sandlock_fork_clones(int n, int *pids, int *forked) {
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0)
            return i;
        if (pid < 0) {
            *forked = i;
            return -1;
        }
        pids[i] = pid;
    }
    *forked = n;
    return -1;
}
