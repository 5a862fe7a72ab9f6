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

from paraplan.fleet.jobs import failed_rows, run_job
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


def check_options(backend: str, ray_address: str | None, workers: int | None) -> str:
    """The backend a sweep will use (``auto`` resolved), checked before anything is written.

    Raises:
        SpecError: an unknown backend, ``ray`` without Ray installed, ``--ray-address`` or
            ``--workers`` with the serial backend, or workers out of range.
    """
    if backend not in BACKENDS:
        raise SpecError(f"--backend {backend!r} is not one of {', '.join(BACKENDS)}",
                        field="--backend", value=backend, allowed=list(BACKENDS))
    if backend == "auto":
        backend = "ray" if (ray_available() or ray_address) else "serial"
    if backend == "ray" and not ray_available():
        raise SpecError("the ray backend needs Ray: pip install 'paraplan[fleet]'",
                        field="--backend", value=backend)
    if backend == "serial" and (ray_address or workers is not None):
        field = "--ray-address" if ray_address else "--workers"
        raise SpecError(f"{field} applies to the ray backend, not serial", field=field,
                        value=ray_address or workers)
    if workers is not None and not 1 <= workers <= 100_000:
        raise SpecError(f"--workers {workers} must be in 1..100000", field="--workers",
                        value=workers)
    if ray_address is not None and workers is not None:
        raise SpecError("--workers sizes the Ray started here; with --ray-address the cluster "
                        "has its own", field="--workers", value=workers)
    return backend


def run_sweep(jobs: list[dict[str, Any]], store: ResultStore, *, backend: str = "auto",
              ray_address: str | None = None, workers: int | None = None,
              progress: Progress | None = None) -> SweepSummary:
    """Run every job the store does not hold yet and store each as it finishes.

    Raises:
        SpecError: bad options (:func:`check_options`), or a Ray cluster that cannot be joined.
    """
    backend = check_options(backend, ray_address, workers)
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
        workers = _run_on_ray(todo, finished, ray_address, workers)
    wall = time.perf_counter() - start
    return SweepSummary(jobs=len(jobs), ran=len(todo), skipped=len(jobs) - len(todo),
                        failed=failed, backend=backend, workers=workers, wall_s=wall,
                        jobs_per_s=len(todo) / wall if wall > 0 else 0.0)


def _run_on_ray(todo: list[dict[str, Any]],
                finished: Callable[[str, list[dict[str, Any]], int], None],
                address: str | None, workers: int) -> int:
    """Run ``todo`` on Ray; returns the worker CPUs used. A job whose worker dies is stored
    as a failed row (Ray's error, one line), so a resume does not retry it forever."""
    import logging

    import ray
    from ray.exceptions import RayError

    started = not ray.is_initialized()
    if started:
        if address:
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError, RayError) as exc:
                raise SpecError(f"--ray-address {address!r}: cannot join that Ray cluster "
                                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                                field="--ray-address", value=address) from None
        else:  # in-process on this machine: no dashboard, no cluster to join
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
    try:
        cpus = max(1, int(ray.cluster_resources().get("CPU", workers)))
        remote = ray.remote(num_cpus=1)(run_job)
        # A bounded window of jobs in flight keeps the driver's memory flat on big grids.
        window = max(2, 2 * cpus)
        pending: dict[Any, dict[str, Any]] = {}
        queue = iter(todo)
        count = 0
        while True:
            while len(pending) < window:
                job = next(queue, None)
                if job is None:
                    break
                pending[remote.remote(job)] = job
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                count += 1
                job = pending.pop(ref)
                try:
                    rows = ray.get(ref)
                except RayError as exc:
                    rows = failed_rows(job, f"Ray worker error ({type(exc).__name__}): {exc}")
                finished(job["job_id"], rows, count)
        return cpus
    finally:
        if started:
            ray.shutdown()
