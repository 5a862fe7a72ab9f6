"""Pareto fronts: throughput vs memory headroom vs dollars per hour.

Every plan of every cluster size is evaluated by the vectorized evaluator; a plan is on the
front when no other plan is at least as good on all three objectives (tokens/s higher,
memory headroom per GPU higher, cluster $/hour lower) and better on one. Within one cluster
size every plan costs the same per hour, so each size's 2-D front (tokens/s vs headroom) is
found by one sort; the sizes' fronts are then merged by the 3-D dominance check. The
finalists are re-simulated so the numbers are ``simulate()``'s. Prices come from the GPU
profiles (``price_per_hour_usd``, a public on-demand price; None when no public price exists).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from paraplan.search.moe_runs import moe_runs, run_fields
from paraplan.search.space import PlanSpace, SpaceOptions, evaluate_space
from paraplan.search.space.build import run_spaces
from paraplan.simulator.step import simulate
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.trainer import TrainerSpec, trainer_training
from paraplan.specs.training import TrainingSpec


@dataclass(frozen=True)
class ParetoPoint:
    """One plan on the front (seconds, tokens/s, GiB, US dollars)."""

    plan_short: str
    nodes: int
    num_gpus: int
    step_time_s: float
    tokens_per_s: float
    mfu: float
    memory_peak_gib: float
    headroom_gib: float
    dollars_per_hour: float | None
    dollars_per_million_tokens: float | None
    plan: dict[str, Any]
    moe_dispatcher: str | None = None
    """MoE models: the token dispatcher the plan was priced with (``search.run_training``)."""
    moe_a2a_overlap: bool | None = None
    """MoE models: whether it was priced with the expert-parallel all-to-all overlap."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pareto_mask(objectives: np.ndarray, maximize: tuple[bool, ...]) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``objectives`` (n x k).

    Row a dominates row b when a is at least as good on every column and better on one.
    Duplicated rows are all kept. O(n * front) with numpy.
    """
    obj = np.asarray(objectives, dtype=float)
    if obj.ndim != 2 or obj.shape[1] != len(maximize):
        raise ValueError("objectives must be n x len(maximize)")
    signed = np.where(np.array(maximize), obj, -obj)  # larger is better everywhere
    n = signed.shape[0]
    keep = np.ones(n, dtype=bool)
    order = np.lexsort(signed.T[::-1])[::-1]  # best first on the first column
    for i in order:
        if not keep[i]:
            continue
        ge = np.all(signed >= signed[i], axis=1)
        gt = np.any(signed > signed[i], axis=1)
        if np.any(ge & gt & keep):
            keep[i] = False
            continue
        # i survives; drop everything i dominates.
        dominated = np.all(signed[i] >= signed, axis=1) & np.any(signed[i] > signed, axis=1)
        keep &= ~dominated
    return keep


def pareto_front(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
                 nodes: list[int] | None = None, fix: dict[str, Any] | None = None,
                 options: SpaceOptions | None = None, limit: int = 40,
                 trainer: TrainerSpec | None = None) -> list[ParetoPoint]:
    """The Pareto front over plans and cluster sizes (``nodes``: node counts to try); with a
    ``trainer``, over the plans it can run, priced as it runs them.

    Returns at most ``limit`` points, fastest first (evenly thinned when the front is
    longer). Raises SpecError when no plan fits at any size.
    """
    sizes = sorted(set(nodes or [cluster.num_nodes]))
    if any(n < 1 for n in sizes):
        raise SpecError("node counts must be >= 1", field="nodes", value=sizes)
    if not cluster.is_homogeneous:
        raise SpecError("Pareto fronts need one GPU type", field="cluster", value=cluster.name)
    price = cluster.gpu.price_per_hour_usd
    chosen_fields = set(training.model_fields_set)
    if trainer is not None:
        training = trainer_training(trainer, training)
    # MoE models: every run setting the trainer has, as ``search`` ranks them.
    runs = moe_runs(model, training, trainer, dict(fix or {}), chosen_fields)
    spaces: dict[tuple[int, int], tuple[ClusterSpec, PlanSpace]] = {}
    # Candidates: ((nodes, run), row, tokens/s, headroom GiB) on each size's 2-D front.
    cands: list[tuple[tuple[int, int], int, float, float]] = []
    for n_nodes in sizes:
        cl = cluster.with_nodes(n_nodes)
        # As ``search``: the grid once, the other settings' spaces derived from it.
        for j, space in enumerate(run_spaces(model, cl, runs, fix, options, trainer)):
            if len(space) == 0:
                continue
            ev = evaluate_space(space, exact_interleaved=False)
            rows = np.nonzero(ev.feasible & np.isfinite(ev.step_time_s))[0]
            if not rows.size:
                continue
            spaces[(n_nodes, j)] = (cl, space)
            tps = training.tokens_per_step / ev.step_time_s[rows]
            head = ev.capacity_gib - ev.peak_gib[rows]
            keep = pareto_mask(np.stack([tps, head], axis=1), (True, True))
            cands += [((n_nodes, j), int(i), float(a), float(b))
                      for i, a, b in zip(rows[keep], tps[keep], head[keep], strict=True)]
    if not cands:
        raise SpecError(f"no plan for {model.name} fits on {cluster.name} with "
                        f"{', '.join(map(str, sizes))} nodes", field="nodes", value=sizes)
    dollars = np.array([spaces[c[0]][0].num_gpus * (price or 0.0) for c in cands])
    obj = np.stack([np.array([c[2] for c in cands]), np.array([c[3] for c in cands]),
                    dollars], axis=1)
    keep = pareto_mask(obj, (True, True, False))
    chosen = sorted((c for c, k in zip(cands, keep, strict=True) if k), key=lambda c: -c[2])
    if len(chosen) > limit:
        picks = np.unique(np.linspace(0, len(chosen) - 1, limit).round().astype(int))
        chosen = [chosen[i] for i in picks]
    out = []
    for (n_nodes, j), i, _, _ in chosen:
        cl, space = spaces[(n_nodes, j)]
        rep = simulate(model, cl, runs[j], space.plan(i), trainer=trainer)
        if not rep.feasible or rep.step_time_s is None:
            continue
        per_hour = cl.num_gpus * price if price else None
        tokens_h = rep.tokens_per_s * 3600.0
        out.append(ParetoPoint(
            plan_short=rep.extra["plan_short"], nodes=n_nodes, num_gpus=cl.num_gpus,
            step_time_s=rep.step_time_s, tokens_per_s=rep.tokens_per_s, mfu=rep.mfu,
            memory_peak_gib=rep.memory_gb["peak"],
            headroom_gib=rep.extra["memory_headroom_gb"], dollars_per_hour=per_hour,
            dollars_per_million_tokens=per_hour / tokens_h * 1e6 if per_hour else None,
            plan=rep.plan,
            **(run_fields(runs[j]) if model.is_moe else {})))
    return out
