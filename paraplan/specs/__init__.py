"""What the user describes: model, cluster, training and parallel plan (validated value types)."""

from paraplan.specs.checks import check_plan, validate_plan
from paraplan.specs.cluster import ClusterSpec, GPUSpec, LinkSpec, NodeGroup, RegionLink
from paraplan.specs.errors import SpecError
from paraplan.specs.loaders import (
    list_profiles,
    load_cluster,
    load_gpu,
    load_link,
    load_model,
    load_trainer,
)
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan, parse_plan
from paraplan.specs.topology import Topology
from paraplan.specs.trainer import TrainerSpec, apply_trainer, trainer_reasons
from paraplan.specs.training import TrainingSpec

__all__ = [
    "ClusterSpec", "GPUSpec", "LinkSpec", "ModelSpec", "NodeGroup", "ParallelPlan", "RegionLink",
    "SpecError", "Topology", "TrainerSpec", "TrainingSpec", "apply_trainer", "check_plan",
    "list_profiles", "load_cluster", "load_gpu", "load_link", "load_model", "load_trainer",
    "parse_plan", "trainer_reasons", "validate_plan",
]
