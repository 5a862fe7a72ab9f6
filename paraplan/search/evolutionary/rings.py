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
    time ``lat + s_ref/(n bw)`` (seconds), then 2-opt on its 4th power (an additive stand-in
    for the bottleneck objective)."""
    n = bw.shape[0]
    w = lat + s_ref / (n * bw)
    np.fill_diagonal(w, np.inf)
    scale = np.min(w) if np.isfinite(np.min(w)) and np.min(w) > 0 else 1.0
    w4 = (w / scale) ** 4
    np.fill_diagonal(w4, 0.0)
    rings = []
    for start in np.linspace(0, n - 1, min(starts, n)).astype(int):
        tour = [int(start)]
        free = np.ones(n, bool)
        free[start] = False
        for _ in range(n - 1):
            cand = np.where(free, w[tour[-1]], np.inf)
            nxt = int(np.argmin(cand))
            tour.append(nxt)
            free[nxt] = False
        t = np.array(tour)
        for _ in range(4 * n):  # 2-opt: reverse t[i+1..j]
            a, b = t, np.roll(t, -1)
            old = w4[a, b]
            delta = (w4[a[:, None], a[None, :]] + w4[b[:, None], b[None, :]]
                     - old[:, None] - old[None, :])
            delta = np.triu(delta, 2)  # edges i and j must not share a node ...
            delta[0, n - 1] = 0.0  # ... including the closing edge of the ring
            i, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
            if delta[i, j] >= -1e-12 * max(1.0, old.sum()):
                break
            t = np.concatenate([t[:i + 1], t[i + 1:j + 1][::-1], t[j + 1:]])
        rings.append(t)
    return np.unique(np.array(rings), axis=0)


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
