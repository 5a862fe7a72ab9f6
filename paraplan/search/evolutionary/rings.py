"""Data-parallel cost inside one group: exact and heuristic rings, interchangeable GPUs,
spanning-tree bound."""

from __future__ import annotations

import itertools

import numpy as np


def ring_table(n: int) -> np.ndarray:
    """All rings over ``n`` members up to rotation and direction: ((n-1)!/2, n) indices."""
    if n <= 3:
        return np.arange(n)[None, :]
    rows = [(0, *p) for p in itertools.permutations(range(1, n)) if p[0] < p[-1]]
    return np.array(rows, dtype=np.intp)


def heuristic_rings(bw: np.ndarray, lat: np.ndarray, s_ref: float, starts: int = 4,
                    ) -> np.ndarray:
    """Candidate rings for a large group: nearest neighbour from a few starts on the ring-step
    time ``lat + s_ref/(n bw)`` (seconds), then best-improvement 2-opt on its 4th power (an
    additive stand-in for the bottleneck objective). Distinct rings, rows in lexicographic
    order.

    The starts are independent; they advance together as rows of one array (each tour takes
    its own moves and stops on its own), which gives the rings one tour at a time would.
    """
    n = bw.shape[0]
    w = lat + s_ref / (n * bw)
    np.fill_diagonal(w, np.inf)
    scale = np.min(w) if np.isfinite(np.min(w)) and np.min(w) > 0 else 1.0
    w4 = (w / scale) ** 4
    np.fill_diagonal(w4, 0.0)
    first = np.linspace(0, n - 1, min(starts, n)).astype(int)
    rows = np.arange(first.size)
    tours = np.empty((first.size, n), dtype=np.intp)
    left = np.broadcast_to(w, (first.size, n, n)).copy()  # visited GPUs' columns set to inf
    cur = first
    tours[:, 0] = cur
    left[rows, :, cur] = np.inf
    for k in range(1, n):  # nearest neighbour (the first of equals, as argmin gives)
        cur = left[rows, cur].argmin(axis=1)
        tours[:, k] = cur
        left[rows, :, cur] = np.inf
    # 2-opt may swap edges i and j only when they share no node: j >= i + 2, and not the
    # first edge with the closing one.
    idx = np.arange(n)
    fixed = idx[None, :] < idx[:, None] + 2
    fixed[0, n - 1] = True
    active = rows
    for _ in range(4 * n):  # each tour reverses t[i+1..j] at most 4n times
        # Edge i joins t[i] and tb[i] = t[i+1]; swapping edges i and j changes the sum by
        # w4[t_i, t_j] + w4[tb_i, tb_j] - w4[t_i, tb_i] - w4[t_j, tb_j].
        t = tours[active]
        tb = np.concatenate((t[:, 1:], t[:, :1]), axis=1)
        old = w4[t, tb]
        delta = (w4[t[:, :, None], t[:, None, :]] + w4[tb[:, :, None], tb[:, None, :]]
                 - old[:, :, None] - old[:, None, :])
        delta[:, fixed] = 0.0
        flat = delta.reshape(active.size, -1)
        at = flat.argmin(axis=1)
        better = flat[np.arange(active.size), at] < -1e-12 * np.maximum(1.0, old.sum(axis=1))
        for a in np.flatnonzero(better):
            i, j = divmod(int(at[a]), n)
            row = tours[active[a]]
            row[i + 1:j + 1] = row[i + 1:j + 1][::-1].copy()
        active = active[better]
        if not active.size:
            break
    return np.array(sorted({tuple(r) for r in tours.tolist()}), dtype=np.intp)


def interchangeable(bw: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Class id per GPU: GPUs ``u`` and ``v`` share a class when they see every other GPU
    with the same bandwidth and latency (e.g. the GPUs of one DT-FM region). Swapping them
    changes no cost, so partitions are compared by the classes in each group (an exact
    symmetry reduction). GPUs are bucketed by the sorted multiset of their links (a
    necessary condition), then compared exactly against each class's first member (the
    relation is transitive)."""
    n = bw.shape[0]
    cls = np.full(n, -1, dtype=np.intp)
    buckets: dict[bytes, list[int]] = {}
    reps: list[int] = []
    for u in range(n):
        row = np.delete(np.stack([bw[u], lat[u]], axis=1), u, axis=0)
        sig = row[np.lexsort(row.T[::-1])].tobytes()
        for r in buckets.setdefault(sig, []):
            diff = (bw[r] != bw[u]) | (lat[r] != lat[u])
            diff[[u, r]] = False
            if not diff.any():
                cls[u] = cls[r]
                break
        else:
            cls[u] = len(reps)
            reps.append(u)
            buckets[sig].append(u)
    return cls


def spanning_tree(w: list[list[float]]) -> float:
    """Weight of a minimum spanning tree of the complete graph ``w`` (Prim, O(p^2))."""
    p = len(w)
    dist = list(w[0])
    done = [False] * p
    done[0] = True
    total = 0.0
    for _ in range(p - 1):
        j = min((d, k) for k, d in enumerate(dist) if not done[k])[1]
        total += dist[j]
        done[j] = True
        row = w[j]
        dist = [min(a, b) for a, b in zip(dist, row, strict=True)]
    return total
