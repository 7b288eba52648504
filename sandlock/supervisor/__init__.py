"""The supervisor: answers seccomp user notifications for every sandbox of this process.

`loop` owns the listener fds and the thread; `request` copies a notification's arguments
out of the child; handler modules (one per concern, e.g. `metadata`) decide and act on
behalf of the child. The dispatch table in `loop` shows which syscalls the supervisor owns.
"""
