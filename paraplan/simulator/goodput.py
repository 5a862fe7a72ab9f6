"""Goodput under failures: checkpoint/restart with exponentially distributed interruptions.

A job on N GPUs is interrupted by the first GPU failure or spot preemption; with per-GPU mean
time between failures ``mtbf_h`` (hours) and a per-GPU preemption rate ``preempt_per_h``
(interruptions per GPU-hour), interruptions arrive at rate
``lambda = N / mtbf_h + N * preempt_per_h`` per hour, so the job's mean time between
interruptions is ``M = 1 / lambda``.

The job checkpoints every ``tau`` seconds of work, a checkpoint takes ``delta`` seconds
(training paused), and an interruption costs a restart of ``R`` seconds plus the work since
the last checkpoint. Daly (2006), "A higher order estimate of the optimum checkpoint interval
for restart dumps", Future Generation Computer Systems 22(3), eq. 20 and 37:

- expected wall time per ``tau`` of work: ``M * exp(R / M) * (exp((tau + delta) / M) - 1)``,
  so goodput (useful fraction of wall-clock time) is ``tau / that``;
- optimal interval: ``tau = sqrt(2 delta M) * (1 + sqrt(delta / (2M)) / 3 + delta / (18 M))
  - delta`` for ``delta < 2M``, else ``tau = M``;
- Young (1974) first-order interval ``sqrt(2 delta M)`` is reported for comparison.

Times are seconds unless the name says hours.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from paraplan.specs.errors import SpecError


@dataclass(frozen=True)
class Goodput:
    """Goodput of a job at its optimal checkpoint interval (and at a given one, if asked)."""

    num_gpus: int
    job_mtbf_h: float
    """Mean time between interruptions of the whole job, hours."""
    interruptions_per_day: float
    checkpoint_write_s: float
    restart_s: float
    optimal_interval_s: float
    """Daly's optimum: seconds of work between checkpoints."""
    young_interval_s: float
    """Young's first-order optimum sqrt(2 * delta * M), seconds."""
    goodput: float
    """Useful fraction of wall-clock time at the optimal interval."""
    interval_s: float | None = None
    """A checkpoint interval the user asked about, seconds (None: not asked)."""
    goodput_at_interval: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def job_mtbf_s(num_gpus: int, mtbf_h: float, preempt_per_h: float = 0.0) -> float:
    """Mean time between interruptions of a job on ``num_gpus`` GPUs, seconds."""
    rate_per_h = num_gpus / mtbf_h + num_gpus * preempt_per_h
    return 3600.0 / rate_per_h


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly's optimal seconds of work between checkpoints (eq. 37)."""
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def goodput_fraction(interval_s: float, delta_s: float, restart_s: float,
                     mtbf_s: float) -> float:
    """Useful fraction of wall time checkpointing every ``interval_s`` of work (Daly eq. 20)."""
    wall = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + delta_s) / mtbf_s)
    return interval_s / wall


def goodput(num_gpus: int, *, mtbf_h: float, checkpoint_write_s: float, restart_s: float,
            preempt_per_h: float = 0.0, interval_s: float | None = None) -> Goodput:
    """Goodput of a ``num_gpus`` job at Daly's optimal checkpoint interval.

    Args:
        mtbf_h: per-GPU mean time between failures, hours (> 0).
        checkpoint_write_s: seconds training pauses to write a checkpoint (>= 0).
        restart_s: seconds from an interruption to training again, reload included (>= 0).
        preempt_per_h: spot preemptions per GPU-hour (>= 0).
        interval_s: also report goodput at this checkpoint interval (seconds of work).

    Raises:
        SpecError: an input is out of range (the message names it).
    """
    # Physically sensible ranges: a finite value far outside them is a typo, and an infinite
    # or tiny one makes a part of the answer free or overflows Daly's exponentials.
    checks = (("mtbf_hours", mtbf_h, 1e-3, 1e9),
              ("checkpoint_write_s", checkpoint_write_s, 0.0, 1e7),
              ("restart_s", restart_s, 0.0, 1e7),
              ("preemption_per_gpu_hour", preempt_per_h, 0.0, 1e3),
              ("num_gpus", num_gpus, 1, 1e9))
    for name, value, lo, hi in checks:
        if not (isinstance(value, int | float) and math.isfinite(value) and lo <= value <= hi):
            raise SpecError(f"{name}={value!r} must be a number from {lo:g} to {hi:g}",
                            field=name, value=value, allowed=f"{lo:g}..{hi:g}")
    if interval_s is not None and not interval_s > 0:
        raise SpecError(f"checkpoint_interval_s={interval_s!r} must be > 0",
                        field="checkpoint_interval_s", value=interval_s, allowed="> 0")
    m = job_mtbf_s(num_gpus, mtbf_h, preempt_per_h)
    tau = daly_interval(checkpoint_write_s, m) if checkpoint_write_s > 0 else m
    best = goodput_fraction(tau, checkpoint_write_s, restart_s, m)
    at = (goodput_fraction(interval_s, checkpoint_write_s, restart_s, m)
          if interval_s is not None else None)
    return Goodput(num_gpus=num_gpus, job_mtbf_h=m / 3600.0,
                   interruptions_per_day=86400.0 / m, checkpoint_write_s=checkpoint_write_s,
                   restart_s=restart_s, optimal_interval_s=tau,
                   young_interval_s=math.sqrt(2.0 * checkpoint_write_s * m),
                   goodput=best, interval_s=interval_s, goodput_at_interval=at)


def checkpoint_bytes(num_params: float, *, weight_bytes: float = 2.0,
                     optimizer_state_bytes: float = 12.0) -> float:
    """Bytes of a full training checkpoint: 16-bit weights plus fp32 master weights and two Adam
    moments (2 + 12 bytes per parameter by default)."""
    return num_params * (weight_bytes + optimizer_state_bytes)
