"""The supervisor's worker threads: where on-behalf calls that may wait run (a blocking
connect or send, a held call a policy_fn judges, a FIFO open).

Threads are started when a job finds none idle and leave after IDLE seconds without work,
so after a burst (or an attack) the process returns to the threads it had before. There is
no shared cap that one sandbox could fill: the loop gives each sandbox a quota of jobs
(loop.MAX_DEFERRED_PER_SANDBOX) and every job ends with its caller (network.Guard), so
the threads alive are bounded by the live sandboxes' quotas. LIMIT only guards memory.

Workers block every process signal except the one that cancels their call
(_kernel.interrupt): an application's signal never interrupts an on-behalf call, and its
handlers keep running in its own threads.
"""

from __future__ import annotations

import queue
import threading

from .._kernel import interrupt

IDLE = 1.0
LIMIT = 4096


class WorkerLimit(Exception):
    """No worker could take the job (LIMIT threads are busy): the caller denies."""


class Workers:
    """`setup` runs first in every new thread (supervisor.confined restricts it there);
    past `limit` threads, jobs wait in the queue when `queue_when_full`, else are refused
    (WorkerLimit)."""

    def __init__(self, name: str = "sandlock-onbehalf", setup=None, limit: int = LIMIT,
                 queue_when_full: bool = False):
        self._name = name
        self._setup = setup
        self._limit = limit
        self._queue_when_full = queue_when_full
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._waiting = 0   # idle threads not yet promised a job
        self._backlog = 0   # queued jobs no thread was promised to (queue_when_full)
        # Invariant: threads blocked in get() == _waiting + promised jobs in the queue, and
        # the queue holds the promised jobs and the backlog: every job has a taker coming.

    def submit(self, fn, *args) -> None:
        with self._lock:
            if self._waiting > 0:
                self._waiting -= 1  # that idle thread will take this job
                self._jobs.put((fn, args))
                return
            if self._threads >= self._limit:
                if self._queue_when_full:
                    self._backlog += 1  # the next thread to finish a job takes it
                    self._jobs.put((fn, args))
                    return
                raise WorkerLimit(f"{self._limit} supervisor workers are busy")
            self._threads += 1
            self._jobs.put((fn, args))
        try:
            threading.Thread(target=self._run, name=self._name, daemon=True).start()
        except BaseException:
            with self._lock:
                self._threads -= 1
            raise

    def _run(self) -> None:
        interrupt.only_interruptible()
        if self._setup is not None:
            self._setup()  # records its own failure (the jobs then refuse)
        while True:
            try:
                fn, args = self._jobs.get(timeout=IDLE)
            except queue.Empty:
                with self._lock:
                    if self._waiting > 0:  # nobody counted on this thread: leave
                        self._waiting -= 1
                        self._threads -= 1
                        return
                continue  # a job was promised to this thread: it is on its way
            try:
                fn(*args)
            except BaseException:  # a job reports its own failures; the thread lives on
                pass
            with self._lock:
                if self._backlog > 0:
                    self._backlog -= 1  # this thread is the backlog job's taker
                else:
                    self._waiting += 1

    @property
    def alive(self) -> int:
        with self._lock:
            return self._threads
