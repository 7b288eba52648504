"""The handlers of the runs in progress (id -> Handler), upstream's registry: an entry
exists from the start of a run_with_handlers until it returns, whatever happens."""

from __future__ import annotations

import itertools
import threading

_HANDLERS: dict[int, object] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def register(handler) -> int:
    with _lock:
        key = next(_ids)
        _HANDLERS[key] = handler
        return key


def release(keys) -> None:
    with _lock:
        for key in keys:
            _HANDLERS.pop(key, None)
