"""``search()``: the entry point of ``paraplan best``. ``auto`` runs the exhaustive search on a
cluster with one GPU type and uniform links, the ILP on one that mixes GPU types, and the
evolutionary (DT-FM placement) search on one GPU type spread over regions or uneven links."""

from __future__ import annotations

from typing import Any

from paraplan.search.exhaustive import Progress, SearchResult, exhaustive_search
from paraplan.search.space import SpaceOptions, parse_fix
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec

SEARCHERS = ("auto", "exhaustive", "ilp", "dp", "evolutionary")


def search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
           searcher: str = "auto", top: int = 10, fix: str | dict[str, Any] | None = None,
           options: SpaceOptions | None = None, progress: Progress | None = None,
           seed: int = 0) -> SearchResult:
    """Find the fastest plans that fit; ``fix`` pins plan fields (``"tp=8,pp=4"`` or a dict).

    Raises:
        SpecError: unknown searcher, bad ``fix``, or no plan that is legal and fits.
    """
    if searcher not in SEARCHERS:
        raise SpecError(f"unknown searcher {searcher!r}", field="searcher", value=searcher,
                        allowed=list(SEARCHERS))
    pins = parse_fix(fix)
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
                                 progress=progress)
    if searcher == "dp":
        from paraplan.search.dp import dp_search

        return dp_search(model, cluster, training, fix=pins, top=top, options=options,
                         progress=progress)
    if searcher == "ilp":
        from paraplan.search.ilp import ilp_search_result

        return ilp_search_result(model, cluster, training, fix=pins, top=top,
                                 progress=progress)
    from paraplan.search.evolutionary import evolutionary_search

    return evolutionary_search(model, cluster, training, fix=pins, top=top, options=options,
                               progress=progress, seed=seed)
