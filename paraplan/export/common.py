"""What every exporter needs: the plan resolved against a model, a run and a world size, with
every derived quantity a trainer config is written from, and the error exporters raise.

Derived quantities follow Megatron-LM's conventions (``megatron/training/arguments.py``):
``dp = world / (tp * pp * cp)``; micro-batches per step ``m = global_batch / (mbs * dp)``
(gradient-accumulation steps outside a pipeline); the model's ``L`` transformer layers are cut
into ``pp * vpp`` model chunks, chunk ``c`` living on pipeline rank ``c % pp`` (Megatron's
interleaved assignment); ranks are ordered tp fastest, then cp, dp, pp (Megatron-Core's
default ``order="tp-cp-ep-dp-pp"``; expert-parallel groups are carved out of dp x cp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paraplan.simulator.step import plan_chunks
from paraplan.specs.checks import check_plan, check_plan_on_world
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

RANK_ORDER = "tp-cp-ep-dp-pp"


class ExportError(SpecError):
    """The plan cannot be written for this trainer (a feature it lacks, or one of its rules
    broken). The message names the plan field, its value and what the trainer allows."""


@dataclass(frozen=True)
class ExportContext:
    """A plan ready to export: model, run, plan (``dp`` resolved) and the world size."""

    model: ModelSpec
    training: TrainingSpec
    plan: ParallelPlan
    world_size: int
    cluster_name: str | None = None

    @property
    def dp(self) -> int:
        """Data-parallel replicas (dense parameters)."""
        return self.plan.resolved_dp(self.world_size)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches each replica runs per optimizer step: gbs / (mbs * dp)."""
        return self.training.global_batch_size // (self.plan.micro_batch_size * self.dp)

    @property
    def chunk_layers(self) -> list[int]:
        """Transformer layers of each model chunk (``pp * vpp`` of them, in layer order)."""
        return plan_chunks(self.model, self.plan)[0]

    @property
    def rank_layers(self) -> list[int]:
        """Transformer layers held by each pipeline rank (summed over its chunks)."""
        return plan_chunks(self.model, self.plan)[1]

    @property
    def even(self) -> bool:
        """Every model chunk has the same number of layers."""
        return len(set(self.chunk_layers)) == 1

    @property
    def expert_data_parallel(self) -> int:
        """Replicas of each expert: world / (etp * ep * pp) (Megatron-Core)."""
        p = self.plan
        return self.world_size // (p.expert_tp * p.ep * p.pp)

    def derived(self) -> dict[str, Any]:
        """Every quantity a trainer config derives from the plan (JSON-ready)."""
        p = self.plan
        return {
            "world_size": self.world_size, "dp": self.dp,
            "model_parallel_size": p.model_parallel_size,
            "num_microbatches": self.num_microbatches,
            "gradient_accumulation_steps": self.num_microbatches,
            "tokens_per_step": self.training.global_batch_size * self.training.seq_len,
            "sequences_per_replica_per_step": p.micro_batch_size * self.num_microbatches,
            "virtual_stages": p.virtual_stages,
            "layers_per_chunk": self.chunk_layers,
            "layers_per_pipeline_rank": self.rank_layers,
            "even_split": self.even,
            "expert_tensor_parallel": p.expert_tp,
            "expert_data_parallel": (self.expert_data_parallel if self.model.is_moe
                                     else None),
            "rank_order": RANK_ORDER,
            "rank_order_note": "rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank)); "
                               "expert-parallel groups are carved out of dp x cp",
        }


def export_context(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, *,
                   world_size: int | None = None, cluster: ClusterSpec | None = None
                   ) -> ExportContext:
    """Check the plan against the model, the run and the world and resolve ``dp``.

    Give ``cluster`` (the plan's structural rules are checked on it, as ``simulate`` does) or
    only ``world_size``.

    Raises:
        ExportError: the plan breaks a rule (every broken rule is listed).
    """
    if cluster is None and world_size is None:
        raise ExportError("export needs the cluster or the world size", field="cluster")
    if cluster is not None:
        reasons = check_plan(model, cluster, training, plan)
        world = cluster.num_gpus if plan.dp is None else plan.dp * plan.model_parallel_size
    else:
        world = int(world_size)  # type: ignore[arg-type]
        reasons = check_plan_on_world(model, training, plan, world)
    if reasons:
        raise ExportError("the plan cannot be exported: " + "; ".join(reasons), field="plan",
                          value=plan.short())
    dp = plan.resolved_dp(world)
    resolved = plan.model_copy(update={"dp": dp})
    return ExportContext(model, training, resolved, world,
                         cluster.name if cluster is not None else None)


def refuse(field: str, value: Any, trainer: str, allowed: str) -> ExportError:
    """An ExportError for a field the trainer cannot express (``field`` is a plan field, or
    ``model.*`` / ``training.*``)."""
    path = field if field.startswith(("model.", "training.")) else f"plan.{field}"
    return ExportError(f"{path}={value!r} cannot be exported to {trainer}: {allowed}",
                       field=path, value=value)


def refuse_optimizer_state(training: TrainingSpec, trainer: str, *,
                           moments: tuple[str, ...] = ("fp32",)) -> None:
    """Refuse a 16-bit optimizer state the trainer's config cannot ask for: a 16-bit parameter
    copy in the optimizer (no pinned trainer keeps one: Megatron's ``--main-params-dtype`` is
    fp32 or fp16) and moments in a dtype outside ``moments``."""
    if training.master_weights and training.master_weights_dtype != "fp32" \
            and training.precision != "fp32":
        raise refuse("training.master_weights_dtype", training.master_weights_dtype, trainer,
                     "its optimizer keeps fp32 master weights")
    if training.moments_dtype not in moments:
        raise refuse("training.moments_dtype", training.moments_dtype, trainer,
                     "its optimizer keeps " + " or ".join(moments) + " moments")


def refuse_relaxed_sync(plan: ParallelPlan, trainer: str) -> None:
    """Refuse what no pinned trainer config expresses: a custom GPU placement (the identity
    one is rank order, which every exporter writes), local SGD / DiLoCo, and gradient or
    activation compression."""
    if not plan.rank_order:
        raise refuse("placement", "custom", trainer, "trainers place ranks in their own order "
                     "(Megatron tp-cp-ep-dp-pp, torchtitan [pp, dp, tp]); launch ranks in that "
                     "order instead")
    if plan.dp_sync_interval != 1:
        raise refuse("dp_sync_interval", plan.dp_sync_interval, trainer,
                     "it synchronizes gradients every step (no local SGD / DiLoCo)")
    if plan.grad_compression != "none" or plan.grad_compression_ratio != 1.0:
        field = "grad_compression" if plan.grad_compression != "none" else \
            "grad_compression_ratio"
        raise refuse(field, getattr(plan, field), trainer,
                     "no gradient compressor in its config; export without it")
    if plan.activation_compression_bits is not None:
        raise refuse("activation_compression_bits", plan.activation_compression_bits, trainer,
                     "pipeline activations are sent uncompressed")
    if plan.dp_algorithm != "collective":
        raise refuse("dp_algorithm", plan.dp_algorithm, trainer,
                     "gradients go through its collectives (no parameter server)")
