"""Pipeline order of the groups (open-loop TSP path: Held-Karp or 2-opt) and the replica matching
between consecutive groups (bottleneck assignment)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

ORDER_EXACT_MAX = 10
"""Up to this many stages the pipeline order is solved exactly (Held-Karp, O(2^pp pp^2))."""


def bottleneck_matching(cost: np.ndarray) -> tuple[float, np.ndarray]:
    """Perfect matching of rows to columns minimising the largest matched entry, then the sum.

    ``linear_sum_assignment`` on ``cost`` with the entries above a threshold ``t`` priced out
    finds the cheapest matching inside ``t`` if one exists. ``t`` starts at the lower bound
    every row and column imposes (usually optimal); otherwise a guess from one assignment on
    rank-exponential weights (the minimum-sum matching under weights ``(n+1)^rank`` has the
    smallest possible largest rank) is verified by showing the next smaller value infeasible,
    with a binary search over the distinct values as the fallback.
    """
    n = cost.shape[0]
    if n == 1:
        return float(cost[0, 0]), np.zeros(1, dtype=np.intp)
    rows = np.arange(n)
    big = float(cost.max()) * (n + 1) + 1.0

    def attempt(t: float) -> np.ndarray | None:
        _, col = linear_sum_assignment(np.where(cost <= t, cost, big))
        return col if cost[rows, col].max() <= t else None

    low = float(max(cost.min(axis=1).max(), cost.min(axis=0).max()))
    col = attempt(low)
    if col is not None:
        return low, col.astype(np.intp)
    vals = np.unique(cost)
    vals = vals[vals > low]
    lo, hi = 0, vals.size - 1  # the largest entry is always feasible
    if vals.size * math.log(n + 1) < 600:  # guess from rank-exponential weights
        rank = np.searchsorted(vals, cost) + 1.0
        weights = np.where(cost > low, np.exp(rank * math.log(n + 1)), 0.0)
        _, guess = linear_sum_assignment(weights)
        g = int(np.searchsorted(vals, cost[rows, guess].max()))
        if g == 0 or attempt(float(vals[g - 1])) is None:
            lo = hi = g
        else:
            hi = g - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if attempt(float(vals[mid])) is not None:
            hi = mid
        else:
            lo = mid + 1
    col = attempt(float(vals[lo]))
    assert col is not None
    return float(vals[lo]), col.astype(np.intp)


def subset_layers(p: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The constant part of Held-Karp for ``p`` nodes, per path length s: (flat table index
    of every (mask of s nodes, end j), flat index ``prev * p + i`` of the entry (mask
    without j, ending at i) laid out (i, mask, j), 0/inf penalty where j is not in the
    mask)."""
    allm = np.arange(1 << p)
    bits = 1 << np.arange(p)
    count = np.zeros(allm.size, dtype=np.intp)
    for k in range(p):
        count += (allm >> k) & 1
    nodes = np.arange(p)
    layers = []
    for size in range(p + 1):
        ms = allm[count == size]
        inside = (ms[:, None] & bits[None, :]) != 0
        prev = ms[:, None] ^ bits[None, :]
        src = prev[None, :, :] * p + nodes[:, None, None]
        dst = ms[:, None] * p + nodes[None, :]
        layers.append((dst, src, np.where(inside, 0.0, np.inf)))
    return layers


def _held_karp(w: np.ndarray, allowed: np.ndarray,
               layers: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
               ) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest open paths visiting every node once, for a batch of position constraints:
    node ``j`` may sit at position ``k`` only where ``allowed[t, j, k]``. Held-Karp DP over
    subsets (``table[mask, j]`` = cheapest path through ``mask`` ending at ``j``), one numpy
    pass per path length for the whole batch. Returns (cost per batch entry, inf where
    infeasible; the tables, shape (2^p, p, batch), for :func:`_hk_path`)."""
    nt, p = allowed.shape[0], w.shape[0]
    full = 1 << p
    table = np.full((full * p, nt), np.inf)
    ban = np.where(allowed, 0.0, np.inf).transpose(2, 1, 0)  # (position, node j, batch)
    nodes = np.arange(p)
    table[(1 << nodes) * p + nodes] = ban[0]
    wt = w[:, None, :, None]  # [i, _, j, _] = w[i, j]
    for size in range(2, p + 1):
        dst, src, outside = layers[size]
        step = (table[src] + wt).min(axis=0)  # (masks, j, batch)
        table[dst] = step + outside[:, :, None] + ban[size - 1][None, :, :]
    tables = table.reshape(full, p, nt)
    return tables[full - 1].min(axis=0), tables


def _hk_path(w: np.ndarray, table: np.ndarray) -> list[int]:
    """Walk one Held-Karp table (2^p, p) back from its best end to recover the path."""
    p = w.shape[0]
    mask = (1 << p) - 1
    j = int(np.argmin(table[mask]))
    path = [j]
    while len(path) < p:
        here = table[mask, j]
        mask ^= 1 << j
        j = int(np.argmin(np.abs(table[mask] + w[:, j] - here)))
        path.append(j)
    return path[::-1]


def _order_cost(order: Sequence[int], w: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    o = np.asarray(order)
    dp_c = float(c[o, np.arange(o.size)].max())
    pp_c = float(w[o[:-1], o[1:]].sum())
    return dp_c, pp_c


def exact_order(w: np.ndarray, c: np.ndarray,
                layers: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                cutoff: float = math.inf) -> tuple[list[int], float, float] | None:
    """Exact min over orders of ``max_k c[g_k, k] + path(w)``: (order, dp, pp), or None when
    the optimum exceeds ``cutoff`` (then it is not computed to the end).

    The optimum is ``min_T T + P(T)`` over the distinct values ``T`` of ``c``, where
    ``P(T)`` is the cheapest path with every group's DP cost at its position <= T (the
    optimal order is feasible at its own DP cost; any path feasible at T costs at most
    ``T + P(T)``). First the unconstrained path (cost ``P0``, DP cost ``d0``); then, for
    ascending thresholds ``T < d0`` while ``T + P0`` can still beat the best so far (and the
    cutoff) and groups can be assigned to positions within ``T`` (checked by an assignment),
    the constrained Held-Karp path.
    """
    p = w.shape[0]
    costs, tables = _held_karp(w, np.ones((1, p, p), dtype=bool), layers)
    p0 = float(costs[0])
    low = max(c.min(axis=0).max(), c.min(axis=1).max())  # below: some slot has no group
    if low + p0 > cutoff:
        return None
    order = _hk_path(w, tables[:, :, 0])
    best_dp, best_pp = _order_cost(order, w, c)
    best = best_dp + best_pp
    for t in np.unique(c[(c >= low) & (c < best_dp)]):
        if t + p0 >= best * (1 - 1e-12) or t + p0 > cutoff:
            break
        allowed = c <= t
        over = (~allowed).astype(float)
        r, col = linear_sum_assignment(over)
        if over[r, col].sum() > 0:  # no assignment of groups to positions within t
            continue
        costs, tables = _held_karp(w, allowed[None], layers)
        if t + costs[0] < best * (1 - 1e-12):
            path = _hk_path(w, tables[:, :, 0])
            d, q = _order_cost(path, w, c)
            if d + q < best:
                order, best_dp, best_pp, best = path, d, q, d + q
    if best > cutoff:
        return None
    return order, best_dp, best_pp


def _two_opt_path(order: np.ndarray, w: np.ndarray) -> np.ndarray:
    """2-opt on an open path (segment reversals) until no move shortens ``sum w``; all moves
    of a round are priced at once with numpy (a zero-cost dummy node pins both ends)."""
    p = order.size
    ext = np.zeros((p + 1, p + 1))
    ext[:p, :p] = w
    o = order.copy()
    upper = np.triu(np.ones((p, p), dtype=bool), 1)
    for _ in range(p * p):
        full = np.concatenate([[p], o, [p]])
        a, b, d = full[:-2], full[1:-1], full[2:]
        # reverse b[i..j]: edges (a_i, b_i) and (b_j, d_j) become (a_i, b_j) and (b_i, d_j)
        delta = (ext[a[:, None], b[None, :]] + ext[b[:, None], d[None, :]]
                 - ext[a, b][:, None] - ext[b, d][None, :])
        delta = np.where(upper, delta, 0.0)
        i, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
        if delta[i, j] >= -1e-12 * max(1.0, float(np.abs(w).max())):
            break
        o[i:j + 1] = o[i:j + 1][::-1].copy()
    return o


def heuristic_order(w: np.ndarray, c: np.ndarray) -> tuple[list[int], float, float]:
    """Order for pp above ORDER_EXACT_MAX: nearest-neighbour paths from every start (built
    together with numpy), the three shortest improved by 2-opt, every candidate tried in
    both directions on the true (position-dependent) objective."""
    p = w.shape[0]
    rows = np.arange(p)
    paths = np.zeros((p, p), dtype=np.intp)
    paths[:, 0] = rows
    visited = np.eye(p, dtype=bool)
    for k in range(1, p):
        nxt = np.where(visited, np.inf, w[paths[:, k - 1]]).argmin(axis=1)
        paths[:, k] = nxt
        visited[rows, nxt] = True
    sums = w[paths[:, :-1], paths[:, 1:]].sum(axis=1)
    improved = [_two_opt_path(paths[i], w) for i in np.argsort(sums, kind="stable")[:3]]
    cands = np.concatenate([paths, np.array(improved)])
    cands = np.concatenate([cands, cands[:, ::-1]])
    totals = c[cands, rows].max(axis=1) + w[cands[:, :-1], cands[:, 1:]].sum(axis=1)
    best = cands[int(np.argmin(totals))].tolist()
    d, q = _order_cost(best, w, c)
    return best, d, q
