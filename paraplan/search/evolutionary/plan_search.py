"""Plan search with placement (``paraplan best --searcher evolutionary``): shapes shortlisted on a
uniform view, then placed and verified by ``simulate``."""

from __future__ import annotations

import time

import numpy as np

from paraplan.search.evolutionary.fixed import rank_order_placement
from paraplan.search.evolutionary.genetic import evolutionary_placement
from paraplan.search.evolutionary.inputs import PairMatrices, comm_volumes
from paraplan.search.evolutionary.problem import PlacementResult
from paraplan.simulator.step import StepReport
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec
from paraplan.specs.training import TrainingSpec

SHORTLIST = 12
"""Distinct plan shapes (tp, pp, dp, cp, ep, vpp) taken from the uniform-view ranking."""
VARIANTS = 4
"""Fastest variants (ZeRO, recompute, micro-batch, schedule) kept per shortlisted shape."""
PLACED = 3
"""Of those, the fastest shapes (simulated on the real network in rank order) get a GA
placement (each with all its shortlisted ZeRO / recompute / schedule variants)."""


def uniform_view(cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` as one node group of its slowest GPU type on its first group's links and
    node shape: what a topology-oblivious planner assumes. Used to shortlist plan shapes (the
    vectorized space needs one GPU type); every shortlisted plan is then simulated on the real
    cluster. The GPU kept is the one with the least memory (then the lowest peak FLOP/s), so
    a shape that fits the view fits every GPU of the cluster."""
    if cluster.is_homogeneous:
        return cluster
    groups = cluster.node_groups
    gpn = min(g.gpus_per_node for g in groups)
    n = cluster.num_gpus
    if n % gpn:
        raise SpecError(f"cluster {cluster.name!r} mixes node sizes whose smallest "
                        f"({gpn} GPUs) does not divide its {n} GPUs", field="cluster",
                        value=cluster.name)
    slow = min(groups, key=lambda g: (g.gpu.memory_GiB, max(g.gpu.peak_tflops.values())))
    first = next(g for g in groups if g.gpus_per_node == gpn)
    group = first.model_copy(update={"gpu": slow.gpu, "num_nodes": n // gpn,
                                     "region": "default", "name": "uniform"})
    return ClusterSpec(name=f"{cluster.name}-uniform", node_groups=[group])


def _slot_matrices(cluster: ClusterSpec, unit: int) -> tuple[np.ndarray, PairMatrices]:
    """First GPU of every aligned block of ``unit`` GPUs, and the pair costs between them."""
    topo = cluster.topology
    slots = np.arange(0, cluster.num_gpus, unit)
    a, b = (x.ravel() for x in np.meshgrid(slots, slots, indexing="ij"))
    bw, lat, _ = topo._pairs(a, b, shared=True)
    k = slots.size
    return slots, PairMatrices(np.asarray(bw, float).reshape(k, k) * 1e9,
                               np.asarray(lat, float).reshape(k, k))


def _placement_of(groups: list[list[int]], slots: np.ndarray, unit: int) -> list[int]:
    """Rank -> GPU for a (stage, replica) -> slot assignment: the tasklet of stage k and
    replica i (ranks ``(i + dp*k)*unit .. +unit`` in Megatron order, unit = tp*cp) runs on
    the ``unit`` consecutive GPUs of slot ``groups[k][i]``."""
    out: list[int] = []
    for row in groups:
        for s in row:
            base = int(slots[s])
            out.extend(range(base, base + unit))
    # out lists ranks stage-major, replica next, tp*cp innermost: exactly Megatron's order.
    return out


def _shape(plan: dict) -> tuple:
    return tuple(plan.get(k) for k in ("tp", "pp", "dp", "cp", "ep", "virtual_stages"))


def evolutionary_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
                        fix: dict | None = None, top: int = 10, options=None,
                        progress=None, seed: int = 0, shortlist: int = SHORTLIST,
                        placed: int = PLACED, generations: int = 20,
                        population_size: int = 16, trainer: TrainerSpec | None = None):
    """Best plans with topology-aware placement (DT-FM sec 3), for ``paraplan best``.

    1. Shortlist: rank every legal plan shape with the vectorized exhaustive search on the
       cluster's :func:`uniform_view` (one GPU type, uniform links) and keep ``shortlist``.
    2. Simulate each on the real cluster in Megatron rank order (``placement`` = identity):
       the best of these is ``baseline_step_time_s``, what topology-oblivious placement gets.
    3. For the ``placed`` fastest, place the (stage, replica) tasklets - blocks of tp*cp GPUs,
       so TP/CP groups stay together - with :func:`evolutionary_placement` on the pair costs
       between blocks, and simulate the placed plan (``simulate`` prices every stage's DP
       group and every boundary on the GPUs the placement uses). A placement that the
       simulator does not find faster than rank order is dropped.

    The GA minimises DT-FM's communication cost; compute heterogeneity (mixed GPU types) is
    only seen by ``simulate``'s verification - the ILP searcher models it. Times in seconds.
    Returns a :class:`~paraplan.search.exhaustive.SearchResult` whose ``extra["placements"]``
    lists, per placed shape, the DT-FM cost of rank order and of the GA placement, the
    simulated step times and the GA's convergence (best cost per generation).

    With a ``trainer``, only shapes it can express; a trainer that places ranks in its own
    order (every profiled trainer) gets the rank-order plans only.
    """
    from paraplan.search.exhaustive import SearchResult, rank_key
    from paraplan.search.space import build_space, evaluate_space
    from paraplan.simulator.step import simulate

    start = time.perf_counter()
    if top < 1:
        raise SpecError("top must be >= 1", field="top", value=top)
    view = uniform_view(cluster)
    space = build_space(model, view, training, fix, options, trainer)
    if trainer is not None and not trainer.can.placement:
        placed = 0
    if len(space) == 0:
        reasons = ", ".join(f"{k:,} {r}" for r, k in space.rejected.most_common(3))
        raise SpecError(f"no legal plan for {model.name} on {cluster.num_gpus} GPUs of "
                        f"{cluster.name}" + (f" ({reasons})" if reasons else ""),
                        field="plan", value=str(fix or {}))
    ev = evaluate_space(space, None, exact_interleaved=False)
    ok = np.nonzero(ev.feasible & np.isfinite(ev.step_time_s))[0]
    if ok.size == 0:
        raise SpecError(f"no plan of {model.name} fits in the memory of {cluster.name!r}'s "
                        f"smallest GPU ({view.gpu.name}, {view.gpu.memory_GiB:g} GiB)",
                        field="memory", value=view.gpu.memory_GiB)
    n = cluster.num_gpus
    identity = list(range(n))
    # The best ``VARIANTS`` rows (ZeRO, recompute, micro-batch, schedule) of each of the
    # ``shortlist`` fastest shapes (tp, pp, dp, cp, ep, vpp) on the uniform view: on slow
    # links the shape decides what crosses the network, so every shape gets a chance.
    cols = space.cols
    order = ok[np.argsort(ev.step_time_s[ok], kind="stable")]
    per_shape: dict[tuple, int] = {}
    keep = []
    for i in order.tolist():
        key = tuple(int(cols[k][i]) for k in ("tp", "pp", "dp", "cp", "ep", "v"))
        if key not in per_shape:
            if len(per_shape) >= shortlist:
                continue
            per_shape[key] = 0
        if per_shape[key] < VARIANTS:
            per_shape[key] += 1
            keep.append(space.plan(i))
        if len(per_shape) >= shortlist and all(v >= VARIANTS for v in per_shape.values()):
            break
    rank_order: list[tuple[StepReport, ParallelPlan]] = []
    for plan in keep:
        r = simulate(model, cluster, training, plan.model_copy(update={"placement": identity}))
        if r.feasible and r.step_time_s is not None:
            rank_order.append((r, plan))
    if not rank_order:
        raise SpecError(f"none of the {len(keep)} fastest plans of the uniform "
                        f"view fits {cluster.name!r} once simulated on its real GPUs",
                        field="cluster", value=cluster.name)
    rank_order.sort(key=lambda x: rank_key(x[0]))
    baseline = rank_order[0][0].step_time_s
    reports = [r for r, _ in rank_order]
    info: list[dict] = []
    cache: dict[tuple, PlacementResult] = {}
    seen: set[tuple] = set()
    chosen: list[tuple] = []  # the ``placed`` fastest shapes on the real cluster
    for r, _ in rank_order:
        if _shape(r.plan) not in chosen and len(chosen) < placed:
            chosen.append(_shape(r.plan))
    todo = [(r, p) for r, p in rank_order if _shape(r.plan) in chosen]
    for j, (base_rep, plan) in enumerate(todo):
        dp = plan.resolved_dp(n)
        unit = plan.tp * plan.cp
        if plan.pp * dp < 2:
            continue
        slots, pairs = _slot_matrices(cluster, unit)
        vol = comm_volumes(model, training, plan, n, model_parallel=True)
        key = (plan.pp, dp, unit, vol.dp_bytes, vol.pp_bytes, vol.num_microbatches)
        if key not in cache:
            cache[key] = evolutionary_placement(
                pairs, plan.pp, dp, vol.dp_bytes, vol.pp_bytes, vol.num_microbatches,
                seed=seed, generations=generations, population_size=population_size,
                patience=max(3, generations // 4))
        res = cache[key]
        naive = rank_order_placement(pairs, plan.pp, dp, vol.dp_bytes, vol.pp_bytes,
                                     vol.num_microbatches)
        placed_plan = plan.model_copy(update={"placement": _placement_of(res.groups, slots,
                                                                         unit)})
        rep = simulate(model, cluster, training, placed_plan)
        kept = bool(rep.feasible and rep.step_time_s is not None
                    and rep.step_time_s < base_rep.step_time_s * (1 - 1e-9))
        if kept:
            rep.extra.update(placement_comm_cost_s=res.cost_s,
                             rank_order_comm_cost_s=naive.cost_s,
                             rank_order_step_time_s=base_rep.step_time_s)
            reports.append(rep)
        if key not in seen:  # one row per GA run (its fastest variant)
            seen.add(key)
            info.append({"plan": plan.short(), "rank_order_step_time_s": base_rep.step_time_s,
                         "placed_step_time_s": rep.step_time_s if rep.feasible else None,
                         "kept": kept, "rank_order_comm_cost_s": naive.cost_s,
                         "placement_comm_cost_s": res.cost_s,
                         "generations": res.generations_run, "evaluations": res.evaluations,
                         "convergence_s": [round(b, 6) for b, _ in res.history]})
        if progress:
            progress(j + 1, len(todo))
    reports.sort(key=rank_key)
    notes = [f"plan shapes shortlisted on {view.name} (one GPU type, uniform links), then "
             "simulated on the real cluster in rank order (the baseline) and, for the "
             f"{len(chosen)} fastest shapes, with a DT-FM genetic placement of their "
             "(stage, replica) tasklets, kept where simulate finds it faster"]
    if trainer is not None and not trainer.can.placement:
        notes.append(f"{trainer.label} places ranks in its own order, so no GA placement was "
                     "searched (--trainer generic to see what placement would buy)")
    return SearchResult(
        searcher="evolutionary", plans_evaluated=len(space) + len(keep),
        search_time_s=time.perf_counter() - start, reports=reports[:top],
        baseline_step_time_s=baseline, rejected=dict(space.rejected),
        considered=space.considered,
        notes=notes, extra={"placements": info, "seed": seed})
