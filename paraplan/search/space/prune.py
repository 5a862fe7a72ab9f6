"""Time only the plans that can reach a search's top K (``evaluate_space(top=K)``).

A plan's step time is at least its micro-batches times the work of its average pipeline
stage: every stage runs each of its ``m`` micro-batches' forward and backward passes one after
another on its own GPUs, so its slowest stage takes ``m`` times its layers' pass times, and
the slowest is at least the average, ``m (L_dense (f+b)_dense + L_moe (f+b)_moe) / pp``, from
the per-key layer costs the block evaluation itself reads (bubble, LM head, pipeline sends,
DP sync and the optimizer only add to it). That holds for any split of the layers into
stages and any schedule. So once a first pass over the plans with the smallest bounds has
found K plans whose evaluated time is exact (what ``simulate()`` returns), a plan whose bound
is not below the K-th of them cannot be among the K fastest, and is left untimed: its step
time stays NaN and its ``lower_s`` is the bound. ``search.exhaustive.top_k`` simulates rows in
order of ``lower_s`` and stops at the K-th best time found, so it never reaches those rows
either way: the searcher returns the same plans with a fraction of the array work. (The
exhaustive searcher's re-split finalists, ``dp.resplit.finalist_rows``, are then chosen among
the timed plans: where an untimed plan would have been one, a timed one below it takes its
place, which can only add a faster re-split plan.)
"""

from __future__ import annotations

import numpy as np

FIRST_PASS_PLANS = 20_000
"""Plans timed first (those with the smallest bounds) to find the K-th best exact time:
enough that their K-th best sits near the space's own (the bound orders plans closely), few
against the hundreds of thousands a large space fits (DeepSeek-V3 on 2,048 H800: 728k)."""

TIE_TOLERANCE = 1e-9
"""Relative margin kept above the K-th best time, so a plan tied with it is still timed."""


def work_bound(m: np.ndarray, pp: np.ndarray, key: np.ndarray, lc: np.ndarray,
               dense_layers: int, moe_layers: int) -> np.ndarray:
    """Lower bound on each plan's step time (s): ``m`` micro-batches times its average
    stage's forward + backward layer time. ``key``: each plan's row of ``lc`` (the per-key
    ``LayerCost`` columns ``[key, dense/moe, field]``, fields 0 and 1 the forward and
    backward pass with their exposed communication)."""
    passes = lc[:, :, 0] + lc[:, :, 1]  # [key, dense/moe]
    per_key = dense_layers * passes[:, 0] + moe_layers * passes[:, 1]
    return m * per_key[key] / pp


def first_pass(bound: np.ndarray, top: int) -> np.ndarray:
    """Positions in ``bound`` (the bounds of the candidate plans) of the plans timed first:
    the ``max(FIRST_PASS_PLANS, 64 top)`` with the smallest bounds (all of them when there
    are no more), in no particular order."""
    want = max(FIRST_PASS_PLANS, 64 * top)
    if len(bound) > want:
        return np.argpartition(bound, want - 1)[:want]
    return np.arange(len(bound))


def kth_exact(step: np.ndarray, exact: np.ndarray, timed: np.ndarray, top: int,
              cutoff: float | None) -> float:
    """The ``top``-th best exact step time among the ``timed`` rows (``cutoff`` where that is
    smaller: a K-th best time the caller already knows), with ``TIE_TOLERANCE`` above it;
    infinity while fewer than ``top`` rows are exact."""
    times = step[timed & exact & np.isfinite(step)]
    kth = float(np.partition(times, top - 1)[top - 1]) if len(times) >= top else np.inf
    if cutoff is not None:
        kth = min(kth, float(cutoff))
    return kth * (1.0 + TIE_TOLERANCE)
