"""``search()``: the entry point of ``paraplan best``. ``auto`` runs the exhaustive search on a
cluster with one GPU type and uniform links, the ILP on one that mixes GPU types, and the
evolutionary (DT-FM placement) search on one GPU type spread over regions or uneven links."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from paraplan.search.exhaustive import Progress, SearchResult, exhaustive_search, rank_key
from paraplan.search.moe_runs import moe_runs, run_fields, run_label
from paraplan.search.space import PlanSpace, SpaceOptions, parse_fix
from paraplan.search.space.build import run_spaces
from paraplan.search.space.keys import plan_key
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.loaders import load_trainer
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec, trainer_reasons, trainer_training
from paraplan.specs.training import TrainingSpec

SEARCHERS = ("auto", "exhaustive", "ilp", "dp", "evolutionary")
SUMMED_EXTRAS = ("feasible_plans", "resplit_plans", "ilp_solves")
"""Counts in a SearchResult's ``extra`` that add up when searches are merged."""


def search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
           searcher: str = "auto", top: int = 10, fix: str | dict[str, Any] | None = None,
           options: SpaceOptions | None = None, progress: Progress | None = None,
           seed: int = 0, trainer: TrainerSpec | str | None = None) -> SearchResult:
    """Find the fastest plans that fit; ``fix`` pins plan fields (``"tp=8,pp=4"`` or a dict).

    ``trainer`` (a profile name, YAML path or TrainerSpec) limits the search to plans that
    trainer can express and prices them as it runs them; None searches everything the
    simulator can price (the ``generic`` profile's space, with the plan fields' defaults).

    Raises:
        SpecError: unknown searcher, bad ``fix``, or no plan that is legal and fits.
    """
    if searcher not in SEARCHERS:
        raise SpecError(f"unknown searcher {searcher!r}", field="searcher", value=searcher,
                        allowed=list(SEARCHERS))
    pins = parse_fix(fix)
    spec = None if trainer is None else (
        trainer if isinstance(trainer, TrainerSpec) else load_trainer(trainer))
    chosen = set(training.model_fields_set)  # what the user set (the trainer's facts add to it)
    if spec is not None:
        training = trainer_training(spec, training)
    runs = moe_runs(model, training, spec, pins, chosen)
    searcher = _resolve(searcher, cluster)
    # The vectorized searchers enumerate the grid once: the searches under the other settings
    # take its plans with ep > 1 (``run_spaces``).
    spaces = (run_spaces(model, cluster, runs, pins, options, spec)
              if len(runs) > 1 and searcher in ("exhaustive", "dp") and cluster.is_homogeneous
              else None)
    results: list[SearchResult] = []
    failures: list[SpecError] = []
    cutoff = None
    for i, run in enumerate(runs):
        # Plans without expert parallelism price alike under every setting: only the first
        # (the trainer's own) ranks them.
        opts = options if i == 0 else replace(options or SpaceOptions(),
                                              expert_parallel_only=True)
        space = None if spaces is None else next(spaces)
        try:
            result = _run(model, cluster, run, searcher, top, pins, opts,
                          _part(progress, i, len(runs)), seed, spec, space, cutoff)
        except SpecError as exc:  # e.g. nothing fits without the overlap: try the others
            failures.append(exc)
            continue
        if spec is not None:
            _check_runnable(result, spec, model, run)
        if model.is_moe:
            for rep in result.reports:
                rep.extra.update(run_fields(run))
        results.append(result)
        cutoff = _kth_time(results, top)
    if not results:
        raise failures[0]
    if len(runs) == 1:
        return results[0]
    return _merge(results, runs, top)


def _kth_time(results: list[SearchResult], top: int) -> float | None:
    """The ``top``-th best step time over the distinct plans the searches so far returned (a
    plan found under two settings counts once, at its best), or None while there are fewer:
    a plan of a later setting that cannot beat it cannot reach the merged ranking
    (``_merge``)."""
    best: dict[str, float] = {}
    for res in results:
        for rep in res.reports:
            if rep.feasible and rep.step_time_s is not None:
                key = plan_key(rep)
                best[key] = min(best.get(key, rep.step_time_s), rep.step_time_s)
    return sorted(best.values())[top - 1] if len(best) >= top else None


def _part(progress: Progress | None, i: int, parts: int) -> Progress | None:
    """Progress of the i-th of ``parts`` equal searches as a fraction of them all."""
    if progress is None or parts == 1:
        return progress
    return lambda done, total: progress(i * total + done, parts * total)


def _merge(results: list[SearchResult], runs: list[TrainingSpec], top: int) -> SearchResult:
    """One ranking of the searches under each MoE run setting: the ``top`` fastest distinct
    plans (a plan priced alike under two settings, e.g. ep = 1 under either dispatcher, keeps
    the first setting's report: the trainer's own)."""
    reports, seen = [], set()
    pool = [r for res in results for r in res.reports]
    pool.sort(key=lambda r: (not r.feasible, rank_key(r) if r.step_time_s is not None
                             else (float("inf"), 0.0, 0)))
    for rep in pool:
        key = plan_key(rep)
        if key not in seen:
            seen.add(key)
            reports.append(rep)
    rejected: Counter = Counter()
    for res in results:
        rejected.update(res.rejected)
    baselines = [r.baseline_step_time_s for r in results if r.baseline_step_time_s is not None]
    notes = list(dict.fromkeys(n for res in results for n in res.notes))
    labels = [run_label(r) for r in runs]
    notes.append(f"MoE plans ranked under {len(runs)} run settings ({', '.join(labels)}); "
                 "each plan shows the one it was priced with")
    # Counts add up over the settings (each counts plan-setting pairs, as plans_evaluated
    # does); "complete" holds when every search was; the other facts (a searcher's seed, the
    # ILP's gap and baseline plan) are those of the search that gave the best baseline.
    home = min(results, key=lambda r: (r.baseline_step_time_s is None,
                                       r.baseline_step_time_s or 0.0))
    extra: dict[str, Any] = dict(home.extra)
    for k in SUMMED_EXTRAS:
        if any(k in r.extra for r in results):
            extra[k] = sum(r.extra.get(k, 0) for r in results)
    if any("complete" in r.extra for r in results):
        extra["complete"] = all(r.extra.get("complete", True) for r in results)
    extra["moe_runs"] = [run_fields(r) for r in runs]
    first = results[0]
    return SearchResult(
        searcher=first.searcher, plans_evaluated=sum(r.plans_evaluated for r in results),
        search_time_s=sum(r.search_time_s for r in results), reports=reports[:top],
        baseline_step_time_s=min(baselines) if baselines else None, rejected=dict(rejected),
        considered=sum(r.considered for r in results), notes=notes, extra=extra)


def _check_runnable(result: SearchResult, trainer: TrainerSpec, model: ModelSpec,
                    training: TrainingSpec) -> None:
    """Every plan a search returns for a trainer must be one it can run: a searcher that let
    another through is a bug, said loudly (not dropped silently)."""
    for rep in result.reports:
        plan = ParallelPlan(**{k: v for k, v in rep.plan.items() if v is not None})
        bad = trainer_reasons(trainer, model, training, plan, rep.extra.get("num_microbatches"),
                              dp=rep.extra.get("dp"))
        if bad:
            raise AssertionError(f"the {result.searcher} searcher returned {plan.short()}, which "
                                 f"{trainer.label} cannot run: {'; '.join(bad)}")
        rep.extra["trainer"] = trainer.name
    result.extra["trainer"] = trainer.name


def _resolve(searcher: str, cluster: ClusterSpec) -> str:
    """The searcher ``auto`` stands for on this cluster. One GPU type on uniform links: rank
    everything. Several GPU types: the ILP models per-type compute and memory. One type on
    uneven links (regions, WAN): placement."""
    if searcher != "auto":
        return searcher
    if cluster.is_homogeneous:
        return "exhaustive"
    return "ilp" if len(cluster.gpu_types) > 1 else "evolutionary"


def _run(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, searcher: str,
         top: int, pins: dict[str, Any], options: SpaceOptions | None,
         progress: Progress | None, seed: int, trainer: TrainerSpec | None,
         space: PlanSpace | None = None, cutoff: float | None = None) -> SearchResult:
    if searcher == "exhaustive":
        if not cluster.is_homogeneous:
            raise SpecError("the exhaustive searcher needs one GPU type; this cluster mixes "
                            f"{', '.join(cluster.gpu_types)}: use --searcher ilp or "
                            "evolutionary", field="searcher", value=searcher)
        return exhaustive_search(model, cluster, training, fix=pins, top=top, options=options,
                                 progress=progress, trainer=trainer, space=space,
                                 cutoff=cutoff)
    if searcher == "dp":
        from paraplan.search.dp import dp_search

        return dp_search(model, cluster, training, fix=pins, top=top, options=options,
                         progress=progress, trainer=trainer, space=space)
    if searcher == "ilp":
        from paraplan.search.ilp import ilp_search_result

        return ilp_search_result(model, cluster, training, fix=pins, top=top,
                                 progress=progress, trainer=trainer)
    from paraplan.search.evolutionary import evolutionary_search

    return evolutionary_search(model, cluster, training, fix=pins, top=top, options=options,
                               progress=progress, seed=seed, trainer=trainer)
