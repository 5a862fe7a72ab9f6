"""Read a DeepSpeed config JSON (as ``paraplan export --to deepspeed`` writes it) back into a
plan: the batch triple, ``zero_optimization.stage``, ``overlap_comm`` and
``reduce_bucket_size``, AutoTP (``tensor_parallel.autotp_size``), the pipeline block
(``pipeline.stages``; 1F1B, even split), activation checkpointing (whole layers) and which
optimizer wrapper accumulates the gradients (``data_types.grad_accum_dtype``)."""

from __future__ import annotations

from typing import Any

from paraplan.importers.common import ImportedConfig, ImportError_, as_int
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import MAX_BUCKET_ELEMENTS


def looks_like_deepspeed(data: Any) -> bool:
    return isinstance(data, dict) and ("zero_optimization" in data
                                       or "train_micro_batch_size_per_gpu" in data)


def read_deepspeed(data: dict[str, Any], path: str = "") -> ImportedConfig:
    """The plan of a DeepSpeed config."""
    mbs = as_int(data.get("train_micro_batch_size_per_gpu", 1), "train_micro_batch_size_per_gpu")
    zero_cfg = data.get("zero_optimization", {}) or {}
    if not isinstance(zero_cfg, dict):
        raise ImportError_("zero_optimization must be an object", field="zero_optimization")
    zero = as_int(zero_cfg.get("stage", 0), "zero_optimization.stage", 0)
    if zero > 3:
        raise ImportError_(f"zero_optimization.stage={zero} must be 0-3",
                           field="zero_optimization.stage", value=zero)
    tp = as_int((data.get("tensor_parallel") or {}).get("autotp_size", 1),
                "tensor_parallel.autotp_size")
    pipe = data.get("pipeline") or {}
    pp = as_int(pipe.get("stages", 1), "pipeline.stages")
    full = bool(data.get("activation_checkpointing")) or bool(
        pipe.get("activation_checkpoint_interval", 0))
    plan = ParallelPlan(tp=tp, pp=pp, zero_stage=zero, micro_batch_size=mbs,
                        recompute="full" if full else "none",
                        overlap_grad_reduce=bool(zero_cfg.get("overlap_comm", False)))
    training: dict[str, Any] = {}
    if "train_batch_size" in data:
        training["global_batch_size"] = as_int(data["train_batch_size"], "train_batch_size")
    enabled = lambda key: bool((data.get(key) or {}).get("enabled"))  # noqa: E731
    training["precision"] = ("bf16" if enabled("bf16") or enabled("bfloat16")
                             else "fp16" if enabled("fp16") else "fp32")
    if "reduce_bucket_size" in zero_cfg:
        size = zero_cfg["reduce_bucket_size"]  # DeepSpeed configs often write 5e8
        if isinstance(size, float) and size.is_integer():
            size = int(size)
        training["ddp_bucket_size"] = as_int(size, "zero_optimization.reduce_bucket_size",
                                             high=MAX_BUCKET_ELEMENTS)
    if training["precision"] == "bf16":
        training.update(_bf16_wrapper(data, zero))
    return ImportedConfig("deepspeed", plan, training, {}, path)


GRAD_ACCUM_DTYPES = {name: dtype for dtype, names in (
    ("fp32", ("fp32", "float32", "float", "torch.float32")),
    ("fp16", ("fp16", "float16", "half", "torch.float16")),
    ("bf16", ("bf16", "bfloat16", "torch.bfloat16"))) for name in names}
"""The spellings DeepSpeed's ``DtypeEnum`` takes (runtime/config.py at 38327e0) -> dtype."""


def _bf16_wrapper(data: dict[str, Any], zero: int) -> dict[str, Any]:
    """How a bf16 run accumulates and reduces its gradients, as DeepSpeed picks its optimizer
    wrapper (runtime/engine.py ``get_data_types``, ``_do_optimizer_sanity_check`` at
    38327e0): ``grad_accum_dtype`` defaults to fp32 without ZeRO and to bf16 with it; fp32
    with ZeRO-0/1 is the BF16 optimizer (the ``deepspeed`` profile's facts: fp32 adds after
    every micro-batch, the whole gradient all-reduced; with ZeRO-2/3 the gradients are
    reduce-scattered every micro-batch, so no accumulation pass is priced either way); bf16
    with ZeRO is the ZeRO optimizer, which lets autograd accumulate ``.grad`` in bf16 and
    reduces it partitioned."""
    types = data.get("data_types") or {}
    if not isinstance(types, dict):
        raise ImportError_("data_types must be an object", field="data_types")
    raw = types.get("grad_accum_dtype") or ("bf16" if zero >= 1 else "fp32")
    dtype = GRAD_ACCUM_DTYPES.get(raw) if isinstance(raw, str) else None
    if dtype is None:
        raise ImportError_(f"data_types.grad_accum_dtype {raw!r} is not a dtype DeepSpeed "
                           "takes", field="data_types.grad_accum_dtype", value=raw,
                           allowed=sorted(GRAD_ACCUM_DTYPES))
    if dtype == "fp32":  # the profile's facts (what the exporter writes)
        return {}
    return {"grad_accumulation": "eager", "zero1_grad_all_reduce": False}
