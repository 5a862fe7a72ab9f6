"""Event simulation of one pipeline flush: each schedule's per-stage op order
(:func:`simulate_pipeline`'s dependencies and the P2P convention are in
:mod:`paraplan.simulator.pipeline`'s docstring), compiled once per (schedule, p, m, v) into an
op program that runs in one pass for any stage times.

All times are seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat

import numpy as np

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-h1")

_Op = tuple[str, int, int]  # (kind, micro-batch, chunk)


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
        record_events: If False, ``events`` is left empty (searches need only the totals).

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
    prog = _program(schedule, p, m, nv)
    zb = schedule == "zb-h1"
    # Durations by (kind, stage) and transfers by link, as indexed by the program; W ops
    # never communicate (the extra 0.0 after the links).
    comm_on = 0.0 if p == 1 else 1.0
    vals = [x / nv for x in tf] + [(tb[r] - tw[r]) if zb else tb[r] / nv for r in range(p)] \
        + tw
    sends = [x * comm_on for x in links] + [0.0]

    ready = [-1.0] * prog.size  # time the op's output is available (compute end + transfer)
    crit = [-1] * prog.size  # predecessor that fixed the start (critical-path back-pointer)
    start = [0.0] * prog.size if record_events else None
    free, last = [0.0] * p, [-1] * p
    # The ops in an order that respects every dependency (the same for any durations), each
    # as early as its stage and its data predecessor allow.
    for s, key, pred, d, x in zip(prog.stage.tolist(), prog.key.tolist(), prog.pred.tolist(),
                                  prog.dur.tolist(), prog.send.tolist(), strict=True):
        t, back = free[s], last[s]
        if pred >= 0:
            avail = ready[pred]
            if avail > t:
                t, back = avail, pred
        crit[key] = back
        if start is not None:
            start[key] = t
        t += vals[d] + sends[x]
        ready[key] = free[s] = t
        last[s] = key

    total = max(free)
    # Per stage, its ops' durations and transfers added in its execution order (the program
    # keeps each stage's ops in that order).
    busy = np.bincount(prog.stage, np.asarray(vals)[prog.dur], minlength=p).tolist()
    comm = np.bincount(prog.stage, np.asarray(sends)[prog.send], minlength=p).tolist()
    events: list[Event] = []
    if start is not None:
        by_stage = np.argsort(prog.stage, kind="stable")
        bounds = np.searchsorted(prog.stage[by_stage], np.arange(p + 1)).tolist()
        for r, ops in enumerate(_stage_orders(schedule, p, m, nv)):
            kinds, mbs, chunks = zip(*ops, strict=True)
            rows = by_stage[bounds[r]:bounds[r + 1]]
            t0 = [start[key] for key in prog.key[rows].tolist()]
            ends = [t + vals[d] for t, d in zip(t0, prog.dur[rows].tolist(), strict=True)]
            events += map(Event, repeat(r), mbs, kinds, chunks, t0, ends)
    crit_p2p, key = 0.0, last[max(range(p), key=free.__getitem__)]
    key_send = prog.key_send
    while key >= 0:
        crit_p2p += sends[key_send[key]]
        key = crit[key]
    idle = [max(0.0, total - busy[r] - comm[r]) for r in range(p)]
    return Timeline(events, total, busy, idle, list(prog.peak), comm, crit_p2p)


@dataclass(frozen=True)
class _Program:
    """A schedule's ops in an order that respects every dependency, as int32 arrays: each
    op's stage, key, data predecessor's key (-1: none), duration index (kind x p + stage: F,
    B, W) and transfer index (the link towards its consumer; p: none); each key's transfer
    index; the peak in-flight micro-batches per stage. Each stage's ops keep its execution
    order. Depends on (schedule, p, m, v) only."""

    size: int
    stage: np.ndarray
    key: np.ndarray
    pred: np.ndarray
    dur: np.ndarray
    send: np.ndarray
    key_send: np.ndarray
    peak: tuple[int, ...]


@lru_cache(maxsize=64)
def _program(schedule: str, p: int, m: int, nv: int) -> _Program:
    """The op program of :func:`simulate_pipeline` (dependencies in its docstring), built once
    per shape: searches simulate many plans of one (schedule, p, m, v) with other stage
    times. Op key: (kind x chunks + model chunk) x m + micro-batch, kinds F=0, B=1, W=2 (W:
    chunk = rank). 24 bytes per op (under 1 MB for a 64-stage pipeline of 128 micro-batches
    and 2 chunks), so a search's shapes all stay cached."""
    nk = nv * p  # model chunks
    zb = schedule == "zb-h1"
    size = 3 * nk * m
    keys: list[list[int]] = [[] for _ in range(p)]
    preds: list[list[int]] = [[] for _ in range(p)]
    durs: list[list[int]] = [[] for _ in range(p)]
    sends: list[list[int]] = [[] for _ in range(p)]
    key_send = [p] * size
    peak = [0] * p
    for r, ops in enumerate(_stage_orders(schedule, p, m, nv)):
        live = top = 0  # micro-batches holding activations (freed by B, or by W in zb-h1)
        for kind, j, c in ops:
            k = c * p + r
            if kind == "F":
                key, pred, d = k * m + j, (k - 1) * m + j if k > 0 else -1, r
                x = k % p if k < nk - 1 else (k - 1) % p
                live += 1
                top = max(top, live)
            elif kind == "B":
                key, d = (nk + k) * m + j, p + r
                pred = (nk + k + 1) * m + j if k < nk - 1 else k * m + j
                x = (k - 1) % p if k > 0 else 0
                live -= 0 if zb else 1
            else:
                key, pred, d, x = (2 * nk + r) * m + j, (nk + r) * m + j, 2 * p + r, p
                live -= 1
            keys[r].append(key)
            preds[r].append(pred)
            durs[r].append(d)
            sends[r].append(x)
            key_send[key] = x
        peak[r] = top
    # Run the stages as far as their data allows, each stage's ops in its order; the order
    # in which ops complete is the program's (it needs only which outputs exist, not when).
    done = [False] * size
    order: list[tuple[int, int]] = []
    ptr = [0] * p
    waiter: dict[int, int] = {}  # awaited op key -> the stage blocked on it
    todo = list(range(p - 1, -1, -1))  # stages that may be able to advance
    while todo:
        s = todo.pop()
        ks, ps, i = keys[s], preds[s], ptr[s]
        while i < len(ks):
            key, pred = ks[i], ps[i]
            if pred >= 0 and not done[pred]:
                waiter[pred] = s
                break
            done[key] = True
            order.append((s, i))
            i += 1
            if key in waiter:
                todo.append(waiter.pop(key))
        ptr[s] = i
    if any(ptr[s] < len(keys[s]) for s in range(p)):
        raise RuntimeError(f"pipeline schedule {schedule!r} deadlocked")  # cannot happen
    def flat(per_stage: list[list[int]]) -> np.ndarray:
        return np.array([per_stage[s][i] for s, i in order], dtype=np.int32)

    return _Program(size, np.array([s for s, _ in order], dtype=np.int32), flat(keys),
                    flat(preds), flat(durs), flat(sends), np.array(key_send, dtype=np.int32),
                    tuple(peak))
