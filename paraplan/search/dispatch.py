"""``search()``: the entry point of ``paraplan best``. ``auto`` runs the exhaustive search on a
cluster with one GPU type and uniform links, the ILP on one that mixes GPU types, and the
evolutionary (DT-FM placement) search on one GPU type spread over regions or uneven links."""

from __future__ import annotations

from typing import Any

from paraplan.search.exhaustive import Progress, SearchResult, exhaustive_search
from paraplan.search.space import SpaceOptions, parse_fix
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.loaders import load_trainer
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec, trainer_reasons, trainer_training
from paraplan.specs.training import TrainingSpec

SEARCHERS = ("auto", "exhaustive", "ilp", "dp", "evolutionary")


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
    if spec is not None:
        training = trainer_training(spec, training)
    result = _run(model, cluster, training, searcher, top, pins, options, progress, seed, spec)
    if spec is not None:
        _check_runnable(result, spec, model, training)
    return result


def _check_runnable(result: SearchResult, trainer: TrainerSpec, model: ModelSpec,
                    training: TrainingSpec) -> None:
    """Every plan a search returns for a trainer must be one it can run: a searcher that let
    another through is a bug, said loudly (not dropped silently)."""
    for rep in result.reports:
        plan = ParallelPlan(**{k: v for k, v in rep.plan.items() if v is not None})
        bad = trainer_reasons(trainer, model, training, plan, rep.extra.get("num_microbatches"))
        if bad:
            raise AssertionError(f"the {result.searcher} searcher returned {plan.short()}, which "
                                 f"{trainer.label} cannot run: {'; '.join(bad)}")
        rep.extra["trainer"] = trainer.name
    result.extra["trainer"] = trainer.name


def _run(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, searcher: str,
         top: int, pins: dict[str, Any], options: SpaceOptions | None,
         progress: Progress | None, seed: int, trainer: TrainerSpec | None) -> SearchResult:
    if searcher == "auto":
        # One GPU type on uniform links: rank everything. Several GPU types: the ILP models
        # per-type compute and memory. One type on uneven links (regions, WAN): placement.
        if cluster.is_homogeneous:
            searcher = "exhaustive"
        elif len(cluster.gpu_types) > 1:
            searcher = "ilp"
        else:
            searcher = "evolutionary"
    if searcher == "exhaustive":
        if not cluster.is_homogeneous:
            raise SpecError("the exhaustive searcher needs one GPU type; this cluster mixes "
                            f"{', '.join(cluster.gpu_types)}: use --searcher ilp or "
                            "evolutionary", field="searcher", value=searcher)
        return exhaustive_search(model, cluster, training, fix=pins, top=top, options=options,
                                 progress=progress, trainer=trainer)
    if searcher == "dp":
        from paraplan.search.dp import dp_search

        return dp_search(model, cluster, training, fix=pins, top=top, options=options,
                         progress=progress, trainer=trainer)
    if searcher == "ilp":
        from paraplan.search.ilp import ilp_search_result

        return ilp_search_result(model, cluster, training, fix=pins, top=top,
                                 progress=progress, trainer=trainer)
    from paraplan.search.evolutionary import evolutionary_search

    return evolutionary_search(model, cluster, training, fix=pins, top=top, options=options,
                               progress=progress, seed=seed, trainer=trainer)
