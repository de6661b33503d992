"""Sweep points as Ray tasks: a local Ray instance, or an existing cluster at `ray_address` (the `dist`
extra). The sweep hands over its row function (`kvsim.planning.sweep.runner.run_point`), and the same one runs
in each task, so a sweep gives the same rows on either backend. A worker process that has run a task
ends with its node's raylet (which a local instance ends with the sweep process, SIGKILL included);
Ray's own agent processes are Ray's to end. Imports nothing of the sweep's.
"""

from __future__ import annotations

import os
import socket
from typing import Callable

from kvsim.trace.table import Trace

#: Seconds to wait for a Ray address to accept a TCP connection before calling it unreachable.
CONNECT_TIMEOUT_S = 5.0


#: What to run when Ray is missing.
INSTALL_HINT = "pip install 'kvsim[dist]'"


def check_ray() -> None:
    """ValueError unless Ray can be imported (checked before a sweep writes anything)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ValueError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None


def check_address(address: str) -> None:
    """ValueError unless `address` ("host:port" or "ray://host:port"; "auto" is left to Ray) answers."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"Ray address {address!r} must be host:port (e.g. 127.0.0.1:6379)")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ValueError(f"Ray address {address} does not answer ({exc}); start the cluster with "
                         "`ray start --head` or drop --ray-address to use a local instance") from None


_WATCHING = False


def _in_worker(run_point: Callable[[dict, Trace | None], dict], point: dict, trace: Trace | None) -> dict:
    """One task in a Ray worker process, which from its first task on ends when its parent (the node's
    raylet, which ends with a local instance's driver) does (`kvsim.planning.sweep.pool.die_with_parent`)."""
    global _WATCHING
    if not _WATCHING:
        from kvsim.planning.sweep.pool import die_with_parent
        die_with_parent(os.getppid())
        _WATCHING = True
    return run_point(point, trace)


def run_ray(run_point: Callable[[dict, Trace | None], dict], points: list[dict], trace: Trace | None,
            workers: int | None, address: str | None, on_row: Callable[[dict], None]) -> None:
    """Run `run_point(point, trace)` for each of `points` as Ray tasks and hand each row to `on_row` as it
    finishes."""
    if not points:
        return
    check_ray()
    import ray
    if address:
        check_address(address)
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(_in_worker)
        trace_ref = ray.put(trace) if trace is not None else None
        pending = [task.remote(run_point, p, trace_ref) for p in points]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            on_row(ray.get(ready[0]))
    finally:
        if started:
            ray.shutdown()
