"""DT-FM's communication cost of a placement (sec 3): DP inside groups, PP between them, with lower
bounds."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from paraplan.search.evolutionary.inputs import RING_EXACT_MAX
from paraplan.search.evolutionary.ordering import (
    ORDER_EXACT_MAX,
    bottleneck_matching,
    exact_order,
    heuristic_order,
    subset_layers,
)
from paraplan.search.evolutionary.problem import Problem
from paraplan.search.evolutionary.rings import (
    heuristic_rings,
    interchangeable,
    ring_table,
    spanning_tree,
)


class Evaluator:
    """The cost model of one problem with memo tables (local to one search call).

    Groups, boundaries and partitions are memoised by their GPU *classes*
    (:func:`interchangeable`), so isomorphic partitions are costed once.
    """

    def __init__(self, prob: Problem) -> None:
        self.p = prob
        bw, lat = prob.pairs.bandwidth_Bps, prob.pairs.latency_s
        self.bw, self.lat = bw, lat
        # Seconds per pipeline message between two GPUs (DT-FM sec 3: alpha + c/beta).
        self.msg = lat + prob.pp_bytes / bw
        self.has_pp = prob.pp > 1 and prob.pp_bytes > 0
        self.cls = interchangeable(bw, lat)
        # The distinct per-stage gradient volumes (bytes) and each stage's index into them.
        self._vols, self._vol_of_stage = np.unique(prob.dp_bytes, return_inverse=True)
        self._rings: dict[int, np.ndarray] = {}
        self._group: dict[bytes, np.ndarray] = {}
        self._pair: dict[tuple[bytes, bytes], float] = {}
        self._cost: dict[bytes, tuple[float, float, float]] = {}
        self._above: dict[bytes, float] = {}  # partitions known to cost more than this
        self._bound: dict[bytes, float] = {}  # lower bounds of partitions not yet costed
        self._layers: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.evaluations = 0

    # -- keys -------------------------------------------------------------------------------
    def members(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(members, classes): the GPUs of each group (rows, ascending) and their sorted
        class ids, rows in a canonical order (lexicographic by classes)."""
        p, d = self.p.pp, self.p.dp
        members = np.argsort(labels, kind="stable").reshape(p, d)
        classes = np.sort(self.cls[members], axis=1)
        order = np.lexsort(classes.T[::-1])
        return members[order], classes[order]

    def key(self, labels: np.ndarray) -> bytes:
        """Partition key, equal for partitions equal up to group labels and interchangeable
        GPUs."""
        return self.members(labels)[1].tobytes()

    # -- DP: ring all-reduce per stage (DT-FM sec 3, data-parallel cost) --------------------------
    def group_costs(self, g: Sequence[int] | np.ndarray, key: bytes | None = None,
                    ) -> np.ndarray:
        """Seconds for group ``g`` to all-reduce ``dp_bytes[k]``, for each stage ``k``."""
        idx = np.asarray(g, dtype=np.intp)
        if key is None:
            key = np.sort(self.cls[idx]).tobytes()
        hit = self._group.get(key)
        if hit is not None:
            return hit
        s = self.p.dp_bytes
        n = idx.size
        if n == 1:
            out = np.zeros_like(s)
        else:
            sub = idx[:, None] * self.bw.shape[0] + idx[None, :]
            bw = self.bw.ravel()[sub]
            lat = self.lat.ravel()[sub]
            if self.p.dp_algorithm == "scatter_gather":
                # DT-FM sec 3: every GPU exchanges 1/n of the gradients with every other.
                inv = 1.0 / bw
                np.fill_diagonal(inv, 0.0)
                a = 2.0 * lat.sum(axis=1)
                b = 2.0 / n * inv.sum(axis=1)
                out = np.max(a[:, None] + b[:, None] * s[None, :], axis=0)
            else:
                if n <= RING_EXACT_MAX:
                    edges = self._rings.get(n)
                    if edges is None:  # flat (a*n + b) index of every ring's edges
                        rings = ring_table(n)
                        edges = self._rings[n] = rings * n + np.roll(rings, -1, axis=1)
                else:
                    rings = heuristic_rings(bw, lat, float(s.mean()))
                    edges = rings * n + np.roll(rings, -1, axis=1)
                b_min = bw.ravel()[edges].min(axis=1)
                l_max = lat.ravel()[edges].max(axis=1)
                # 2(n-1) alpha + 2(n-1)/n S/B for the best ring at each stage's volume.
                best = np.min(2 * (n - 1) * l_max[:, None]
                              + 2 * (n - 1) / n * self._vols[None, :] / b_min[:, None], axis=0)
                out = best[self._vol_of_stage]
            out = np.where(s > 0, out, 0.0)
        out.setflags(write=False)
        self._group[key] = out
        return out

    def ring_lower_bound(self, members: np.ndarray) -> np.ndarray:
        """(groups, stages) lower bound on :meth:`group_costs` without enumerating rings: in a
        ring every GPU has two neighbours, so the ring's slowest edge is no faster than any
        GPU's second-fastest link and its largest latency no smaller than any GPU's
        second-smallest (seconds)."""
        n = members.shape[1]
        s = self.p.dp_bytes
        if n == 1 or self.p.dp_algorithm != "ring":
            return np.stack([self.group_costs(row) for row in members])
        bw = np.sort(self.bw[members[:, :, None], members[:, None, :]], axis=2)
        lat = np.sort(self.lat[members[:, :, None], members[:, None, :]], axis=2)
        k = 1 if n == 2 else 2  # entry 0 of each row is the GPU itself (inf bw, 0 latency)
        b_ub = bw[:, :, n - 1 - k].min(axis=1)
        l_lb = lat[:, :, k].max(axis=1)
        out = 2 * (n - 1) * (l_lb[:, None] + s[None, :] / (n * b_ub[:, None]))
        return np.where(s[None, :] > 0, out, 0.0)

    # -- PP: bottleneck matching between two groups (DT-FM sec 3) ---------------------------
    def matching(self, a: Sequence[int], b: Sequence[int]) -> tuple[float, np.ndarray]:
        """(seconds per message of the slowest matched pair, ``match``): the replica on
        ``a[i]`` sends to ``b[match[i]]``; the bottleneck-optimal matching with the least
        total time among those."""
        if not self.has_pp:
            return 0.0, np.arange(len(a))
        return bottleneck_matching(self.msg[np.asarray(a)[:, None], np.asarray(b)[None, :]])

    def boundary(self, a: np.ndarray, b: np.ndarray, ka: bytes, kb: bytes) -> float:
        """Seconds per message across the boundary between groups ``a`` and ``b``, memoised
        by their classes ``ka`` and ``kb``."""
        if not self.has_pp:
            return 0.0
        key = (ka, kb) if ka <= kb else (kb, ka)
        hit = self._pair.get(key)
        if hit is None:
            hit = self._pair[key] = self.matching(a, b)[0]
        return hit

    # -- order along the pipeline (DT-FM sec 3, open-loop TSP) ------------------------------
    def layers(self, p: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        hit = self._layers.get(p)
        if hit is None:
            hit = self._layers[p] = subset_layers(p)
        return hit

    def best_order(self, w: np.ndarray, c: np.ndarray, cutoff: float = math.inf,
                   ) -> tuple[list[int], float, float] | None:
        """Order of groups minimising ``max_k c[g_k, k] + sum_k w[g_k, g_k+1]`` (seconds):
        (order, dp cost, pp cost); None if that exceeds ``cutoff``."""
        p = w.shape[0]
        if p == 1:
            found = [0], float(c[0, 0]), 0.0
        elif p <= ORDER_EXACT_MAX:
            return exact_order(w, c, self.layers(p), cutoff)
        else:
            found = heuristic_order(w, c)
        return None if found[1] + found[2] > cutoff else found

    # -- a whole partition ------------------------------------------------------------------
    def parts(self, members: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(c, b): DP seconds of each group at each stage, seconds per message of each
        boundary between two groups."""
        p = members.shape[0]
        keys = [row.tobytes() for row in classes]
        c = np.stack([self.group_costs(members[i], keys[i]) for i in range(p)])
        b = np.zeros((p, p))
        if self.has_pp:
            for i in range(p):
                for j in range(i + 1, p):
                    b[i, j] = b[j, i] = self.boundary(members[i], members[j], keys[i], keys[j])
        return c, b

    def lower_bound(self, labels: np.ndarray) -> float:
        """A cheap lower bound on :meth:`cost` (seconds), to skip hopeless swaps.

        DP: every group sits at some position and every position holds some group, so the
        DP cost is at least ``max(max_g min_k c[g,k], max_k min_g c[g,k])`` with ``c`` from
        :meth:`ring_lower_bound`. PP: a boundary's bottleneck matching is at least the
        largest row minimum and column minimum of its pair-cost matrix (every GPU needs a
        partner), and a pipeline path is a spanning tree of the groups, so ``2 m`` x the
        minimum spanning tree of those bounds (Prim) is at most the pipeline cost.
        """
        members, classes = self.members(labels)
        key = classes.tobytes()
        hit = self._cost.get(key)
        if hit is not None:
            return hit[0]
        known = self._bound.get(key)
        if known is not None:
            return known
        c = self.ring_lower_bound(members)
        bound = float(max(c.min(axis=1).max(), c.min(axis=0).max()))
        if self.has_pp:
            cost = self.msg[members[:, None, :, None], members[None, :, None, :]]
            w = np.maximum(cost.min(axis=3).max(axis=2), cost.min(axis=2).max(axis=2))
            bound += 2.0 * self.p.m * spanning_tree(w.tolist())
        self._bound[key] = bound
        return bound

    def cost(self, labels: np.ndarray, cutoff: float = math.inf,
             ) -> tuple[float, float, float] | None:
        """(total, dp, pp) seconds of the best order and matchings for partition ``labels``,
        or None when the total exceeds ``cutoff`` (known without finishing the search)."""
        members, classes = self.members(labels)
        key = classes.tobytes()
        hit = self._cost.get(key)
        if hit is not None:
            return hit if hit[0] <= cutoff else None
        if self._above.get(key, -math.inf) >= cutoff:
            return None
        c, b = self.parts(members, classes)
        found = self.best_order(2.0 * self.p.m * b, c, cutoff)
        if found is None:
            self._above[key] = max(cutoff, self._above.get(key, -math.inf))
            return None
        _, dp_c, pp_c = found
        hit = self._cost[key] = (dp_c + pp_c, dp_c, pp_c)
        self.evaluations += 1
        return hit

    def total(self, labels: np.ndarray) -> tuple[float, float, float]:
        """:meth:`cost` without a cutoff."""
        found = self.cost(labels)
        assert found is not None
        return found

    def placement(self, labels: np.ndarray) -> tuple[list[list[int]], tuple[float, ...],
                                                     tuple[float, ...], float, float]:
        """Groups in pipeline and replica order for partition ``labels``, with per-stage DP
        seconds, per-boundary seconds per message, dp cost and pp cost."""
        members, classes = self.members(labels)
        c, b = self.parts(members, classes)
        found = self.best_order(2.0 * self.p.m * b, c)
        assert found is not None
        order, dp_c, pp_c = found
        return self.ordered(members, order, c, b) + (dp_c, pp_c)

    def ordered(self, members: np.ndarray | Sequence[Sequence[int]], order: Sequence[int],
                c: np.ndarray, b: np.ndarray,
                ) -> tuple[list[list[int]], tuple[float, ...], tuple[float, ...]]:
        """Groups ``members`` laid out along ``order``, each boundary's bottleneck matching
        chaining the replicas; with per-stage DP seconds and per-boundary seconds."""
        seq = [list(map(int, members[i])) for i in order]
        groups = [seq[0]]
        for k in range(len(seq) - 1):
            _, match = self.matching(seq[k], seq[k + 1])
            partner = dict(zip(seq[k], (seq[k + 1][j] for j in match), strict=True))
            groups.append([partner[gpu] for gpu in groups[k]])
        stage = tuple(float(c[order[k], k]) for k in range(len(seq)))
        bound = tuple(float(b[order[k], order[k + 1]]) for k in range(len(seq) - 1))
        return groups, stage, bound
