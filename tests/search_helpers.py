"""Helpers shared by the searcher tests."""

from __future__ import annotations

import itertools

from paraplan.specs.cluster import ClusterSpec


def stage_times(report) -> list[float]:
    """Forward + backward seconds of one micro-batch per stage, from a StepReport."""
    return [f + b for f, b in zip(report.extra["stage_forward_s"],
                                  report.extra["stage_backward_s"], strict=True)]


def compositions(n: int, p: int):
    """Every split of n items into p contiguous non-empty parts."""
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = (0, *cuts, n)
        yield [bounds[r + 1] - bounds[r] for r in range(p)]


def with_memory(cluster: ClusterSpec, gib: float) -> ClusterSpec:
    """The same cluster with every GPU's memory set to ``gib`` GiB (a fresh spec)."""
    groups = [g.model_copy(update={"gpu": g.gpu.model_copy(update={"memory_GiB": gib})})
              for g in cluster.node_groups]
    return cluster.model_copy(update={"node_groups": groups})
