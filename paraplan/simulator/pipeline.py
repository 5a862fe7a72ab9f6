"""Pipeline-parallel schedules: closed forms for equal stages and an event simulation.

Schedules (p stages/ranks, m micro-batches, v model chunks per rank):

* ``gpipe``: all forwards, then all backwards (in micro-batch order).
* ``1f1b``: PipeDream-flush / Megatron non-interleaved: stage i runs min(p-i-1, m) warm-up
  forwards, then alternates one forward / one backward, then drains the remaining backwards.
* ``interleaved``: Megatron interleaved 1F1B; chunk c of rank r holds model chunk c*p + r.
  Per-rank order is Megatron-core's schedule table (groups of g micro-batches, chunk-major in a
  group; backward uses chunk v-1-c) with 2(p-r-1) + (v-1)g warm-up chunk-forwards; g = p, or
  for m % p != 0 the smallest g the way Megatron-core accepts it (see _group_size). v == 1 is
  ``1f1b``. Megatron refuses m < p; here that runs as one group of m micro-batches.
* ``zb-h1``: zero-bubble H1: backward split into B (input grad) and W (weight grad). Stage i:
  min(p-i, m) forwards, B0, min(i, .) pairs (F, B), W0, then (F, B, W) triples, (B, W) pairs
  and the deferred W's (the handcrafted order of Qi et al. 2023, as in Paddle's ZBH1 pass).

P2P convention (synchronous, non-overlapped send/recv as in Megatron-LM's default): with
p > 1 every F and every B op is followed, on its own stage, by one blocking transfer of its
output lasting ``t_p2p``; the consumer on the neighbouring stage may start when it ends (so
F(i, j) starts >= end of F(i-1, j) + t_p2p, and the sender is busy meanwhile). F of the last
model chunk and B of the first have no consumer but still pay one transfer (the receive half
of Megatron's combined send/recv), so every F/B op carries exactly one ``t_p2p`` and equal
stages stay equal; W ops never communicate; interleaving sends v times more messages
(Narayanan et al. 2021 sec 2.2.2). Events record compute only; the transfer occupies
[end_s, end_s + t_p2p]. For equal stages each closed form is thus the p2p-free one with
t_f -> t_f + t_p2p and t_b -> t_b + t_p2p, and p2p_s = total - total(t_p2p=0) (what the
transfers add), bubble_s = total(t_p2p=0) - m (t_f + t_b).

Closed forms (exact for equal stages; verified against the event simulation):

* gpipe, 1f1b: total = (m+p-1)(t_f + t_b + 2 t_p2p); bubble fraction (p-1)/(m+p-1) w/o p2p.
* interleaved, m % p == 0: n = m v + p - 1 chunk slots, total = n (t_f+t_b)/v + 2 n t_p2p, so
  bubble (p-1)(t_f+t_b)/v; m < p: n = m + v p - 1; other m: the event simulation is used.
* zb-h1, with f = t_f + t_p2p, b = t_b - t_w + t_p2p, w = t_w (derived as the longest path):
  total = max(max(m,p) f + (m+p-1) b + m w,  (m+p-1) f + m b + m w,
  (m+p-1)(f + b) + max(1, m-p+1) w). For m >= p and t_w <= min(t_f, t_b - t_w) the bubble
  is (p-1)(t_f + t_b - 2 t_w); t_f = t_b - t_w = t_w gives a third of 1F1B's bubble
  (Qi et al. 2023 sec 2.1).

All times are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.simulator.collectives import overlapped
from paraplan.simulator.pipeline_events import (
    SCHEDULES,
    Event,
    Timeline,
    _check,
    _group_size,
    _nonneg,
    simulate_pipeline,
)

__all__ = ["SCHEDULES", "Event", "PipelineTimes", "Timeline", "_group_size",
           "inflight_microbatches", "overlapped_p2p", "pipeline_time", "simulate_pipeline"]

@dataclass(frozen=True)
class PipelineTimes:
    """Pipeline part of one training step for equal stages (seconds).

    Attributes:
        total_s: First forward start to last backward end (incl. its transfer), seconds.
        compute_s: Busy compute per stage, m * (t_f + t_b), seconds.
        bubble_s: total_s - compute_s - p2p_s: the pipeline bubble without p2p, seconds.
        p2p_s: Exposed point-to-point time, total_s minus the total with t_p2p = 0 (gpipe and
            1f1b: 2(m+p-1) t_p2p, every transfer on the critical path), seconds.
        bubble_fraction: bubble_s / total_s (0 when total_s is 0).
    """

    total_s: float
    compute_s: float
    bubble_s: float
    p2p_s: float
    bubble_fraction: float


def pipeline_time(
    schedule: str,
    p: int,
    m: int,
    t_f: float,
    t_b: float,
    *,
    v: int = 1,
    t_w: float = 0.0,
    t_p2p: float = 0.0,
) -> PipelineTimes:
    """Closed-form pipeline time for p equal stages (formulas in the module docstring).

    Args:
        schedule: One of :data:`SCHEDULES`.
        p: Pipeline stages (ranks).
        m: Micro-batches per step.
        t_f: Forward time of one micro-batch on one stage (all its chunks), seconds.
        t_b: Backward time of one micro-batch on one stage incl. weight gradient, seconds.
        v: Model chunks per rank (``interleaved`` only).
        t_w: Weight-gradient part of ``t_b`` (``zb-h1`` only; ignored otherwise), seconds.
        t_p2p: One activation/gradient transfer between neighbouring stages, seconds.

    Returns:
        The :class:`PipelineTimes`. Interleaved with m >= p and m % p != 0 has no closed form
        here and runs :func:`simulate_pipeline` on equal stages.

    Raises:
        ValueError: On bad arguments.
    """
    _check(schedule, p, m, v)
    t_f, t_b, t_w, c = _nonneg("times", [t_f, t_b, t_w, t_p2p])
    if schedule == "zb-h1" and t_w > t_b:
        raise ValueError("t_w is part of t_b and cannot exceed it")
    c = c if p > 1 else 0.0

    def span(c: float) -> float:  # total_s of the schedule with transfers of c seconds
        if schedule == "zb-h1":  # Qi et al. 2023; longest path of the zb-h1 dependency DAG
            f, b, w, n = t_f + c, t_b - t_w + c, t_w, m + p - 1
            return max(max(m, p) * f + n * b + m * w, n * f + m * b + m * w,
                       n * (f + b) + max(1, m - p + 1) * w)
        if schedule == "interleaved" and v > 1 and m >= p and m % p:
            tl = simulate_pipeline(schedule, [t_f] * p, [t_b] * p, m, v=v, t_p2p=c,
                                   record_events=False)
            return tl.total_s
        # Narayanan et al. 2021 sec 2.2: bubble (p-1)/(m+p-1), divided by v if interleaved
        n = m + p - 1 if schedule != "interleaved" else m * v + p - 1 if m >= p else m + v * p - 1
        return n * (t_f + t_b) / (v if schedule == "interleaved" else 1) + 2 * n * c

    total = span(c)
    base = span(0.0) if c > 0 else total
    compute = m * (t_f + t_b)
    bubble = max(0.0, base - compute)
    return PipelineTimes(total, compute, bubble, total - base, bubble / total if total else 0.0)


def overlapped_p2p(t_p2p_s: float, window_s: float, nccl_slowdown: float) -> float:
    """Seconds one pipeline send costs when it overlaps a chunk's compute of ``window_s``
    (Megatron's interleaved schedule posts the next send/receive before computing and waits
    after): what the window cannot hide, plus the SMs NCCL takes from the overlapped compute
    (``nccl_slowdown``, as for every overlapped collective)."""
    return overlapped(t_p2p_s, window_s, nccl_slowdown)


def inflight_microbatches(schedule: str, p: int, m: int, stage: int, v: int = 1,
                          extra: float = 0.0) -> float:
    """Peak micro-batches with live activations on ``stage``, in whole-stage micro-batches.

    gpipe: m. 1f1b: min(p - stage, m). zb-h1: min(p, m) on every stage, since activations live
    until W and every stage holds p micro-batches (Qi et al. 2023 sec 2.1: same number in flight
    on all stages; stage 0 equals 1F1B's worst stage). interleaved (v > 1): the warm-up of
    w = 2(p-stage-1) + (v-1)g chunk-forwards (g = p when p divides m) plus one, over v:
    min(w + 1, m v) / v; for stage 0 that is p + (p-1)/v = p (1 + (p-1)/(p v)), exactly the
    Narayanan et al. 2021 / Korthikanti et al. 2022 formula. All equal the event simulation's
    ``peak_inflight`` (divided by v for interleaved).

    ``extra`` (chunk-)micro-batches of activations live on top of that: Megatron-Core's
    expert-parallel all-to-all overlap warms up one forward more but runs every later forward
    merged, layer by layer, with the oldest live micro-batch's backward, so it holds one layer
    more than the plain schedule (``moe.a2a_overlap_warmup``).

    Args:
        schedule: One of :data:`SCHEDULES`.
        p: Pipeline stages.
        m: Micro-batches per step.
        stage: Pipeline rank, 0..p-1.
        v: Model chunks per rank (``interleaved`` only).
        extra: Additional live (chunk-)micro-batches, may be fractional (0 for the plain
            schedules).

    Returns:
        Activation-memory multiplier (one unit = one micro-batch's activations for the stage).

    Raises:
        ValueError: On bad arguments.
    """
    _check(schedule, p, m, v)
    if not 0 <= stage < p:
        raise ValueError(f"stage {stage} outside 0..{p - 1}")
    if extra < 0:
        raise ValueError(f"extra={extra} must be >= 0")
    if schedule == "gpipe":
        return float(m)
    if schedule == "zb-h1":
        return float(min(p + extra, m))
    if schedule == "interleaved" and v > 1:
        return min(2 * (p - stage - 1) + (v - 1) * _group_size(p, m) + 1 + extra, m * v) / v
    return float(min(p - stage + extra, m))
