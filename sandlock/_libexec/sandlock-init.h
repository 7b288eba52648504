/* The sandbox's root process (sandlock-init.c): waits for `program`, keeps the tree, ends
 * it, applies the limits read from the control socket `ctl` (-1: none); never returns. */
#include <sys/types.h>
void run_init(pid_t program, int ctl);
