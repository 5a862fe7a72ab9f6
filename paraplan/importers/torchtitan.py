"""Read a torchtitan v0.2.2 TOML (``[training]``, ``[parallelism]``,
``[activation_checkpoint]``, ``[compile]``, ``[model] converters`` and
``[quantize.linear.float8]``) back into a plan.

ZeRO stage from the data-parallel degrees and ``fsdp_reshard_after_forward``: replicate only
(DDP) is 0; sharding with ``never`` is 2, ``always`` is 3, and ``default`` is 3 without
pipelining and 2 with it (torchtitan ``models/llama3/infra/parallelize.py``:
``reshard_after_forward = not pp_enabled``). The layer split comes from
``module_fqns_per_model_part`` (``layers.<i>`` entries per part; parts / pp = virtual stages).
"""

from __future__ import annotations

from typing import Any

from paraplan.export.torchtitan import FLOAT8_CONVERTER
from paraplan.importers.common import ImportedConfig, ImportError_, as_int
from paraplan.specs import safe_io
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer_names import TORCHTITAN_ROTATE_METHODS

SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved"}


def looks_like_torchtitan(data: dict[str, Any]) -> bool:
    return isinstance(data.get("parallelism"), dict) and isinstance(data.get("training"), dict)


def parse_toml(text: str, where: str = "torchtitan config") -> dict[str, Any]:
    return safe_io.parse_toml(text, "trainer config", where)


def read_torchtitan(data: dict[str, Any], path: str = "") -> ImportedConfig:
    """The plan of a torchtitan job config."""
    par, tr = data.get("parallelism", {}), data.get("training", {})
    ac = data.get("activation_checkpoint", {}) or {}
    deg = lambda key: as_int(par.get(key, 1), f"parallelism.{key}")  # noqa: E731
    tp, pp, cp, ep = (deg(k) for k in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                       "context_parallel_degree", "expert_parallel_degree"))
    replicate = deg("data_parallel_replicate_degree")
    shard_raw = par.get("data_parallel_shard_degree", -1)
    shard = None if shard_raw == -1 else as_int(shard_raw,
                                                "parallelism.data_parallel_shard_degree")
    if shard == 1:
        zero = 0
    elif pp > 1:
        # torch.distributed.pipelining keeps FSDP parameters and gradients unsharded until
        # the last backward: ZeRO-1 whatever fsdp_reshard_after_forward says.
        zero = 1
    else:
        reshard = par.get("fsdp_reshard_after_forward", "default")
        zero = {"never": 2, "always": 3}.get(reshard, 3)
    dp = None if shard is None else replicate * shard
    parts = par.get("module_fqns_per_model_part")
    split, vpp = None, 1
    if parts:
        split = [sum(1 for name in part if str(name).startswith("layers.")) for part in parts]
        if len(split) % pp:
            raise ImportError_(f"{len(split)} model parts do not spread over pp={pp} ranks",
                               field="parallelism.module_fqns_per_model_part")
        vpp = len(split) // pp
        if len(set(split)) == 1:
            split = None
    name = par.get("pipeline_parallel_schedule", "1F1B")
    if pp > 1 and name not in SCHEDULES:
        raise ImportError_(f"pipeline_parallel_schedule {name!r} is not one paraplan models",
                           field="parallelism.pipeline_parallel_schedule", value=name,
                           allowed=list(SCHEDULES))
    schedule = SCHEDULES.get(name, "1f1b") if pp > 1 else "1f1b"
    if vpp > 1:
        schedule = "interleaved"
    mode = ac.get("mode", "selective")
    option = str(ac.get("selective_ac_option", "2"))
    if mode == "selective" and option not in ("op", "2"):
        raise ImportError_(f"selective_ac_option {option!r} (every n-th layer) is modelled for "
                           "n = 2 only; use '2', 'op', full or none", field="activation_checkpoint."
                           "selective_ac_option", value=option)
    rc = {"none": "none", "full": "full",
          "selective": "op" if option == "op" else "layer"}.get(mode)
    if rc is None:
        raise ImportError_(f"activation_checkpoint.mode {mode!r} is not modelled",
                           field="activation_checkpoint.mode", value=mode)
    mbs = as_int(par.get("pipeline_parallel_microbatch_size", 1) if pp > 1
                 else tr.get("local_batch_size", 8), "micro-batch size")
    plan = ParallelPlan(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
        etp=None if par.get("expert_tensor_parallel_degree", tp) == tp
        else as_int(par["expert_tensor_parallel_degree"], "expert_tensor_parallel_degree"),
        sequence_parallel=tp > 1, zero_stage=zero, micro_batch_size=mbs, schedule=schedule,
        virtual_stages=vpp, recompute=rc, layers_per_stage=split,
        tp_comm_overlap=bool(par.get("enable_async_tensor_parallel", False)))
    training: dict[str, Any] = {}
    if tr.get("global_batch_size", -1) not in (-1, None):
        training["global_batch_size"] = as_int(tr["global_batch_size"],
                                               "training.global_batch_size")
    if "seq_len" in tr:
        training["seq_len"] = as_int(tr["seq_len"], "training.seq_len")
    training["precision"] = "fp32" if tr.get("mixed_precision_param") == "float32" else "bf16"
    converters = (data.get("model") or {}).get("converters") or []
    if FLOAT8_CONVERTER in converters or "float8" in converters:
        # torchao Float8Linear; "float8" (in torchtitan's own llama3_405b.toml) is accepted
        # although v0.2.2 registers only "quantize.linear.float8".
        training["precision"] = "fp8"
        fp8 = ((data.get("quantize") or {}).get("linear") or {}).get("float8") or {}
        training["fp8_param_gather"] = bool(fp8.get("enable_fsdp_float8_all_gather", False))
        # The TP plan turns torchao's fp8 all-gathers on for a converter named "float8" with
        # tensorwise scaling (parallelize.py at v0.2.2 L77-86; TrainingSpec.fp8_tp_gather).
        rowwise = str(fp8.get("recipe_name", "")).startswith("rowwise")
        training["fp8_tp_gather"] = "float8" in converters and not rowwise
    comp = data.get("compile") or {}
    compiled = comp.get("components", ["model", "loss"]) if comp.get("enable") else []
    # What torch.compile covers, stated (fp8 would otherwise be priced compiled).
    training["kernels"] = "fused" if "model" in compiled else "eager"
    if "model" in compiled and "loss" not in compiled:
        training["loss_kernels"] = "eager"
    rotate = par.get("context_parallel_rotate_method", "allgather")
    if not isinstance(rotate, str) or rotate not in TORCHTITAN_ROTATE_METHODS:
        raise ImportError_(f"parallelism.context_parallel_rotate_method {rotate!r} is not one "
                           "torchtitan takes", field="parallelism.context_parallel_rotate_method",
                           value=rotate, allowed=list(TORCHTITAN_ROTATE_METHODS))
    if cp > 1:
        training["cp_kv_exchange"] = TORCHTITAN_ROTATE_METHODS[rotate]
    return ImportedConfig("torchtitan", plan, training, {}, path)
