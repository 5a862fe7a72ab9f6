"""torchtitan TOML for a plan, pinned to the v0.2.2 ``JobConfig`` schema.

Tables and keys are those of ``torchtitan/config/job_config.py`` at v0.2.2 (recorded in
``tests/data/trainer_keys/torchtitan_v0.2.txt``): ``[training]``, ``[parallelism]``,
``[activation_checkpoint]``, and ``[model]`` name and flavor when the model is one of
torchtitan's architectures (``PRESET_FLAVORS``). The file holds what the plan decides; merge
it into a base config (optimizer, data, and the model for any other shape) such as
``torchtitan/models/llama3/train_configs/llama3_70b.toml``.

Mapping (torchtitan v0.2.2 semantics):
- DP: ZeRO-0 is DDP (``data_parallel_replicate_degree = dp``); ZeRO-3 is FSDP2
  (``data_parallel_shard_degree = dp``); ZeRO-2 is FSDP2 that keeps parameters gathered
  after the forward (``fsdp_reshard_after_forward = "never"``). ZeRO-1 has no equivalent.
- Batch: without PP ``local_batch_size`` is the micro-batch and ``global_batch_size`` larger
  than ``local_batch_size * dp`` means gradient accumulation; with PP ``local_batch_size``
  is the replica's batch per step and ``pipeline_parallel_microbatch_size`` the micro-batch
  (``n_microbatches = local_batch_size // pipeline_parallel_microbatch_size``, which must be
  at least the number of stages).
- Pipeline split: always written explicitly as ``module_fqns_per_model_part`` (torchtitan's
  default split counts the embedding and the output as layers, which is not paraplan's), with
  the module names of torchtitan's Llama 3 / DeepSeek-V3 models (``tok_embeddings``,
  ``layers.<i>``, ``norm``, ``output``).
- Recompute: full -> ``mode = "full"``; op -> ``mode = "selective"``,
  ``selective_ac_option = "op"``; layer -> ``mode = "selective"``, ``selective_ac_option =
  "2"`` (every other layer); Megatron's selective (attention core) has no equivalent.
- fp8: ``[model] converters = ["quantize.linear.float8"]`` (torchao tensorwise), ``[compile]``
  on, and ``[quantize.linear.float8]`` with fp8 FSDP all-gathers where FSDP shards.
"""

from __future__ import annotations

import json
from typing import Any

from paraplan.export.common import (
    ExportContext,
    refuse,
    refuse_optimizer_state,
    refuse_relaxed_sync,
)
from paraplan.specs.loaders import load_trainer
from paraplan.specs.model import ModelSpec
from paraplan.specs.trainer import trainer_training
from paraplan.specs.trainer_names import TORCHTITAN_ROTATE_METHODS
from paraplan.specs.trainer_rules import ddp_beside_others, mixed_precision_off

TRAINER = "torchtitan"
FLOAT8_CONVERTER = "quantize.linear.float8"
"""The ``model.converters`` name torchtitan v0.2.2 registers for torchao's Float8Linear
(components/quantization/float8.py L238)."""
VERSION = "v0.2.2"
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
ACTIVATION_CHECKPOINT: dict[str, dict[str, str]] = {
    "none": {"mode": "none"}, "full": {"mode": "full"},
    "op": {"mode": "selective", "selective_ac_option": "op"},
    "layer": {"mode": "selective", "selective_ac_option": "2"},
}
"""Plan recompute -> torchtitan ``[activation_checkpoint]`` (Megatron's selective is refused)."""


# torchtitan v0.2.2 model flavors (torchtitan/models/<name>/__init__.py) that paraplan has as
# presets with the same architecture: a model whose whole shape (``_shape``) equals one of
# these presets gets its [model] table; any other needs a base config of the user's. Llama 4's
# chunked attention is the "_irope" flavors (every_n_layers_nope=4, block-causal flex).
PRESET_FLAVORS: dict[str, tuple[str, str]] = {
    "llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
    "llama3-405b": ("llama3", "405B"), "deepseek-v3": ("deepseek_v3", "671B"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B"), "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
    "llama4-scout": ("llama4", "17bx16e_irope"), "llama4-maverick": ("llama4", "17bx128e_irope"),
    "gpt-oss-20b": ("gpt_oss", "20b"), "gpt-oss-120b": ("gpt_oss", "120b"),
}


def _shape(model: ModelSpec) -> tuple:
    """Every field that changes the architecture (not its name, sources or published counts)."""
    skip = {"name", "display_name", "family", "sources", "published_params_b",
            "published_active_params_b", "published_active_excludes_embedding",
            "max_position_embeddings"}
    return tuple(sorted((k, repr(v)) for k, v in model.model_dump().items() if k not in skip))


def flavor_of(model: ModelSpec) -> tuple[str, str] | None:
    """torchtitan's (model name, flavor) for ``model`` when it is one of ``PRESET_FLAVORS``'
    architectures, field for field; None otherwise."""
    from paraplan.specs.loaders import load_model

    shape = _shape(model)
    for preset, flavor in PRESET_FLAVORS.items():
        if _shape(load_model(preset)) == shape:
            return flavor
    return None


def torchtitan_config(ctx: ExportContext) -> dict[str, dict[str, Any]]:
    """The plan as torchtitan TOML tables (``{table: {key: value}}``).

    Raises:
        ExportError: a rule is broken or the plan uses something torchtitan cannot express.
    """
    m, t, p = ctx.model, ctx.training, ctx.plan
    _check(ctx)
    mbs, micro = p.micro_batch_size, ctx.num_microbatches
    training: dict[str, Any] = {
        "local_batch_size": mbs * micro if p.pp > 1 else mbs,
        "global_batch_size": t.global_batch_size,
        "seq_len": t.seq_len,
        "mixed_precision_param": "float32" if t.precision == "fp32" else "bfloat16",
    }
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": ctx.dp if p.zero_stage == 0 else 1,
        "data_parallel_shard_degree": 1 if p.zero_stage == 0 else ctx.dp,
        "tensor_parallel_degree": p.tp,
        "pipeline_parallel_degree": p.pp,
        "context_parallel_degree": p.cp,
        "expert_parallel_degree": p.ep,
    }
    if p.cp > 1:
        par["context_parallel_rotate_method"] = next(
            name for name, kind in TORCHTITAN_ROTATE_METHODS.items() if kind == t.cp_kv_exchange)
    if p.zero_stage == 2:
        par["fsdp_reshard_after_forward"] = "never"
    # zero_stage=1 with pp > 1 is FSDP under pipelining: torchtitan's "default" policy keeps
    # parameters gathered (parallelize.py: reshard_after_forward = not pp_enabled) and
    # torch.distributed.pipelining syncs gradients on the last backward only.
    if m.is_moe:
        par["expert_tensor_parallel_degree"] = p.expert_tp
    if p.tp_comm_overlap:
        par["enable_async_tensor_parallel"] = True
    if p.pp > 1:
        schedule = SCHEDULES.get(p.schedule)
        if p.schedule == "zb-h1":
            schedule = "InterleavedZeroBubble"
        par["pipeline_parallel_schedule"] = schedule
        par["pipeline_parallel_microbatch_size"] = mbs
        par["module_fqns_per_model_part"] = _model_parts(ctx)
    ac: dict[str, Any] = dict(ACTIVATION_CHECKPOINT[p.recompute])
    tables: dict[str, dict[str, Any]] = {}
    flavor = flavor_of(m)
    if flavor is not None:
        tables["model"] = {"name": flavor[0], "flavor": flavor[1]}
    if t.precision == "fp8":
        tables.update(_float8_tables(ctx, tables.get("model", {})))
    return {**tables, "training": training, "parallelism": par, "activation_checkpoint": ac}


def _float8_tables(ctx: ExportContext, model_table: dict[str, Any]) -> dict[str, dict]:
    """fp8 as torchtitan v0.2.2 trains it: torchao tensorwise ``Float8Linear`` through the
    ``quantize.linear.float8`` converter, compiled (docs/float8.md: compile is "required for
    competitive performance"), fp8 FSDP all-gathers when FSDP shards, the output layer left
    in 16 bits (as torchtitan's llama3_405b.toml)."""
    # fp8 gathers as simulate prices them: the profile's fact unless the user set it, and
    # only where FSDP shards over data-parallel replicas (TrainingSpec.param_gather_bytes).
    training = trainer_training(load_trainer(TRAINER), ctx.training)
    gather = ctx.plan.zero_stage >= 1 and training.param_gather_bytes(ctx.dp) == 1
    return {
        "model": {**model_table, "converters": [FLOAT8_CONVERTER]},
        "compile": {"enable": True, "components": ["model", "loss"]},
        "quantize.linear.float8": {"enable_fsdp_float8_all_gather": gather,
                                   "precompute_float8_dynamic_scale_for_fsdp": gather,
                                   "filter_fqns": ["output"]},
    }


def _check(ctx: ExportContext) -> None:
    m, t, p = ctx.model, ctx.training, ctx.plan
    refuse_relaxed_sync(ctx.plan, TRAINER)
    refuse_optimizer_state(ctx.training, TRAINER)
    if p.pp > 1 and m.tie_word_embeddings:
        raise refuse("pp", p.pp, TRAINER, "torchtitan raises NotImplementedError for weight "
                     "tying with pipeline parallelism; use pp=1 or an untied model")
    if ddp_beside_others(p.zero_stage, p.dp, p.tp, p.pp, p.cp):
        raise refuse("zero_stage", 0, TRAINER, "torchtitan's DDP runs alone ('DDP has not "
                     "supported > 1D parallelism') and with cp > 1 it applies FSDP over the "
                     "CP ranks; shard with FSDP (zero_stage >= 1)")
    if t.precision != "fp32" and mixed_precision_off(p.zero_stage, p.dp, p.tp, p.pp, p.cp):
        raise refuse("training.precision", t.precision, TRAINER, "with tp or pp torchtitan "
                     "trains in mixed precision only under FSDP (zero_stage >= 1 over dp > 1, "
                     "or cp > 1); otherwise in fp32")
    if p.zero_stage == 1 and p.pp == 1:
        raise refuse("zero_stage", 1, TRAINER, "torchtitan shards with FSDP2: zero_stage=3, or "
                     "2 (fsdp_reshard_after_forward = never), or 0 for DDP")
    if p.zero_stage >= 2 and p.pp > 1:
        raise refuse("zero_stage", p.zero_stage, TRAINER, "with pipelining FSDP keeps "
                     "parameters and gradients unsharded until the last backward "
                     "(torch.distributed.pipelining), which is zero_stage=1; or 0 for DDP")
    if p.ep > 1 and p.zero_stage == 0:
        raise refuse("ep", p.ep, TRAINER, "expert parallelism is carved out of the FSDP "
                     "dimension; use zero_stage=2 or 3 (1 with pipelining)")
    if m.is_moe and p.expert_tp not in (1, p.tp):
        raise refuse("etp", p.expert_tp, TRAINER, f"expert_tensor_parallel_degree must be 1 "
                     f"or tp={p.tp}")
    if p.recompute == "selective":
        raise refuse("recompute", "selective", TRAINER, "torchtitan's selective checkpointing "
                     "is op-level (recompute=op) or every n-th layer; Megatron's attention-core "
                     "recompute has no torchtitan option")
    if t.precision == "fp16":
        raise refuse("training.precision", t.precision, TRAINER, "bf16, fp32 "
                     "(mixed_precision_param) or fp8 (the quantize.linear.float8 converter)")
    if t.precision == "fp8" and m.is_moe:
        raise refuse("training.precision", "fp8", TRAINER, "bf16 for mixture-of-experts "
                     "models: torchtitan's float8 converter converts nn.Linear only, and fp8 "
                     "experts are the prototype quantize.grouped_mm.float8")
    if t.precision == "fp8" and t.kernels == "eager":
        raise refuse("training.kernels", "eager", TRAINER, "fp8 runs compiled: the export "
                     "turns torch.compile on with the float8 converter")
    if p.schedule == "zb-h1" and p.virtual_stages == 1:
        raise refuse("schedule", "zb-h1", TRAINER, "torchtitan's zero-bubble schedules "
                     "(InterleavedZeroBubble, ZBVZeroBubble) need virtual_stages > 1")
    if p.pp > 1 and ctx.num_microbatches < p.pp * p.virtual_stages:
        raise refuse("micro_batch_size", p.micro_batch_size, TRAINER,
                     f"{ctx.num_microbatches} micro-batches per step is fewer than the "
                     f"{p.pp * p.virtual_stages} pipeline stages; torchtitan needs at least one "
                     "per stage")


def _model_parts(ctx: ExportContext) -> list[list[str]]:
    parts, layer = [], 0
    chunks = ctx.chunk_layers
    for c, n in enumerate(chunks):
        names = [f"layers.{i}" for i in range(layer, layer + n)]
        layer += n
        if c == 0:
            names.insert(0, "tok_embeddings")
        if c == len(chunks) - 1:
            names += ["norm", "output"]
        parts.append(names)
    return parts


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def torchtitan_toml(ctx: ExportContext, header: list[str]) -> str:
    """The TOML text (tables in the order training, parallelism, activation_checkpoint)."""
    tables = torchtitan_config(ctx)
    lines = [f"# {h}" for h in header]
    if ctx.plan.tp > 1 and not ctx.plan.sequence_parallel:
        lines.append("# note: torchtitan's tensor parallelism always shards the norms along "
                     "the sequence (as sequence_parallel=true), which only lowers memory")
    for name, table in tables.items():
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
