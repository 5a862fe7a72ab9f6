# longer than 400 lines: schedule orders, event simulation and closed forms must agree.
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

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-h1")

_Op = tuple[str, int, int]  # (kind, micro-batch, chunk)


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


@dataclass(frozen=True, slots=True)
class Event:
    """One compute op of the event simulation (times in seconds; transfer not included)."""

    stage: int
    microbatch: int
    kind: str
    chunk: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    """Result of :func:`simulate_pipeline` (times in seconds).

    Attributes:
        events: Every op, grouped by stage in execution order.
        total_s: Time until the last stage is free (last op plus its transfer), seconds.
        busy_s: Per-stage compute time, seconds.
        bubble_s: Per-stage idle time in [0, total_s] (neither computing nor sending), seconds.
        peak_inflight: Per stage, max micro-batches whose forward ran but whose backward (W for
            zb-h1, where activations live until the weight gradient) has not; for interleaved
            in chunk-micro-batches (each 1/v of the stage's activations).
        p2p_s: Per-stage time blocked in transfers, seconds.
        critical_p2p_s: Transfers on one critical path, seconds; >= the exposed p2p (total_s
            minus the total with t_p2p = 0), equal to it where a closed form exists, except zb-h1.
    """

    events: list[Event]
    total_s: float
    busy_s: list[float]
    bubble_s: list[float]
    peak_inflight: list[int]
    p2p_s: list[float]
    critical_p2p_s: float


def _check(schedule: str, p: int, m: int, v: int) -> None:
    """Validate the common arguments; raises ValueError."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; expected one of {SCHEDULES}")
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need p >= 1, m >= 1, v >= 1 (got p={p}, m={m}, v={v})")
    if v > 1 and schedule != "interleaved":
        raise ValueError(f"v={v} model chunks per rank needs schedule 'interleaved'")


def _nonneg(name: str, xs: Sequence[float]) -> list[float]:
    """Return ``xs`` as floats, raising ValueError unless all are finite and >= 0."""
    out = [float(x) for x in xs]
    if any(not math.isfinite(x) or x < 0 for x in out):
        raise ValueError(f"{name} must be finite and >= 0, got {list(xs)}")
    return out


def _group_size(p: int, m: int) -> int:
    """Megatron-core's microbatch_group_size_per_vp_stage g for interleaving.

    g = p (the default) if p divides m or m < p; else the smallest g in [p, m] with m % g == 0
    or m % g >= p, which Megatron-core requires (smaller final groups deadlock).
    """
    if m % p == 0 or m < p:
        return p
    return next(g for g in range(p, m + 1) if m % g == 0 or m % g >= p)


def _stage_orders(schedule: str, p: int, m: int, v: int) -> list[list[_Op]]:
    """Per-stage execution order of (kind, micro-batch, chunk) ops for ``schedule``."""
    orders: list[list[_Op]] = []
    for r in range(p):
        if schedule == "gpipe":  # Huang et al. 2019, Narayanan et al. 2021 fig. 3
            ops = [("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)]
        elif schedule == "1f1b" or (schedule == "interleaved" and v == 1):
            warm = min(p - r - 1, m)  # Narayanan et al. 2021 fig. 4 (top)
            ops = [("F", j, 0) for j in range(warm)]
            for k in range(m - warm):
                ops += [("F", warm + k, 0), ("B", k, 0)]
            ops += [("B", j, 0) for j in range(m - warm, m)]
        elif schedule == "interleaved":
            g = _group_size(p, m)
            table: list[tuple[int, int]] = []  # Megatron-core get_schedule_table
            for lo in range(0, m, g):
                hi = m if lo + g >= m else lo + g
                table += [(j, c) for c in range(v) for j in range(lo, hi)]
            total = m * v
            warm = min(2 * (p - r - 1) + (v - 1) * g, total)  # Narayanan et al. 2021 fig. 4
            fwd = [("F", j, c) for j, c in table]
            bwd = [("B", j, v - 1 - c) for j, c in table]
            ops = fwd[:warm]
            for k in range(total - warm):
                ops += [fwd[warm + k], bwd[k]]
            ops += bwd[total - warm:]
        else:  # zb-h1, Qi et al. 2023 fig. 3 (top)
            f = min(p - r, m)
            ops = [("F", j, 0) for j in range(f)] + [("B", 0, 0)]
            b = 1
            for _ in range(min(r, m - f)):  # i extra B's before the first W: the deferred W's
                ops += [("F", f, 0), ("B", b, 0)]
                f, b = f + 1, b + 1
            ops.append(("W", 0, 0))
            w = 1
            while f < m:
                ops += [("F", f, 0), ("B", b, 0), ("W", w, 0)]
                f, b, w = f + 1, b + 1, w + 1
            while b < m:
                ops += [("B", b, 0), ("W", w, 0)]
                b, w = b + 1, w + 1
            ops += [("W", j, 0) for j in range(w, m)]
        orders.append(ops)
    return orders


def simulate_pipeline(
    schedule: str,
    t_f: Sequence[float],
    t_b: Sequence[float],
    m: int,
    *,
    v: int = 1,
    t_w: Sequence[float] | None = None,
    t_p2p: float | Sequence[float] = 0.0,
    record_events: bool = True,
) -> Timeline:
    """Event-simulate one pipeline flush with per-stage times (seconds).

    Each stage runs its ops in the schedule's fixed order, one at a time, each as early as its
    dependencies allow: F(k, j) after F(k-1, j) of the previous model chunk, B(k, j) after
    B(k+1, j) (after F(k, j) on the last chunk), W(j) after B(j); plus the transfer after every
    F/B op (module docstring). Runs in O(p * m * v).

    Args:
        schedule: One of :data:`SCHEDULES`.
        t_f: Forward time of one micro-batch per stage (whole rank; chunks take t_f/v), seconds.
        t_b: Backward time per stage incl. weight gradient (whole rank), seconds.
        m: Micro-batches per step.
        v: Model chunks per rank (``interleaved`` only).
        t_w: Weight-gradient part of ``t_b`` per stage (``zb-h1`` only; ignored otherwise).
        t_p2p: One transfer, seconds: a scalar, one per boundary (len p-1; boundary i joins
            stages i and i+1), or len p where the last entry is the rank p-1 -> rank 0 link used
            by interleaved (defaults to the largest boundary).
        record_events: If False, ``events`` is left empty (about 3x faster; for searches).

    Returns:
        The :class:`Timeline`.

    Raises:
        ValueError: On bad arguments.
    """
    p = len(t_f)
    _check(schedule, p, m, v)
    tf, tb = _nonneg("t_f", t_f), _nonneg("t_b", t_b)
    tw = _nonneg("t_w", t_w) if t_w is not None else [0.0] * p
    if len(tb) != p or len(tw) != p:
        raise ValueError("t_f, t_b and t_w need one entry per stage")
    if schedule != "zb-h1":
        tw = [0.0] * p
    elif any(w > b for w, b in zip(tw, tb, strict=True)):
        raise ValueError("t_w is part of t_b and cannot exceed it")
    scalar = np.ndim(t_p2p) == 0
    links = _nonneg("t_p2p", [t_p2p] * max(p - 1, 1) if scalar else t_p2p)  # type: ignore[list-item]
    if p > 1 and len(links) not in (p - 1, p):
        raise ValueError(f"t_p2p needs p-1={p - 1} (or p) entries, got {len(links)}")
    links = [0.0] if p == 1 else links + [max(links)] * (p - len(links))  # + wrap p-1 -> 0
    nv = v if schedule == "interleaved" else 1
    nk = nv * p  # model chunks
    zb = schedule == "zb-h1"
    orders = _stage_orders(schedule, p, m, nv)

    # Op key: (kind * nk + model chunk) * m + micro-batch, kinds F=0, B=1, W=2 (W: chunk = rank).
    size = 3 * nk * m
    ready = [-1.0] * size  # time the op's output is available (compute end + transfer)
    start, xf = [0.0] * size, [0.0] * size  # xf: the op's transfer (link towards its consumer)
    crit = [-1] * size  # predecessor that fixed the start (critical-path back-pointer)
    keys: list[list[int]] = [[] for _ in range(p)]  # per stage, in execution order
    preds: list[list[int]] = [[] for _ in range(p)]  # data predecessor's key or -1
    durs: list[list[float]] = [[] for _ in range(p)]
    comm_on = 0.0 if p == 1 else 1.0
    busy, comm, peak = [0.0] * p, [0.0] * p, [0] * p
    for r, ops in enumerate(orders):
        f_dur, b_dur = tf[r] / nv, (tb[r] - tw[r]) if zb else tb[r] / nv
        live = top = 0  # micro-batches holding activations (freed by B, or by W in zb-h1)
        for kind, j, c in ops:
            k = c * p + r
            if kind == "F":
                key, pred, dur = k * m + j, (k - 1) * m + j if k > 0 else -1, f_dur
                x = links[k % p] if k < nk - 1 else links[(k - 1) % p]
                live += 1
                top = live if live > top else top
            elif kind == "B":
                key, dur = (nk + k) * m + j, b_dur
                pred = (nk + k + 1) * m + j if k < nk - 1 else k * m + j
                x = links[(k - 1) % p] if k > 0 else links[0]
                live -= 0 if zb else 1
            else:
                key, pred, dur, x = (2 * nk + r) * m + j, (nk + r) * m + j, tw[r], 0.0
                live -= 1
            xf[key] = x = x * comm_on
            keys[r].append(key)
            preds[r].append(pred)
            durs[r].append(dur)
            busy[r] += dur
            comm[r] += x
        peak[r] = top

    ptr, free, last = [0] * p, [0.0] * p, [-1] * p
    waiter: dict[int, int] = {}  # awaited op key -> the stage blocked on it
    todo = list(range(p - 1, -1, -1))  # stages that may be able to advance
    while todo:
        s = todo.pop()
        ks, ps, ds, i, t, prev = keys[s], preds[s], durs[s], ptr[s], free[s], last[s]
        n_ops = len(ks)
        while i < n_ops:
            key, pred = ks[i], ps[i]
            back = prev
            if pred >= 0:
                avail = ready[pred]
                if avail < 0.0:
                    waiter[pred] = s
                    break
                if avail > t:
                    t, back = avail, pred
            start[key], crit[key] = t, back
            t += ds[i] + xf[key]
            ready[key], prev, i = t, key, i + 1
            if key in waiter:
                todo.append(waiter.pop(key))
        ptr[s], free[s], last[s] = i, t, prev
    if any(ptr[s] < len(keys[s]) for s in range(p)):
        raise RuntimeError(f"pipeline schedule {schedule!r} deadlocked")  # cannot happen

    total = max(free)
    events: list[Event] = []
    for r in range(p if record_events else 0):
        kinds, mbs, chunks = zip(*orders[r], strict=True)
        t0 = [start[key] for key in keys[r]]
        events += map(Event, repeat(r), mbs, kinds, chunks, t0, map(operator.add, t0, durs[r]))
    crit_p2p, key = 0.0, last[max(range(p), key=free.__getitem__)]
    while key >= 0:
        crit_p2p += xf[key]
        key = crit[key]
    idle = [max(0.0, total - busy[r] - comm[r]) for r in range(p)]
    return Timeline(events, total, busy, idle, peak, comm, crit_p2p)


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
    return max(0.0, t_p2p_s - window_s) + min(t_p2p_s, window_s) * nccl_slowdown


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
