/* argv_race MODE N: N times, exec `/bin/echo WORD` while a racer rewrites WORD between
 * "allowed" and "ESCAPED" in a loop. MODE says who races: "thread" (a second thread of the
 * execing process), "clone" (a process sharing its memory, CLONE_VM) or "shm" (a forked
 * process sharing the page through MAP_SHARED). A policy that refuses argv containing
 * "ESCAPED" must never let echo print it. Prints "denied=D" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long long *word;  /* 8 bytes: "allowed\0" or "ESCAPED\0" */

static void flip(void) {
    unsigned long long a, e;
    memcpy(&a, "allowed", 8);
    memcpy(&e, "ESCAPED", 8);
    time_t end = time(NULL) + 3;  /* never outlive the attempt for long */
    for (unsigned long i = 0;; i++) {
        *word = e;
        *word = a;
        if ((i & 0xFFFF) == 0 && time(NULL) > end) _exit(0);
    }
}

static void *thread_main(void *arg) { (void)arg; flip(); return NULL; }
static int clone_main(void *arg) { (void)arg; prctl(PR_SET_PDEATHSIG, SIGKILL); flip(); return 0; }

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    const char *mode = argv[1];
    int n = atoi(argv[2]), denied = 0;
    for (int i = 0; i < n; i++) {
        pid_t c = fork();
        if (c < 0) return 2;
        if (c == 0) {
            word = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                        (strcmp(mode, "shm") == 0 ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS,
                        -1, 0);
            if (word == MAP_FAILED) _exit(2);
            memcpy((void *)word, "allowed", 8);
            if (strcmp(mode, "thread") == 0) {
                pthread_t t;
                if (pthread_create(&t, NULL, thread_main, NULL)) _exit(2);
            } else if (strcmp(mode, "clone") == 0) {
                char *stack = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (stack == MAP_FAILED) _exit(2);
                if (clone(clone_main, stack + (1 << 16), CLONE_VM | SIGCHLD, NULL) < 0) _exit(2);
            } else if (strcmp(mode, "shm") == 0) {
                pid_t r = fork();
                if (r < 0) _exit(2);
                if (r == 0) { prctl(PR_SET_PDEATHSIG, SIGKILL); flip(); }
            } else {
                _exit(2);
            }
            usleep(200);  /* let the racer get going */
            char *args[] = {"/bin/echo", (char *)word, NULL};
            execv("/bin/echo", args);
            _exit(errno == EPERM ? 3 : 4);
        }
        int st;
        if (waitpid(c, &st, 0) < 0) return 2;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 3) denied++;
        else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 5;
    }
    printf("denied=%d\n", denied);
    return 0;
}
