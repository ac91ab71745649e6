"""No abort at a clean exit: fairseq's prefetch threads are stopped before Python shuts down.

fairseq 0.12 prefetches training batches in a daemon thread (``--data-buffer-size``, default 10:
``data.iterators.BufferedIterator`` starts a ``BackgroundConsumer``). The thread keeps collating
batches into its queue until the queue is full or the epoch ends. When training stops in the
middle of an epoch (``--max-update``, ``--stop-time-hours``, a short test run), the program ends
while the thread may still be inside a torch operation, which runs without Python's GIL. Python
3.11 ends such a daemon thread, when it asks for the GIL back during interpreter shutdown, with
``pthread_exit``; unwinding through torch's C++ frames then calls ``std::terminate``: the process
prints ``terminate called without an active exception`` and aborts (SIGABRT, exit status 134)
after ``done training`` and after every file was written. Under load (1 of 16 one-update runs on
a busy machine) a recipe under ``set -e`` fails on it. A thread that holds a batch's collation
for long enough makes it happen every time (``tests/test_clean_exit.py``).

Importing the package (``--user-dir fairseq_knowgen``) registers :func:`stop_prefetch_threads`
with ``atexit``; exit handlers run before shutdown ends daemon threads. Each live prefetch thread
gets a queue that ends it at its next ``put`` (raising ``SystemExit``, which ends a thread quietly),
its old queue is emptied so that a ``put`` waiting there returns, and it is joined. Nothing changes
while training runs.

A run without ``--user-dir fairseq_knowgen`` (plain ``fairseq-train``) never imports the package,
so this cannot help it: there, ``--data-buffer-size 0`` (batches read in the main thread, the same
batches) avoids the thread.
"""

import atexit
import logging
import queue
import threading
import time

logger = logging.getLogger(__name__)


class _Closed:
    """A queue whose ``put`` ends the thread that calls it."""

    def put(self, item, *args, **kwargs):
        raise SystemExit(0)


def stop_prefetch_threads(timeout: float = 30.0):
    """End every live ``fairseq.data.iterators.BackgroundConsumer`` thread and wait for it (at most
    ``timeout`` seconds in all)."""
    import sys

    iterators = sys.modules.get("fairseq.data.iterators")
    if iterators is None:  # fairseq's data loading never ran
        return
    threads = [t for t in threading.enumerate() if isinstance(t, iterators.BackgroundConsumer) and t.is_alive()]
    for t in threads:
        old, t._queue = t._queue, _Closed()
        _drain(old)
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            logger.warning("a data prefetch thread is still running at exit")


def _drain(q):
    """Empty ``q`` (a ``queue.Queue``), waking a ``put`` that waits on it."""
    if not isinstance(q, queue.Queue):
        return
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


atexit.register(stop_prefetch_threads)
