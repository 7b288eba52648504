/* The kernel's own cost of an overlayfs workspace, without any sandbox: what the overlay
 * backend's trampoline does before its program (a user + mount namespace, the overlay
 * mounted over the workdir, the cwd entered again), and nothing else — no Landlock, no
 * seccomp, no supervisor. Built and run by bench/cow.py as the "overlayfs alone" peer.
 *
 *     overlay_floor LOWER UPPER WORK CMD [ARG]...
 *
 * The whole run is what the kernel costs for it: the namespace's setup, the program's
 * first lookups through a fresh overlay (its inodes and dentries start cold) and the
 * teardown when the last task exits. The backend pays all of it but the teardown, which
 * its supervisor does after the run, off the caller's path (sandlock/_kernel/mount_ns.py).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, "overlay_floor: %s: %s\n", what, strerror(errno));
    exit(125);
}

static void put(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        die(path);
    close(fd);
}

int main(int argc, char **argv) {
    char map[64], opts[4096], cwd[4096];
    if (argc < 5) {
        fprintf(stderr, "usage: overlay_floor LOWER UPPER WORK CMD [ARG]...\n");
        return 2;
    }
    uid_t uid = getuid();
    gid_t gid = getgid();
    if (!getcwd(cwd, sizeof cwd))
        die("getcwd");
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0)
        die("unshare");
    put("/proc/self/setgroups", "deny");
    snprintf(map, sizeof map, "%u %u 1\n", uid, uid);
    put("/proc/self/uid_map", map);
    snprintf(map, sizeof map, "%u %u 1\n", gid, gid);
    put("/proc/self/gid_map", map);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        die("mount --make-rprivate /");
    snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s,userxattr",
             argv[1], argv[2], argv[3]);
    if (mount("overlay", argv[1], "overlay", 0, opts) < 0)
        die("mount overlay");
    if (chdir(cwd) < 0)  /* by path: into the overlay when cwd is beneath LOWER */
        die("chdir");
    execvp(argv[4], argv + 4);
    die(argv[4]);
}
