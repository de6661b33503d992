"""Local worker processes for sweeps and rate searches that never outlive the process that started them.

A worker asks Linux to SIGKILL it when its parent dies (`prctl(PR_SET_PDEATHSIG)`, through ctypes), and
also polls its parent's pid every `PARENT_POLL_S` s (other systems, or a parent thread that exits), so a
SIGKILL of the parent alone (not its process group) leaves no worker behind. Workers ignore SIGINT: on
Ctrl-C (or any error) the parent terminates them and raises, instead of waiting for their runs.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Callable

#: Seconds between a worker's checks that its parent still lives.
PARENT_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1            # linux/prctl.h

_WORKER: tuple[Callable | None, tuple] = (None, ())


def die_with_parent(parent_pid: int) -> None:
    """Make this process end when `parent_pid` (its parent) does: the kernel's parent-death signal where
    there is one, and a thread that polls `os.getppid()`."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):          # no libc prctl: the poller below still works
            pass
    if os.getppid() != parent_pid:                 # the parent died before the signal was set
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="kvsim-parent-watch", daemon=True).start()


def _init_worker(parent_pid: int, fn: Callable, args: tuple) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)
    _WORKER = (fn, args)


def _call(point: Any) -> Any:
    fn, args = _WORKER
    return fn(point, *args)


def run_pool(fn: Callable, items: list, args: tuple, workers: int, on_result: Callable[[Any], None],
             on_started: Callable[[], None] | None = None) -> None:
    """`fn(item, *args)` for each of `items` on `workers` processes (1: here), each result handed to
    `on_result` as it finishes; `fn` and `args` go to each worker once. `on_started` is called once the
    workers exist (a progress bar's thread must not be running when they fork)."""
    if workers <= 1 or len(items) <= 1:
        if on_started is not None:
            on_started()
        for item in items:
            on_result(fn(item, *args))
        return
    from concurrent.futures import as_completed

    pool = _pool(fn, args, min(workers, len(items)))
    try:
        futures = [pool.submit(_call, item) for item in items]
        if on_started is not None:
            on_started()
        for fut in as_completed(futures):
            on_result(fut.result())
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()


def run_fed(fn: Callable, args: tuple, workers: int, take: Callable[[], Any], on_result: Callable[[Any], None]) -> None:
    """`fn(item, *args)` for the items `take()` hands out one at a time (None: none is ready now), at
    most `workers` at once (1: here, in turn), each result handed to `on_result` as it finishes; what
    `on_result` learns may make more items ready, so the next one is taken only when a worker is free.
    Ends once nothing runs and `take()` gives None."""
    if workers <= 1:
        while (item := take()) is not None:
            on_result(fn(item, *args))
        return
    from concurrent.futures import FIRST_COMPLETED, wait

    pool, running = _pool(fn, args, workers), set()
    try:
        while True:
            while len(running) < workers and (item := take()) is not None:
                running.add(pool.submit(_call, item))
            if not running:
                break
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                on_result(fut.result())
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()


def _pool(fn: Callable, args: tuple, workers: int):
    """`workers` processes that each get `fn` and `args` once (`_init_worker`)."""
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(os.getpid(), fn, args))


def _stop(pool) -> None:
    """End `pool`'s processes and return at once (the executor has no public way to stop running work)."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
