# longer than 400 lines: the trainer profile (what it can express, how it runs) and the
# rules applying it to a plan stay together.
"""TrainerSpec: what one trainer (and version) can express, and how it runs what it expresses.

A trainer profile is an input like the cluster (``hardware_profiles/trainers/*.yaml``): its
``can`` part limits the plans a searcher may return to those the trainer can run, and its
``runs`` part sets the implementation facts the simulator prices (TP and DP communication
overlap, gradient-reduction dtype, dropout, kernels, FlashAttention version, ...), each cited
to the trainer's own source file in the profile's ``sources``.

``trainer_reasons`` says in plain words why a trainer cannot run a plan; ``apply_trainer``
turns a (training, plan) pair into the one the trainer runs. A field the user set explicitly
(pydantic's ``model_fields_set``; ``model_copy(update=...)`` marks what it sets, so applying a
profile twice changes nothing) always wins over the profile.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from paraplan.specs.base import StrictModel
from paraplan.specs.model import ModelFeature, ModelSpec
from paraplan.specs.plan import ParallelPlan, Recompute, Schedule, relaxed_knobs
from paraplan.specs.trainer_rules import ddp_beside_others, mixed_precision_off
from paraplan.specs.training import MAX_BUCKET_ELEMENTS, Precision, TrainingSpec


class TrainerCan(StrictModel):
    """What the trainer's configuration can express (a plan outside it cannot be run)."""

    tensor_parallel: bool = True
    """Tensor parallelism (tp > 1) at all."""
    pipeline_parallel: bool = True
    """Pipeline parallelism (pp > 1) at all."""
    schedules: list[Schedule]
    """Pipeline schedules (with pp > 1; pp = 1 needs none)."""
    max_virtual_stages: int | None = Field(default=None, ge=1)
    """Most model chunks per pipeline rank (interleaving); None = any the layers allow."""
    uneven_layers: bool
    """A layer split that is not equal over the pipeline stages (first/last-stage options)."""
    empty_end_chunks: bool = False
    """An interleaved split whose first and last model chunk hold only the embedding and the
    loss, no decoder layer (Megatron-Core's account-for-embedding/loss pipeline split)."""
    zero_stages: list[Literal[0, 1, 2, 3]]
    """ZeRO stages (0 = replicated DDP, 1 = distributed optimizer, 2 = + gradients, 3 = FSDP)."""
    max_zero_stage_with_pp: Literal[0, 1, 2, 3] = 3
    """Highest ZeRO stage together with pipeline parallelism (pp > 1)."""
    zero_stages_with_pp: list[Literal[0, 1, 2, 3]] | None = Field(default=None, min_length=1)
    """ZeRO stages with pp > 1 when they differ from ``zero_stages`` (None: the same, capped
    by ``max_zero_stage_with_pp``): FSDP under ``torch.distributed.pipelining`` keeps
    parameters and gradients unsharded until the last backward, which is ZeRO-1."""
    min_zero_stage_with_ep: Literal[0, 1, 2, 3] = 0
    """Lowest ZeRO stage together with expert parallelism (ep > 1)."""
    sequence_parallel: Literal["never", "optional", "always"]
    """Megatron-style sequence parallelism with tp > 1: never, the user's choice, or always on."""
    context_parallel: bool
    """Ring context parallelism (cp > 1)."""
    expert_parallel: bool
    """Expert parallelism (ep > 1) set in the trainer's config."""
    expert_tensor_parallel: bool
    """An expert tensor-parallel degree other than tp."""
    moe: bool
    """Mixture-of-experts models at all."""
    model_features: list[ModelFeature] = []
    """Architecture features beyond standard (grouped-query) attention and leading dense
    layers that the trainer's model code has (``ModelSpec.features``)."""
    recompute: list[Recompute]
    """Activation recomputation kinds."""
    precisions: list[Precision]
    """Compute precisions."""
    optimizer_states: list[Literal["fp32", "bf16_moments", "remainder", "bf16_master"]] = \
        ["fp32"]
    """Optimizer states it keeps (``TrainingSpec.moments_dtype``, ``master_weights_dtype``)."""
    bf16_moments_zero_stages: list[Literal[0, 1, 2, 3]] = [0, 1, 2, 3]
    """ZeRO stages its bf16-moment optimizer runs with."""
    fp8_moe: bool = True
    """fp8 for MoE models (expert GEMMs in fp8); False: its fp8 converts dense linears only."""
    microbatches_per_stage: bool = False
    """With pp > 1 every pipeline stage (pp * vpp of them) needs at least one micro-batch."""
    one_f_one_b_needs_pp_minus_1: bool = False
    """The 1F1B engine needs at least pp - 1 micro-batches."""
    relaxed_sync: bool = False  # local SGD / DiLoCo, gradient or activation compression
    dp_algorithms: list[Literal["collective", "ps", "sharded_ps"]] = ["collective"]
    """How DP gradients travel: NCCL-style collectives, or parameter servers."""
    placement: bool = False
    """A custom rank-to-GPU placement (trainers place ranks in their own order)."""
    moe_dispatchers: list[Literal["alltoall", "hierarchical"]] = ["alltoall"]
    """MoE token dispatchers (``TrainingSpec.moe_dispatcher``)."""
    moe_a2a_overlap: bool = False
    """Expert-parallel all-to-all overlapped with another micro-batch's compute."""
    moe_tp_needs_sp: bool = False
    """MoE layers with tp > 1 need sequence parallelism in training."""
    tied_embeddings_with_pp: bool = True
    """A word embedding tied to the output layer with pp > 1 (torchtitan refuses it)."""
    ddp_only_alone: bool = False
    """Replicated data parallelism (zero 0 over dp > 1) only alone; with cp > 1 it shards."""
    mixed_precision_needs_fsdp: bool = False
    """bf16/fp8 with tp or pp > 1 only under FSDP (zero >= 1 over dp > 1, or cp > 1); else fp32."""


class TrainerRuns(StrictModel):
    """How the trainer runs a plan (as its exported config sets it): what the simulator prices."""

    tp_comm_overlap: bool
    """TP collectives overlapped with the adjacent GEMMs (userbuffers / async TP)."""
    tp_comm_overlap_needs_sp: bool = True
    """The overlap works on sequence parallelism's all-gather / reduce-scatter only."""
    tp_overlap: Literal["userbuffers", "async_tp"] = "userbuffers"
    """How its TP overlap runs (``TrainingSpec.tp_overlap``)."""
    recompute_early_stop: bool = False
    """Whole-layer recompute stops before the MLP's down projection
    (``TrainingSpec.recompute_early_stop``)."""
    tp_dgrad_overlap: bool = False
    """Its column-parallel linears overlap the backward's input-gradient TP collective with
    the weight-gradient GEMM (``TrainingSpec.tp_dgrad_overlap``)."""
    overlap_grad_reduce: bool
    """DP gradient reduction overlapped with the backward pass (buckets)."""
    overlap_param_gather: bool = False
    """Sharded parameters all-gathered ahead of the forward pass (recorded, not yet priced)."""
    overlap_p2p: bool = False
    """Interleaved-schedule pipeline sends overlapped with compute (``plan.overlap_p2p_comm``)."""
    grad_reduce_fp32: bool | Literal["bf16"]
    """Gradients reduced across DP ranks in fp32 (4 bytes per value); ``bf16``: when training
    in bf16 (or fp8 with bf16 parameters), as Megatron promotes bf16 reductions to fp32."""
    dropout: bool
    """Dropout layers (their masks add activation memory)."""
    kernels: Literal["fused", "eager"]
    """Non-GEMM kernels: fused (Megatron / Transformer Engine kernels, torch.compile) or eager."""
    flash_attention_version: Literal[1, 2] = 2
    """FlashAttention-1-class or -2-class attention kernels."""
    flash_attention_triton: bool = False
    """Its FlashAttention-1-class kernel is the Triton one
    (``TrainingSpec.flash_attention_triton``)."""
    qkv_split_cat: bool = False
    """Its attention splits a fused QKV output into views, whose backward concatenates the
    gradients (``TrainingSpec.qkv_split_cat``)."""
    fp8_weight_cache: bool = False
    """fp8 weight casts kept across micro-batches (``TrainingSpec.fp8_weight_cache``)."""
    fp8_scaling: Literal["delayed", "current", "block"] = "delayed"
    """How its fp8 recipe scales tensors (``TrainingSpec.fp8_scaling``)."""
    fp8_cast_kernels: int = Field(default=0, ge=0, le=16)
    """Kernels its fp8 casts launch beside the cast (``TrainingSpec.fp8_cast_kernels``)."""
    compile: bool = False
    """torch.compile of the model blocks (recorded; ``kernels`` carries its effect)."""
    fp8_compiles: bool = False
    """fp8 training runs compiled (fused kernels) whatever ``kernels`` says for 16-bit: the
    exported config turns torch.compile on with the fp8 converter."""
    fp8_param_gather: bool = False
    """fp8 training all-gathers sharded parameters in fp8 (``TrainingSpec.fp8_param_gather``)."""
    fp8_tp_gather: bool = False
    """fp8 training runs its sequence-parallel all-gathers in fp8
    (``TrainingSpec.fp8_tp_gather``)."""
    fsdp_copies: Literal["flat", "per_param"] | None = None
    """Per-micro-batch copies of its sharded data parallelism (``TrainingSpec.fsdp_copies``)."""
    cp_merge: Literal["fused", "eager_fp32"] = "fused"
    """Its ring attention's merges (``TrainingSpec.cp_merge``)."""
    cp_kv_exchange: Literal["ring", "allgather"] = "ring"
    """How its ring attention exchanges K/V blocks (``TrainingSpec.cp_kv_exchange``)."""
    pp_grad_sync: Literal["overlapped", "after_schedule", "cascade"] = "overlapped"
    """When its pipelined stages reduce their gradients (``TrainingSpec.pp_grad_sync``)."""
    loss_kernels: Literal["fused", "eager", "one_kernel"] | None = None
    """Its cross-entropy kernels (``TrainingSpec.loss_kernels``); None: as ``kernels``."""
    logit_metric_passes: int = Field(default=0, ge=0, le=16)
    """Metrics it runs on each micro-batch's logits (``TrainingSpec.logit_metric_passes``)."""
    zero2_regather: bool = False
    """ZeRO-2 re-gathers parameters every micro-batch (``TrainingSpec.zero2_regather``)."""
    ddp_autocast: bool = False
    """Its DDP (zero 0) runs autocast over fp32 parameters (``TrainingSpec.ddp_autocast``)."""
    ddp_sync_every_microbatch: bool = False
    """Its DDP syncs every micro-batch (``TrainingSpec.ddp_sync_every_microbatch``)."""
    zero1_grad_all_reduce: bool | Literal["bf16"] = False
    """ZeRO-1 all-reduces gradients in full (``TrainingSpec.zero1_grad_all_reduce``);
    ``bf16``: when training in bf16 (DeepSpeed's BF16 optimizer)."""
    ddp_bucket_size: int | None = Field(default=None, gt=0, le=MAX_BUCKET_ELEMENTS)
    """Parameters per gradient-reduction bucket its exported config leaves in place
    (``TrainingSpec.ddp_bucket_size``); None: Megatron-Core's rule."""
    grad_accumulation: dict[Literal["bf16", "fp16", "fp32", "fp8"],
                            Literal["fused", "eager", "fp32_add"]] = Field(default_factory=dict)
    """How it accumulates weight gradients, by training precision
    (``TrainingSpec.grad_accumulation``); a precision it does not list follows ``kernels``."""
    moe_dispatcher: Literal["alltoall", "hierarchical"] = "alltoall"
    """The MoE token dispatcher its exported config selects (``TrainingSpec.moe_dispatcher``)."""
    moe_a2a_overlap: bool = False
    """Its exported config overlaps EP all-to-alls (``TrainingSpec.moe_a2a_overlap``)."""
    moe_host_sync_s: float = Field(default=0.0, ge=0.0, le=0.1)
    """Host stall per MoE layer forward (``TrainingSpec.moe_host_sync_s``)."""
    optimizer_impl: Literal["fused", "foreach", "for_loop"] = "fused"
    """Its optimizer update's implementation (``TrainingSpec.optimizer_impl``)."""
    clip_scales_always: bool = False
    """Its clipping scales every gradient (``TrainingSpec.clip_scales_always``)."""
    fused_rope_scales: bool = True
    """Its fused RoPE applies YaRN's attention factor (``TrainingSpec.fused_rope_scales``)."""


class TrainerSpec(StrictModel):
    """One trainer and version: what it can express and how it runs (see the module doc)."""

    name: str
    display_name: str = ""
    version: str = ""
    export_format: Literal["megatron", "torchtitan", "deepspeed", "nanotron"] | None = None
    """The ``--export`` format that writes this trainer's config (None: none does)."""
    can: TrainerCan
    runs: TrainerRuns
    sources: dict[str, str] = {}
    """Citation of each fact: ``can.<field>`` / ``runs.<field>`` -> the trainer's source."""
    notes: str = ""

    @property
    def label(self) -> str:
        return f"{self.name} ({self.version})" if self.version else self.name


def missing_features(trainer: TrainerSpec, model: ModelSpec) -> list[str]:
    """The model's features (``ModelSpec.features``) the trainer lacks (``can.model_features``)."""
    return [f for f in model.features if f not in trainer.can.model_features]


def a2a_overlap_needs(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan
                      ) -> list[str]:
    """What the plan lacks for Megatron-Core's EP all-to-all overlap, in words (core_v0.15.3
    transformer_config.py L1441-1480 asserts each: ``--overlap-moe-expert-parallel-comm``)."""
    checks = ((plan.recompute == "full", "no full recomputation"),
              (plan.pp > 1 and plan.virtual_stages == 1,
               "an interleaved schedule (vpp > 1) when pp > 1"),
              (training.precision == "fp32", "bf16 or fp16 weights"),
              (model.num_mtp_layers > 1, "at most one MTP layer"))
    return [need for failed, need in checks if failed]


def trainer_reasons(trainer: TrainerSpec, model: ModelSpec, training: TrainingSpec,
                    plan: ParallelPlan, num_microbatches: int | None = None,
                    dp: int | None = None) -> list[str]:
    """Why ``trainer`` cannot run ``plan`` (empty when it can), one plain sentence each.

    ``num_microbatches`` (per replica per step) enables the micro-batch rules; ``dp`` (the
    plan's data-parallel degree where it leaves it out) the data-parallel ones."""
    can, who, out = trainer.can, trainer.label, []
    p = plan
    dp = p.dp if p.dp is not None else dp
    if can.ddp_only_alone and ddp_beside_others(p.zero_stage, dp or 1, p.tp, p.pp, p.cp):
        out.append(f"{who} runs replicated data parallelism (zero_stage=0) only without tp, "
                   "pp or cp (with cp it shards over the CP ranks); use zero_stage >= 1")
    if can.mixed_precision_needs_fsdp and training.precision != "fp32" and dp is not None \
            and mixed_precision_off(p.zero_stage, dp, p.tp, p.pp, p.cp):
        out.append(f"{who} trains {training.precision} with tp or pp only under FSDP (zero_stage "
                   ">= 1 over dp > 1, or cp > 1); otherwise in fp32")
    if p.tp > 1 and not can.tensor_parallel:
        out.append(f"{who} has no tensor parallelism (plan: tp={p.tp})")
    if p.pp > 1 and not can.pipeline_parallel:
        out.append(f"{who} has no pipeline parallelism (plan: pp={p.pp})")
    elif p.pp > 1 and p.schedule not in can.schedules:
        out.append(f"{who} cannot run schedule={p.schedule}; it runs {_words(can.schedules)}")
    if can.max_virtual_stages is not None and p.virtual_stages > can.max_virtual_stages:
        out.append(f"{who} runs at most {can.max_virtual_stages} virtual stages per pipeline "
                   f"rank (plan: {p.virtual_stages})")
    if p.layers_per_stage is not None and len(set(p.layers_per_stage)) > 1 \
            and not can.uneven_layers:
        out.append(f"{who} splits layers evenly over the pipeline stages (plan: "
                   f"{p.layers_per_stage})")
    elif p.layers_per_stage is not None and 0 in p.layers_per_stage \
            and not can.empty_end_chunks:
        out.append(f"{who} gives every pipeline chunk a decoder layer (plan: an empty first "
                   "or last chunk)")
    piped_zero = can.zero_stages_with_pp if p.pp > 1 else None
    if piped_zero is not None and p.zero_stage not in piped_zero:
        out.append(f"{who} runs ZeRO stage {_words(piped_zero)} with pipeline parallelism "
                   f"(plan: zero_stage={p.zero_stage}, pp={p.pp})")
    elif piped_zero is None and p.zero_stage not in can.zero_stages:
        out.append(f"{who} cannot express zero_stage={p.zero_stage}; it has "
                   f"{_words(can.zero_stages)}")
    elif p.pp > 1 and p.zero_stage > can.max_zero_stage_with_pp:
        out.append(f"{who} runs ZeRO stage {can.max_zero_stage_with_pp} at most with pipeline "
                   f"parallelism (plan: zero_stage={p.zero_stage}, pp={p.pp})")
    if p.ep > 1 and p.zero_stage < can.min_zero_stage_with_ep:
        out.append(f"{who} carves expert parallelism out of its sharded data-parallel "
                   f"dimension: ep > 1 needs zero_stage >= {can.min_zero_stage_with_ep}")
    if p.tp > 1 and p.sequence_parallel and can.sequence_parallel == "never":
        out.append(f"{who} has no Megatron sequence parallelism (plan: sp)")
    if p.tp > 1 and not p.sequence_parallel and can.sequence_parallel == "always":
        out.append(f"{who} always shards norms over the sequence with tp > 1 (sp=1)")
    if p.cp > 1 and not can.context_parallel:
        out.append(f"{who} has no ring context parallelism (plan: cp={p.cp})")
    if p.pp > 1 and model.tie_word_embeddings and not can.tied_embeddings_with_pp:
        out.append(f"{who} cannot pipeline a model whose word embedding is its output layer")
    missing = missing_features(trainer, model)
    if missing:
        out.append(f"{who} has no {', '.join(missing)} in its model code (the model needs "
                   "them)")
    if model.is_moe and training.precision == "fp8" and not can.fp8_moe:
        out.append(f"{who} trains mixture-of-experts models in fp8 only as a prototype "
                   "paraplan does not write; use bf16")
    if model.is_moe and not can.moe:
        out.append(f"{who} (as paraplan exports it) has no mixture-of-experts models")
    elif p.ep > 1 and not can.expert_parallel:
        out.append(f"{who} does not set expert parallelism in its config (plan: ep={p.ep})")
    if model.is_moe and p.expert_tp != p.tp and not can.expert_tensor_parallel:
        out.append(f"{who} has no expert tensor-parallel degree other than tp (plan: "
                   f"etp={p.expert_tp})")
    if model.is_moe and p.tp > 1 and not p.sequence_parallel and can.moe_tp_needs_sp:
        out.append(f"{who} trains MoE layers with tp > 1 only with sequence parallelism (sp=1)")
    if model.is_moe and p.ep * p.expert_tp > 1:
        if training.moe_dispatcher not in can.moe_dispatchers:
            out.append(f"{who} has no {training.moe_dispatcher} MoE token dispatcher; it has "
                       f"{_words(can.moe_dispatchers)}")
        if training.moe_a2a_overlap and not can.moe_a2a_overlap:
            out.append(f"{who} cannot overlap expert-parallel all-to-alls with compute")
        elif training.moe_a2a_overlap:
            if p.ep == 1:
                out.append(f"{who} overlaps expert-parallel all-to-alls only with ep > 1")
            out += [f"{who}'s expert-parallel all-to-all overlap needs {need}"
                    for need in a2a_overlap_needs(model, training, p)]
        if training.moe_dispatcher == "hierarchical" and p.moe_capacity_factor is not None:
            out.append(f"{who}'s hierarchical (DeepEP) dispatch drops no tokens: leave "
                       "moe_capacity_factor unset")
    if p.recompute not in can.recompute:
        out.append(f"{who} cannot recompute={p.recompute}; it has {_words(can.recompute)}")
    if training.precision not in can.precisions:
        out.append(f"{who} cannot train in --precision {training.precision}; it has "
                   f"{_words(can.precisions)}")
    out += [why for _, _, why in optimizer_state_reasons(trainer, training)]
    if training.moments_dtype == "bf16" and p.zero_stage not in can.bf16_moments_zero_stages:
        out.append(f"{who} keeps bf16 optimizer moments only with zero_stage "
                   f"{_words([str(z) for z in can.bf16_moments_zero_stages])}")
    if num_microbatches is not None and p.pp > 1:
        stages = p.pp * p.virtual_stages
        if can.microbatches_per_stage and num_microbatches < stages:
            out.append(f"{who} needs at least one micro-batch per pipeline stage: "
                       f"{num_microbatches} < pp*vpp = {stages}")
        if (can.one_f_one_b_needs_pp_minus_1 and p.schedule == "1f1b"
                and num_microbatches < p.pp - 1):
            out.append(f"{who}'s 1F1B engine needs at least pp - 1 = {p.pp - 1} micro-batches "
                       f"(plan: {num_microbatches})")
    if not can.relaxed_sync:
        knobs = relaxed_knobs({f: getattr(p, f) for f in p.model_fields_set})
        if knobs:
            out.append(f"{who} synchronizes dense gradients every step ({', '.join(knobs)} "
                       "cannot be set)")
    if p.dp_algorithm not in can.dp_algorithms:
        out.append(f"{who} sends gradients through {_words(can.dp_algorithms)} "
                   f"(plan: dp_algorithm={p.dp_algorithm})")
    if not p.rank_order and not can.placement:
        out.append(f"{who} places ranks in its own order (no custom placement)")
    return out


def apply_trainer(trainer: TrainerSpec, training: TrainingSpec, plan: ParallelPlan
                  ) -> tuple[TrainingSpec, ParallelPlan]:
    """The (training, plan) ``trainer`` runs: its run facts, except fields the user set."""
    runs = trainer.runs
    p_update = {}
    if "overlap_grad_reduce" not in plan.model_fields_set:
        p_update["overlap_grad_reduce"] = runs.overlap_grad_reduce
    if "overlap_p2p_comm" not in plan.model_fields_set:
        p_update["overlap_p2p_comm"] = runs.overlap_p2p
    if "tp_comm_overlap" not in plan.model_fields_set:
        p_update["tp_comm_overlap"] = tp_overlap(runs, plan.tp, plan.sequence_parallel)
    return trainer_training(trainer, training), plan.model_copy(update=p_update)


def _recompute_early_stop(runs: TrainerRuns, precision: str) -> bool:
    """``TrainingSpec.recompute_early_stop`` as the trainer runs ``precision``. Compiled blocks
    skip it whatever the checkpoint's early stop says: AOTAutograd's partitioner re-runs in
    the backward only the forward nodes the backward needs (torch/_functorch/partitioners.py,
    ``required_bw_nodes``), and no backward op reads the down projection's output. An eager
    fp8 linear is a custom autograd Function (Transformer Engine's ``_Linear``, torchao's float8
    matmul) that saves its tensors after its GEMM, so an eager re-run reaches that GEMM."""
    compiled = runs.compile or (precision == "fp8" and runs.fp8_compiles)
    return compiled or (runs.recompute_early_stop and precision != "fp8")


def trainer_training(trainer: TrainerSpec, training: TrainingSpec) -> TrainingSpec:
    """``training`` as the trainer runs it: its run facts (gradient reduction and accumulation,
    dropout, kernels (fused for fp8 where the trainer compiles fp8 runs), loss and metrics, fp8
    scaling, caching and gathers, FlashAttention, FSDP copies and re-gathers, ring-attention
    merges, MoE dispatch, ...) from the profile, except those the user set."""
    runs = trainer.runs
    facts = {"grad_reduce_fp32": runs.grad_reduce_fp32 if isinstance(runs.grad_reduce_fp32, bool)
             else training.precision in ("bf16", "fp8"),
             "dropout": runs.dropout, "tp_overlap": runs.tp_overlap,
             "tp_dgrad_overlap": runs.tp_dgrad_overlap,
             "recompute_early_stop": _recompute_early_stop(runs, training.precision),
             "fp8_weight_cache": runs.fp8_weight_cache, "fp8_scaling": runs.fp8_scaling,
             "fp8_cast_kernels": runs.fp8_cast_kernels,
             "flash_attention_version": runs.flash_attention_version,
             "flash_attention_triton": runs.flash_attention_triton,
             "qkv_split_cat": runs.qkv_split_cat,
             "fsdp_copies": runs.fsdp_copies, "cp_merge": runs.cp_merge,
             "cp_kv_exchange": runs.cp_kv_exchange, "ddp_bucket_size": runs.ddp_bucket_size,
             "pp_grad_sync": runs.pp_grad_sync,
             "zero2_regather": runs.zero2_regather, "moe_dispatcher": runs.moe_dispatcher,
             "ddp_autocast": runs.ddp_autocast,
             "ddp_sync_every_microbatch": runs.ddp_sync_every_microbatch,
             "loss_kernels": runs.loss_kernels, "logit_metric_passes": runs.logit_metric_passes,
             "moe_a2a_overlap": runs.moe_a2a_overlap, "moe_host_sync_s": runs.moe_host_sync_s,
             "optimizer_impl": runs.optimizer_impl,
             "clip_scales_always": runs.clip_scales_always,
             "fused_rope_scales": runs.fused_rope_scales,
             "fp8_param_gather": runs.fp8_param_gather and training.precision == "fp8",
             "fp8_tp_gather": runs.fp8_tp_gather and training.precision == "fp8",
             "grad_accumulation": runs.grad_accumulation.get(training.precision),
             "zero1_grad_all_reduce": runs.zero1_grad_all_reduce
             if isinstance(runs.zero1_grad_all_reduce, bool) else training.precision == "bf16",
             "kernels": run_kernels(runs, training.precision)}
    return training.model_copy(update={k: v for k, v in facts.items()
                                       if k not in training.model_fields_set})


def run_kernels(runs: TrainerRuns, precision: str) -> Literal["fused", "eager"]:
    """Its non-GEMM kernels at ``precision``: fused fp8 if ``fp8_compiles``, else ``kernels``."""
    return "fused" if precision == "fp8" and runs.fp8_compiles else runs.kernels


def tp_overlap(runs: TrainerRuns, tp: int, sequence_parallel: bool) -> bool:
    """Whether the trainer overlaps the TP collectives of a plan with this tp and SP."""
    return bool(runs.tp_comm_overlap and tp > 1 and (sequence_parallel
                                                     or not runs.tp_comm_overlap_needs_sp))


def _words(values: list) -> str:
    items = [str(v) for v in values]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def optimizer_state_reasons(trainer: TrainerSpec, training: TrainingSpec) -> list[tuple]:
    """(field, value, why) for each optimizer state ``trainer`` cannot keep (none when it can)."""
    can, out = trainer.can.optimizer_states, []
    if training.moments_dtype == "bf16" and "bf16_moments" not in can:
        out.append(("--moments-dtype", "bf16", f"{trainer.label} keeps its optimizer moments in "
                    "fp32 (--moments-dtype bf16 needs a trainer whose profile lists bf16_moments)"))
    master = {"remainder": "remainder", "bf16": "bf16_master"}.get(training.master_weights_dtype)
    if training.master_weights and training.precision != "fp32" and master not in (None, *can):
        out.append(("training.master_weights_dtype", training.master_weights_dtype,
                    f"{trainer.label} keeps fp32 master weights, not "
                    f"master_weights_dtype={training.master_weights_dtype}"))
    return out
