"""Run a sweep's jobs: one after another in this process (``serial``), or on Ray (``ray``):
in-process on this machine's cores by default, or on an existing cluster with
``ray_address`` (``auto`` or ``HOST:PORT``). Workers receive plain dicts of the grid's values
and return plain rows; every finished job is stored at once (``ResultStore.add``), so a
killed sweep resumes where it stopped."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paraplan.fleet.jobs import run_job
from paraplan.fleet.store import ResultStore
from paraplan.specs.errors import SpecError

Progress = Callable[[int, int], None]
"""Called with (jobs done, jobs in all) after each finished job."""
BACKENDS = ("auto", "serial", "ray")


@dataclass
class SweepSummary:
    """What a sweep did (``--format json`` prints it)."""

    jobs: int
    ran: int
    skipped: int
    """Jobs already stored by an earlier, interrupted run (``--resume``)."""
    failed: int
    backend: str
    workers: int
    wall_s: float
    jobs_per_s: float


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def run_sweep(jobs: list[dict[str, Any]], store: ResultStore, *, backend: str = "auto",
              ray_address: str | None = None, workers: int | None = None,
              progress: Progress | None = None) -> SweepSummary:
    """Run every job the store does not hold yet and store each as it finishes.

    Raises:
        SpecError: an unknown backend, or ``ray`` without Ray installed.
    """
    if backend not in BACKENDS:
        raise SpecError(f"--backend {backend!r} is not one of {', '.join(BACKENDS)}",
                        field="--backend", value=backend, allowed=list(BACKENDS))
    if backend == "auto":
        backend = "ray" if (ray_available() or ray_address) else "serial"
    if backend == "ray" and not ray_available():
        raise SpecError("the ray backend needs Ray: pip install 'paraplan[fleet]'",
                        field="--backend", value=backend)
    if workers is not None and not 1 <= workers <= 100_000:
        raise SpecError(f"--workers {workers} must be in 1..100000", field="--workers",
                        value=workers)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    workers = workers or (cores if backend == "ray" else 1)
    done = store.done()
    todo = [job for job in jobs if job["job_id"] not in done]
    failed = 0
    start = time.perf_counter()

    def finished(job_id: str, rows: list[dict[str, Any]], count: int) -> None:
        nonlocal failed
        store.add(job_id, rows)
        failed += any(r.get("status") != "ok" for r in rows)
        if progress:
            progress(len(done) + count, len(jobs))

    if progress:
        progress(len(done), len(jobs))
    if backend == "serial":
        for k, job in enumerate(todo, start=1):
            finished(job["job_id"], run_job(job), k)
    elif todo:  # nothing left to run: no Ray to start
        _run_on_ray(todo, finished, ray_address, workers)
    wall = time.perf_counter() - start
    return SweepSummary(jobs=len(jobs), ran=len(todo), skipped=len(jobs) - len(todo),
                        failed=failed, backend=backend, workers=workers, wall_s=wall,
                        jobs_per_s=len(todo) / wall if wall > 0 else 0.0)


def _run_on_ray(todo: list[dict[str, Any]],
                finished: Callable[[str, list[dict[str, Any]], int], None],
                address: str | None, workers: int) -> None:
    import logging

    import ray

    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        else:  # in-process on this machine: no dashboard, no cluster to join
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
    try:
        remote = ray.remote(num_cpus=1)(run_job)
        # A bounded window of jobs in flight keeps the driver's memory flat on big grids.
        window = max(2, 2 * workers)
        pending: dict[Any, str] = {}
        queue = iter(todo)
        count = 0
        while True:
            while len(pending) < window:
                job = next(queue, None)
                if job is None:
                    break
                pending[remote.remote(job)] = job["job_id"]
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                count += 1
                finished(pending.pop(ref), ray.get(ref), count)
    finally:
        if started:
            ray.shutdown()
