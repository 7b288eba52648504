import sys

from .cli import main


def _leave(status) -> None:
    """Exit as sys.exit(status) would, without the interpreter's teardown (freeing every
    module and object: ~10 ms of a ~100 ms in-process CLI call). What a normal exit does
    that anyone can observe is done first: the atexit handlers (the supervisor's kill-all,
    weakref finalizers such as the private /tmp's removal) and the flush of buffered
    output. A non-daemon thread still running, a status that is not an int, or output that
    cannot be flushed take the normal exit, which handles each as Python always has."""
    import os
    import threading
    if not isinstance(status, int) or any(
            not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(status)
    import atexit
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # AttributeError: no sys.stdout (None)
        sys.exit(status)
    os._exit(status & 0xFF)


if sys.argv[1:2] in (["run"], ["net-run"], ["pipe"]):  # the CLI's one-shot commands (the
    from . import root_only                           # service, mcp-wrap: long-lived)
    root_only.one_shot()
_leave(main())
