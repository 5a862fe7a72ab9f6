"""Generic dynamic programs: the min-bottleneck contiguous partition and the min-cost cover
(knapsack) over integer savings."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from paraplan.simulator.step import even_split


def min_bottleneck_partition(stage_cost: Sequence[np.ndarray]) -> tuple[list[int], float]:
    """Exact min-max contiguous partition of L items over ``len(stage_cost)`` stages.

    The linear-partition DP (PipeDream, Narayanan et al. 2019 sec 3.1): with
    ``best[r][j]`` the smallest bottleneck placing items [0, j) on stages 0..r,
    ``best[r][j] = min_{i<j} max(best[r-1][i], stage_cost[r][i, j])``. O(p * L^2) work,
    vectorised over i.

    Args:
        stage_cost: one (L+1) x (L+1) array per stage; ``stage_cost[r][i, j]`` is the cost of
            stage r holding items [i, j) (any unit; ``inf`` forbids it, e.g. out of memory).
            Only entries with i < j are read, so every stage gets >= 1 item.

    Returns:
        (items per stage, bottleneck). The bottleneck is ``inf`` when every split is
        forbidden; the counts are then those of an arbitrary split.

    Raises:
        ValueError: no stages, shapes disagree, or more stages than items.
    """
    p = len(stage_cost)
    if p == 0:
        raise ValueError("need at least one stage")
    size = stage_cost[0].shape[0]
    if any(c.shape != (size, size) for c in stage_cost):
        raise ValueError("every stage_cost must be the same (L+1) x (L+1) shape")
    n = size - 1
    if p > n:
        raise ValueError(f"{p} stages cannot each get >= 1 of {n} items")
    upper = np.triu(np.ones((size, size), dtype=bool), k=1)  # i < j
    best = np.where(upper[0], stage_cost[0][0], np.inf)
    choice: list[np.ndarray] = []
    for r in range(1, p):
        cand = np.maximum(best[:, None], np.where(upper, stage_cost[r], np.inf))
        arg = np.argmin(cand, axis=0)
        best = cand[arg, np.arange(size)]
        choice.append(arg)
    bottleneck = float(best[n])
    cuts = [n]
    j = n
    for r in range(p - 1, 0, -1):
        j = int(choice[r - 1][j])
        cuts.append(j)
    cuts.append(0)
    cuts.reverse()
    counts = [cuts[k + 1] - cuts[k] for k in range(p)]
    if not math.isfinite(bottleneck):
        counts = even_split(n, p)
    return counts, bottleneck


def min_cost_cover(costs: Sequence[float], savings: Sequence[int],
                   need: int) -> tuple[list[int], float] | None:
    """0/1 knapsack, covering form: the cheapest subset of items whose savings sum to >= need.

    ``dp[x]`` = least cost reaching min(need, saved) = x units after each item, O(n * need).
    Ties keep the smaller subset (an item is taken only when strictly cheaper).

    Args:
        costs: cost of each item (>= 0, e.g. seconds of extra forward).
        savings: what each item saves, in whole units (>= 0, e.g. 64 MiB quanta).
        need: units that must be saved.

    Returns:
        (chosen item indices ascending, total cost), or None when even all items fall short.
    """
    if len(costs) != len(savings):
        raise ValueError("costs and savings differ in length")
    if any(c < 0 for c in costs) or any(s < 0 for s in savings):
        raise ValueError("costs and savings must be >= 0")
    if need <= 0:
        return [], 0.0
    if sum(savings) < need:
        return None
    states = np.arange(need + 1)
    dp = np.full(need + 1, np.inf)
    dp[0] = 0.0
    taken: list[np.ndarray] = []
    pred_full: list[int] = []
    for cost, save in zip(costs, savings, strict=True):
        cand = np.full(need + 1, np.inf)
        if save > 0:
            # States below need come from exactly x - save; the capped state from any
            # x' >= need - save.
            low = states[save:need]
            cand[save:need] = dp[low - save] + cost
            lo = max(0, need - save)
            k = int(np.argmin(dp[lo:])) + lo
            cand[need] = dp[k] + cost
            pred_full.append(k)
        else:
            pred_full.append(need)
        take = cand < dp
        dp = np.where(take, cand, dp)
        taken.append(take)
    if not math.isfinite(dp[need]):
        return None
    chosen: list[int] = []
    x = need
    for idx in range(len(costs) - 1, -1, -1):
        if taken[idx][x]:
            chosen.append(idx)
            x = pred_full[idx] if x == need else x - savings[idx]
    chosen.reverse()
    return chosen, float(sum(costs[i] for i in chosen))
