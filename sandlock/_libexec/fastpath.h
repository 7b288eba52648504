/* Shared between fastconnect.c and fastcow.c (one library); not exported. */
#ifndef SANDLOCK_FASTPATH_H
#define SANDLOCK_FASTPATH_H

#include <linux/seccomp.h>
#include <stdint.h>
#include <sys/types.h>

#define HIDDEN __attribute__((visibility("hidden")))

/* fastconnect.c */
HIDDEN int respond(int listener, uint64_t id, int error, unsigned flags);
HIDDEN int read_proc(pid_t pid, const char *file, char *buf, size_t size);
HIDDEN int dup_child_fd(int listener, const struct seccomp_notif *n, int child_fd);
HIDDEN void count_cow(void);

/* fastcow.c */
HIDDEN int cow_read_only(const struct seccomp_notif *n);
HIDDEN int cow_fd_stat(int listener, const struct seccomp_notif *n);
HIDDEN int cow_getdents(int listener, const struct seccomp_notif *n, const char *lower);

#endif
