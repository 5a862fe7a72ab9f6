"""Pipeline quantities of a block's plans as arrays: the micro-batches in flight on each stage
(``pipeline.inflight_microbatches``) and the pipeline span (``pipeline.pipeline_time``), the
closed forms ``block`` prices every plan with."""

from __future__ import annotations

import numpy as np

from paraplan.search.space.keys import key_index
from paraplan.simulator.pipeline import SCHEDULES, _group_size, pipeline_time


def inflight(sched: np.ndarray, p: int, m: np.ndarray, v: int,
             stages: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """``pipeline.inflight_microbatches`` for every stage in ``stages`` (rows) and plan
    (columns), with each plan's ``extra`` live (chunk-)micro-batches: ``min(base + extra,
    m)`` where the base is ``p - stage`` (1f1b), ``p`` (zb-h1) or unbounded (gpipe), one
    small table per schedule taken by each plan's; interleaved plans (v > 1) get their own
    form, on their columns only. Stage-major, so a block's reductions over stages run along
    the first axis (contiguous rows: numpy's fast direction)."""
    mm = m.astype(float)
    base = np.empty((len(stages), len(SCHEDULES)))
    base[:] = (p - stages)[:, None]  # 1f1b
    base[:, SCHEDULES.index("gpipe")] = np.inf  # every micro-batch: min(inf, m) = m
    base[:, SCHEDULES.index("zb-h1")] = p
    ahead = np.take(base, sched, axis=1)
    if extra.any():
        ahead += extra[None, :]
    out = np.minimum(ahead, mm, out=ahead)
    il = (sched == SCHEDULES.index("interleaved")) & (v > 1)
    if il.any():
        rows = np.flatnonzero(il)
        um, minv = key_index([m[rows]])
        g = np.array([_group_size(p, int(x)) for x in um[:, 0]], dtype=float)[minv]
        out[:, rows] = np.minimum(2 * (p - stages[:, None] - 1) + (v - 1) * g + 1
                                  + extra[rows], mm[rows] * v) / v
    return out


def pipeline_span(sched: np.ndarray, p: int, m: np.ndarray, v: int, tf: np.ndarray,
                   tb: np.ndarray, tw: np.ndarray, c: np.ndarray, exact: bool,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pipeline.pipeline_time`` total with and without transfers, for every plan.

    Interleaved with m >= p and m % p != 0 has no closed form; with ``exact`` those plans run
    the scalar ``pipeline_time`` (event simulation on equal stages), cached on identical
    inputs; without, they keep the m % p == 0 form (n = m v + p - 1 chunk slots), a lower
    bound on both totals (checked against the event simulation in the tests). Returns
    (total, total without transfers, mask of plans given the bound).
    """
    mf = m.astype(float)
    if p == 1:
        c = np.zeros_like(c)

    def span(cc: np.ndarray) -> np.ndarray:
        n1 = mf + p - 1
        out = n1 * (tf + tb) + 2 * n1 * cc  # gpipe, 1f1b
        f, bb, w = tf + cc, tb - tw + cc, tw
        zb = np.maximum(np.maximum(np.maximum(mf, p) * f + n1 * bb + mf * w,
                                   n1 * f + mf * bb + mf * w),
                        n1 * (f + bb) + np.maximum(1.0, mf - p + 1) * w)
        out = np.where(sched == SCHEDULES.index("zb-h1"), zb, out)
        if v > 1:
            ni = np.where(mf >= p, mf * v + p - 1, mf + v * p - 1)
            il = ni * (tf + tb) / v + 2 * ni * cc
            out = np.where(sched == SCHEDULES.index("interleaved"), il, out)
        return out

    total = span(c)
    base = np.where(c > 0, span(np.zeros_like(c)), total)
    odd_mask = np.zeros(len(m), dtype=bool)
    if v > 1:
        odd_mask = (sched == SCHEDULES.index("interleaved")) & (m >= p) & (m % p != 0)
    if exact:
        cache: dict[tuple, tuple[float, float]] = {}
        for j in np.nonzero(odd_mask)[0]:
            key = (int(m[j]), float(tf[j]), float(tb[j]), float(c[j]))
            if key not in cache:
                pt = pipeline_time("interleaved", p, key[0], key[1], key[2], v=v, t_p2p=key[3])
                cache[key] = (pt.total_s, pt.total_s - pt.p2p_s)
            total[j], base[j] = cache[key]
        odd_mask[:] = False
    return total, base, odd_mask
