"""Fixed placements: rank order, random, and exhaustive over set partitions (small cases, ground
truth)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence

import numpy as np

from paraplan.search.evolutionary.evaluator import Evaluator
from paraplan.search.evolutionary.inputs import DpAlgorithm, Network
from paraplan.search.evolutionary.problem import PlacementResult, make_problem, rng_from_seed
from paraplan.specs.errors import SpecError


def _fixed_result(ev: Evaluator, groups: list[list[int]], seed: int | None = None,
                  ) -> PlacementResult:
    """Cost of ``groups`` exactly as given (order and replica matching fixed; each group's
    ring order is still chosen by the cost model)."""
    prob = ev.p
    stage = tuple(float(ev.group_costs(g)[k]) for k, g in enumerate(groups))
    bound = tuple(
        float(ev.msg[groups[k], groups[k + 1]].max()) if ev.has_pp else 0.0
        for k in range(prob.pp - 1)
    )
    dp_c = max(stage)
    pp_c = 2.0 * prob.m * sum(bound)
    return PlacementResult([list(map(int, g)) for g in groups], dp_c + pp_c, dp_c, pp_c,
                           seed=seed, stage_dp_cost_s=stage, boundary_cost_s=bound)


def placement_cost(network: Network, groups: Sequence[Sequence[int]],
                   dp_bytes: float | Sequence[float], pp_bytes: float,
                   num_microbatches: int = 1, *, num_gpus: int | None = None,
                   dp_algorithm: DpAlgorithm = "ring") -> PlacementResult:
    """Communication cost (seconds per step) of a given placement: ``groups[k][i]`` = the GPU
    of stage ``k`` of replica ``i`` (DT-FM sec 3). ``groups`` must use every GPU of
    ``0..pp*dp-1`` exactly once."""
    rows = [list(map(int, g)) for g in groups]
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        raise SpecError("groups must be pp lists of dp GPU indices each", field="groups")
    pp, dp = len(rows), len(rows[0])
    prob = make_problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches,
                    pp * dp if num_gpus is None else num_gpus, dp_algorithm)
    flat = sorted(x for r in rows for x in r)
    if flat != list(range(pp * dp)):
        raise SpecError(f"groups must use each of the GPUs 0..{pp * dp - 1} exactly once",
                        field="groups", value=rows)
    return _fixed_result(Evaluator(prob), rows)


def rank_order_placement(network: Network, pp: int, dp: int,
                         dp_bytes: float | Sequence[float], pp_bytes: float,
                         num_microbatches: int = 1, *, num_gpus: int | None = None,
                         dp_algorithm: DpAlgorithm = "ring") -> PlacementResult:
    """The naive placement: stage ``k`` runs on GPUs ``[k*dp, (k+1)*dp)`` in index order,
    replica ``i`` on the ``i``-th GPU of each stage (Megatron's rank order with tp=1, the
    baseline of DT-FM's evaluation), pipeline order and matchings not optimised."""
    prob = make_problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches, num_gpus,
                    dp_algorithm)
    groups = [list(range(k * dp, (k + 1) * dp)) for k in range(pp)]
    return _fixed_result(Evaluator(prob), groups)


def random_placement(network: Network, pp: int, dp: int, dp_bytes: float | Sequence[float],
                     pp_bytes: float, num_microbatches: int = 1, *,
                     seed: int | np.random.Generator | None = 0, num_gpus: int | None = None,
                     dp_algorithm: DpAlgorithm = "ring") -> PlacementResult:
    """A uniformly random assignment of tasklets to GPUs (DT-FM's random-scheduler
    baseline), costed as given."""
    prob = make_problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches, num_gpus,
                    dp_algorithm)
    rng, seed_int = rng_from_seed(seed)
    perm = rng.permutation(pp * dp).reshape(pp, dp)
    return _fixed_result(Evaluator(prob), perm.tolist(), seed_int)


def _set_partitions(items: tuple[int, ...], size: int,
                    ) -> Iterator[list[tuple[int, ...]]]:
    """All partitions of ``items`` into unordered blocks of ``size`` (the smallest item
    anchors each block, so each partition appears once)."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for others in itertools.combinations(rest, size - 1):
        remaining = tuple(x for x in rest if x not in others)
        for tail in _set_partitions(remaining, size):
            yield [(head, *others), *tail]


def exhaustive_placement(network: Network, pp: int, dp: int,
                         dp_bytes: float | Sequence[float], pp_bytes: float,
                         num_microbatches: int = 1, *, num_gpus: int | None = None,
                         dp_algorithm: DpAlgorithm = "ring",
                         max_placements: int = 5_000_000) -> PlacementResult:
    """Ground truth by brute force: every partition, every order of its groups (all pp!
    permutations) and every replica matching of each boundary (all dp! permutations).

    Rings use the same exact enumeration as the search (dp <= 8). Raises ValueError when
    partitions x orders exceeds ``max_placements`` (8 GPUs: 35 partitions for pp=2, 105 for
    pp=4).
    """
    prob = make_problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches, num_gpus,
                    dp_algorithm)
    n = pp * dp
    count = math.factorial(n) // (math.factorial(dp) ** pp * math.factorial(pp))
    if count * math.factorial(pp) > max_placements:
        raise SpecError(
            f"exhaustive search over {count} partitions x {math.factorial(pp)} orders exceeds "
            f"max_placements={max_placements}; use evolutionary_placement",
            field="max_placements", value=count * math.factorial(pp))
    start = time.perf_counter()
    ev = Evaluator(prob)
    orders = np.array(list(itertools.permutations(range(pp))), dtype=np.intp)
    matchings = np.array(list(itertools.permutations(range(dp))), dtype=np.intp)
    rows = np.arange(dp)
    best: tuple[float, list[tuple[int, ...]], np.ndarray] | None = None
    for part in _set_partitions(tuple(range(n)), dp):
        c = np.stack([ev.group_costs(g) for g in part])
        b = np.zeros((pp, pp))
        if ev.has_pp:
            for i in range(pp):
                for j in range(i + 1, pp):
                    cost = ev.msg[np.ix_(part[i], part[j])]
                    b[i, j] = b[j, i] = cost[rows, matchings].max(axis=1).min()
        dp_c = c[orders, np.arange(pp)].max(axis=1)
        pp_c = 2.0 * prob.m * b[orders[:, :-1], orders[:, 1:]].sum(axis=1)
        tot = dp_c + pp_c
        k = int(np.argmin(tot))
        if best is None or tot[k] < best[0]:
            best = (float(tot[k]), part, orders[k])
    assert best is not None
    _, part, order = best
    c = np.stack([ev.group_costs(g) for g in part])
    b = np.zeros((pp, pp))
    for i in range(pp):
        for j in range(i + 1, pp):
            b[i, j] = b[j, i] = ev.matching(part[i], part[j])[0]
    groups, stage, bound = ev.ordered(part, order.tolist(), c, b)
    res = _fixed_result(ev, groups)
    return PlacementResult(res.groups, res.cost_s, res.dp_cost_s, res.pp_cost_s,
                           stage_dp_cost_s=stage, boundary_cost_s=bound, evaluations=count,
                           search_time_s=time.perf_counter() - start)
