"""DT-FM's hybrid genetic algorithm (sec 3): crossover and local search over group partitions."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from paraplan.search.evolutionary.evaluator import Evaluator
from paraplan.search.evolutionary.inputs import DpAlgorithm, Network
from paraplan.search.evolutionary.problem import (
    PlacementResult,
    int_at_least,
    make_problem,
    rng_from_seed,
)
from paraplan.specs.errors import SpecError


class _Search:
    """Operators of the memetic search; all randomness from one numpy Generator."""

    def __init__(self, ev: Evaluator, rng: np.random.Generator) -> None:
        self.ev, self.rng = ev, rng
        prob = ev.p
        self.n, self.pp, self.dp = prob.pp * prob.dp, prob.pp, prob.dp
        # Pairwise surrogate weights, each normalised by its mean: t_dp is the ring time if the
        # two GPUs' link were a stage's bottleneck (DP wants such pairs in one group), t_pp
        # the pipeline time if they were matched across every boundary (PP wants slow pairs
        # kept apart, i.e. inside one group, and fast pairs in consecutive groups).
        n_dp = max(prob.dp, 2)
        s_ref = float(prob.dp_bytes.mean())
        t_dp = 2 * (n_dp - 1) * (ev.lat + s_ref / (n_dp * ev.bw))
        t_pp = 2.0 * prob.m * ev.msg if ev.has_pp else np.zeros_like(ev.lat)
        off = ~np.eye(self.n, dtype=bool)
        self.t_dp = t_dp / max(float(t_dp[off].mean()) if off.any() else 1.0, 1e-300)
        mean_pp = float(t_pp[off].mean()) if off.any() else 0.0
        self.t_pp = t_pp / mean_pp if mean_pp > 0 else t_pp
        np.fill_diagonal(self.t_dp, 0.0)
        np.fill_diagonal(self.t_pp, 0.0)
        self.iu, self.iv = np.triu_indices(self.n, 1)

    def random_labels(self) -> np.ndarray:
        labels = np.empty(self.n, dtype=np.intp)
        labels[self.rng.permutation(self.n)] = np.repeat(np.arange(self.pp), self.dp)
        return labels

    def crossover(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Group-preserving crossover: each group of ``a`` is inherited with probability
        ``f ~ U(0, 1)`` (drawn per child), then each group of ``b`` disjoint from those with
        the same probability; the leftover GPUs form the remaining groups, shuffled at random
        or (half of the time) dealt out by class like cards, which gives groups of equal
        class composition: consecutive stages whose GPUs pair up inside a region."""
        pp, dp = self.pp, self.dp
        ga = np.argsort(a, kind="stable").reshape(pp, dp)
        gb = np.argsort(b, kind="stable").reshape(pp, dp)
        used = np.zeros(self.n, dtype=bool)
        chosen = []
        f = self.rng.random()
        for k in np.flatnonzero(self.rng.random(pp) < f):
            chosen.append(ga[k])
            used[ga[k]] = True
        for k in self.rng.permutation(pp):
            if not used[gb[k]].any() and self.rng.random() < f:
                chosen.append(gb[k])
                used[gb[k]] = True
        rest = np.flatnonzero(~used)
        self.rng.shuffle(rest)
        left = rest.size // dp
        if self.rng.random() < 0.5:  # deal by class: group j gets rest[j], rest[j+left], ...
            rest = rest[np.argsort(self.ev.cls[rest], kind="stable")]
            chosen.extend(rest.reshape(dp, left).T)
        else:
            chosen.extend(rest.reshape(left, dp))
        child = np.empty(self.n, dtype=np.intp)
        for k, g in enumerate(chosen):
            child[g] = k
        return child

    def mutate(self, labels: np.ndarray) -> np.ndarray:
        """Swap ``Geometric(1/2)`` (1 or more) random pairs of GPUs in different groups and of
        different classes (swapping interchangeable GPUs would change nothing)."""
        out = labels.copy()
        cls = self.ev.cls
        for _ in range(int(self.rng.geometric(0.5))):
            u = int(self.rng.integers(self.n))
            others = np.flatnonzero((out != out[u]) & (cls != cls[u]))
            if others.size == 0:
                others = np.flatnonzero(out != out[u])
            v = int(others[self.rng.integers(others.size)])
            out[u], out[v] = out[v], out[u]
        return out

    def swap_gains(self, labels: np.ndarray, dp_share: float) -> np.ndarray:
        """Kernighan-Lin gain of swapping each pair (u, v) under the surrogate objective
        ``sum over same-group pairs of (dp_share*t_dp - (1-dp_share)*t_pp)``, vectorised:
        ``gain[u, v] = S[u,A] + S[v,B] - S[u,B] - S[v,A] + 2 w(u,v)`` with ``S[x, G]`` the
        weight from ``x`` to group ``G``."""
        w = dp_share * self.t_dp - (1.0 - dp_share) * self.t_pp
        onehot = np.zeros((self.n, self.pp))
        onehot[np.arange(self.n), labels] = 1.0
        s = w @ onehot
        own = s[np.arange(self.n), labels]
        cross = s[:, labels]  # [u, v] = S[u, group of v]
        return own[:, None] + own[None, :] - cross - cross.T + 2.0 * w

    def candidates(self, labels: np.ndarray, dp_share: float) -> tuple[np.ndarray, np.ndarray]:
        """Swaps (u, v) that change the partition, best surrogate gain first (random
        tie-breaks), one per distinct outcome (group and class of both ends)."""
        u, v = self.iu, self.iv
        cls, nc = self.ev.cls, int(self.ev.cls.max()) + 1
        keep = np.flatnonzero((labels[u] != labels[v]) & (cls[u] != cls[v]))
        if keep.size == 0:
            return keep, keep
        gain = self.swap_gains(labels, dp_share)[u[keep], v[keep]]
        noise = self.rng.random(keep.size) * 1e-9 * (float(np.abs(gain).max()) + 1.0)
        keep = keep[np.argsort(-(gain + noise), kind="stable")]
        a = labels[u[keep]] * nc + cls[u[keep]]
        b = labels[v[keep]] * nc + cls[v[keep]]
        code = np.minimum(a, b) * (self.pp * nc) + np.maximum(a, b)
        _, first = np.unique(code, return_index=True)
        keep = keep[np.sort(first)]
        return u[keep], v[keep]

    def local_search(self, labels: np.ndarray, budget: int) -> tuple[np.ndarray, float]:
        """Kernighan-Lin-style swaps (DT-FM sec 3's local search): candidates from
        :meth:`candidates`, screened by :meth:`Evaluator.lower_bound` and costed exactly;
        the first improving swap is taken and the gains recomputed. At a local optimum one
        sideways swap (equal cost, to a partition not seen in this search) may be taken,
        since improvements on these bottleneck objectives often need two swaps (KL's
        tentative moves). At most ``budget`` swaps are costed exactly, ``8 * budget``
        screened."""
        total, dp_c, _ = self.ev.total(labels)
        if self.pp == 1 or budget <= 0:
            return labels, total
        exact, screened, sideways = 0, 0, 1
        seen = {self.ev.key(labels)}
        while exact < budget and screened < 8 * budget:
            share = dp_c / total if total > 0 else 0.5
            moved = False
            plateau: tuple[np.ndarray, float, float] | None = None
            for u, v in zip(*self.candidates(labels, share), strict=True):
                if exact >= budget or screened >= 8 * budget:
                    break
                cand = labels.copy()
                cand[u], cand[v] = labels[v], labels[u]
                screened += 1
                if self.ev.lower_bound(cand) > total * (1 + 1e-12):
                    continue
                exact += 1
                found = self.ev.cost(cand, total * (1 + 1e-12))
                if found is None:
                    continue
                c_total, c_dp, _ = found
                if c_total < total * (1 - 1e-12):
                    labels, total, dp_c, moved = cand, c_total, c_dp, True
                    seen.add(self.ev.key(labels))
                    break
                if (plateau is None and sideways and c_total <= total * (1 + 1e-12)
                        and self.ev.key(cand) not in seen):
                    plateau = (cand, c_total, c_dp)
            if not moved and plateau is not None:
                labels, total, dp_c = plateau
                seen.add(self.ev.key(labels))
                sideways -= 1
                moved = True
            if not moved:
                break
        return labels, total


def evolutionary_placement(network: Network, pp: int, dp: int,
                           dp_bytes: float | Sequence[float], pp_bytes: float,
                           num_microbatches: int = 1, *,
                           seed: int | np.random.Generator | None = 0,
                           population_size: int = 16, generations: int = 20,
                           crossover_rate: float = 0.9, mutation_rate: float = 0.5,
                           immigrant_rate: float = 0.2,
                           local_search_evals: int = 10, patience: int | None = None,
                           num_gpus: int | None = None,
                           dp_algorithm: DpAlgorithm = "ring") -> PlacementResult:
    """Place ``pp x dp`` tasklets on GPUs ``0..pp*dp-1`` of ``network`` with DT-FM's hybrid
    genetic algorithm (Yuan et al. 2022 sec 3: a memetic algorithm for balanced graph
    partitioning, GCMA in the reference scheduler).

    Each individual is a balanced partition of the GPUs into ``pp`` groups; its fitness is the
    exact cost of its best pipeline order and replica matchings (module docstring, DT-FM
    sec 3). A generation breeds ``population_size`` children: binary-tournament parents,
    group-preserving crossover (probability ``crossover_rate``, else a copy of one parent),
    swap mutation (probability ``mutation_rate``) and a local search of up to
    ``local_search_evals`` swaps; a fraction ``immigrant_rate`` of the children are random
    partitions instead (locally searched too), which keeps the search from settling in one
    basin of these multi-modal landscapes. Parents and children then compete (the best
    ``population_size`` distinct partitions survive, so the best cost never rises; random
    immigrants refill a population short of distinct partitions). Stops after
    ``generations``, or after ``patience`` generations without improvement. Unlike DT-FM
    (random initial population) the rank-order partition is one of the initial individuals,
    so the result never costs more than :func:`rank_order_placement`.

    Args:
        network: a ClusterSpec (its ``topology`` gives the pair costs) or PairMatrices.
        dp_bytes: per-GPU gradient bytes all-reduced per step, one per stage or one for all.
        pp_bytes: activation bytes per micro-batch per boundary, each direction.
        num_microbatches: micro-batches per step per replica (``m``).
        seed: int seed or numpy Generator; the same int gives the same result.
        num_gpus: place on the first ``num_gpus`` GPUs (default: all of the network's).
        dp_algorithm: "ring" (default) or DT-FM's "scatter_gather" estimate.

    Returns:
        PlacementResult with ``history`` = (best, mean) cost per generation, seconds.
    """
    prob = make_problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches, num_gpus,
                    dp_algorithm)
    pop_size = int_at_least("population_size", population_size, 2)
    gens = int_at_least("generations", generations, 0)
    ls_evals = int_at_least("local_search_evals", local_search_evals, 0)
    for name, rate in (("crossover_rate", crossover_rate), ("mutation_rate", mutation_rate),
                       ("immigrant_rate", immigrant_rate)):
        if not 0.0 <= float(rate) <= 1.0:
            raise SpecError(f"{name}={rate!r} must be in [0, 1]", field=name, value=rate,
                            allowed="0..1")
    if patience is not None:
        patience = int_at_least("patience", patience, 1)
    rng, seed_int = rng_from_seed(seed)
    start = time.perf_counter()
    ev = Evaluator(prob)
    ops = _Search(ev, rng)

    def individual(labels: np.ndarray) -> tuple[float, bytes, np.ndarray]:
        labels, total = ops.local_search(labels, ls_evals)
        return total, ev.key(labels), labels

    def survivors(cands: list[tuple[float, bytes, np.ndarray]],
                  ) -> list[tuple[float, bytes, np.ndarray]]:
        """The best ``pop_size`` distinct partitions; random immigrants (not locally
        searched) fill the population when too few distinct ones remain."""
        seen: dict[bytes, tuple[float, bytes, np.ndarray]] = {}
        for ind in cands:
            seen.setdefault(ind[1], ind)
        for _ in range(2 * pop_size):
            if len(seen) >= pop_size:
                break
            labels = ops.random_labels()
            seen.setdefault(ev.key(labels), (ev.total(labels)[0], ev.key(labels), labels))
        return sorted(seen.values(), key=lambda ind: (ind[0], ind[1]))[:pop_size]

    # Megatron's rank order joins the random initial population, so the search never
    # returns a partition worse than the naive baseline's.
    rank_order = np.repeat(np.arange(prob.pp), prob.dp)
    pop = survivors([individual(rank_order)]
                    + [individual(ops.random_labels()) for _ in range(pop_size - 1)])
    history = [(pop[0][0], float(np.mean([ind[0] for ind in pop])))]
    gens_run, stale = 0, 0
    for _ in range(gens):
        children = []
        for _ in range(pop_size):
            if rng.random() < immigrant_rate:  # random immigrant: a fresh basin
                children.append(individual(ops.random_labels()))
                continue
            i, j = rng.integers(len(pop), size=2)
            p1 = pop[min(i, j)]  # binary tournament: pop is sorted best first
            if ops.pp > 1 and rng.random() < crossover_rate:
                k, q = rng.integers(len(pop), size=2)
                child = ops.crossover(p1[2], pop[min(k, q)][2])
            else:
                child = p1[2].copy()
            if ops.pp > 1 and rng.random() < mutation_rate:
                child = ops.mutate(child)
            children.append(individual(child))
        prev_best = pop[0][0]
        pop = survivors(pop + children)
        gens_run += 1
        history.append((pop[0][0], float(np.mean([ind[0] for ind in pop]))))
        stale = 0 if pop[0][0] < prev_best * (1 - 1e-12) else stale + 1
        if patience is not None and stale >= patience:
            break
    groups, stage, bound, dp_c, pp_c = ev.placement(pop[0][2])
    return PlacementResult(groups, dp_c + pp_c, dp_c, pp_c, history, gens_run, seed_int,
                           stage, bound, ev.evaluations, time.perf_counter() - start)
