"""The supervisor: answers seccomp user notifications for every sandbox of this process.

`loop` owns the listener fds and the thread; `request` copies a notification's arguments
out of the child; handler modules decide and act on behalf of the child: `metadata`
(chmod/chown/utimes/xattr), `connect` (connect, listen), `send` (sendto/sendmsg/sendmmsg),
with `network` holding what the last two share and `netstate` a sandbox's DNS/audit state.
The dispatch table in `loop` shows which syscalls the supervisor owns.
"""
