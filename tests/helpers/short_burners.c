/* max_cpu: the root samples utime+stime+cutime+cstime of live members every 10 ms. A child
 * that lives < 10 ms and is auto-reaped (parent ignores SIGCHLD: its times go to nobody's
 * cutime) is never accounted. mode 0: one busy process (control); mode 1: short burners. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static long long ns(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
int main(int argc, char **argv) {
    int mode = atoi(argv[1]), par = argc > 2 ? atoi(argv[2]) : 2;
    double secs = 3.0;
    long long w0 = ns(CLOCK_MONOTONIC), total = 0;
    if (mode == 0) {
        while (ns(CLOCK_MONOTONIC) - w0 < secs * 1e9) ;
        total = ns(CLOCK_PROCESS_CPUTIME_ID);
    } else {
        signal(SIGCHLD, SIG_IGN);
        int p[2]; pipe(p);
        int live = 0;
        while (ns(CLOCK_MONOTONIC) - w0 < secs * 1e9) {
            while (live < par) {
                if (fork() == 0) {
                    long long c0 = ns(CLOCK_PROCESS_CPUTIME_ID);
                    while (ns(CLOCK_PROCESS_CPUTIME_ID) - c0 < 4000000) ;  /* 4 ms of CPU */
                    long long used = ns(CLOCK_PROCESS_CPUTIME_ID);
                    write(p[1], &used, sizeof used);
                    _exit(0);
                }
                live++;
            }
            long long u; read(p[0], &u, sizeof u); total += u; live--;
        }
        total += ns(CLOCK_PROCESS_CPUTIME_ID);
    }
    double wall = (ns(CLOCK_MONOTONIC) - w0) / 1e9;
    printf("mode %d: CPU used %.2fs over %.2fs wall = %.0f%% of one core\n", mode, total / 1e9, wall, 100 * total / 1e9 / wall);
    return 0;
}
