/* Every process arms a 1 ms POSIX timer whose signal is SIGCONT: the root's SIGSTOP holds
 * nobody, so every end_tree round finds fresh children, and a child forked after the final
 * walk (before its parent's SIGKILL) is never killed: the root then blocks in waitpid. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static void on_cont(int s) { (void)s; }
static void arm(void) {
    signal(SIGCONT, on_cont);  /* not ignored: else the kernel parks the timer's signal */
    struct sigevent ev = {0};
    ev.sigev_notify = SIGEV_SIGNAL;
    ev.sigev_signo = SIGCONT;
    timer_t t;
    if (timer_create(CLOCK_MONOTONIC, &ev, &t) < 0) { perror("timer_create"); return; }
    struct itimerspec its = {{0, 1000000}, {0, 1000000}};
    timer_settime(t, 0, &its, NULL);
}
static void worker(void) {
    arm();
    for (;;) {
        pid_t me = getpid();
        pid_t c = fork();
        if (c == 0) {
            arm();
            usleep(50000);
            if (getppid() != me) {           /* my parent was killed: I was missed */
                fprintf(stderr, "SURVIVOR %d\n", getpid());
                for (;;) pause();
            }
            _exit(0);
        }
        while (waitpid(-1, NULL, WNOHANG) > 0) ;
        usleep(2000);
    }
}
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    int ballast = argc > 2 ? atoi(argv[2]) : 0;   /* x 300 idle processes: slow walks */
    for (int b = 0; b < ballast; b++)
        if (fork() == 0) {
            for (int i = 0; i < 300; i++) if (fork() == 0) for (;;) pause();
            for (;;) pause();
        }
    for (int i = 0; i < n; i++)
        if (fork() == 0) worker();
    sleep(1);
    printf("program exiting\n");
    return 0;
}
