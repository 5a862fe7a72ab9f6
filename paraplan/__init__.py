"""paraplan: how to split LLM training across GPUs, and how fast it will run.

Stable API (see DESIGN.md): ``ModelSpec, ClusterSpec, TrainingSpec, ParallelPlan, load_model,
load_cluster, simulate, search``.
"""

from paraplan import search
from paraplan.search import SearchResult
from paraplan.simulator.step import StepReport, simulate
from paraplan.specs import (
    ClusterSpec,
    GPUSpec,
    LinkSpec,
    ModelSpec,
    ParallelPlan,
    SpecError,
    Topology,
    TrainingSpec,
    check_plan,
    list_profiles,
    load_cluster,
    load_model,
    parse_plan,
)
from paraplan.version import __version__

__all__ = [
    "__version__",
    "ClusterSpec", "GPUSpec", "LinkSpec", "ModelSpec", "ParallelPlan", "SpecError", "StepReport",
    "Topology", "TrainingSpec", "check_plan", "list_profiles", "load_cluster", "load_model",
    "parse_plan", "SearchResult", "search", "simulate",
]
