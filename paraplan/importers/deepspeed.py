"""Read a DeepSpeed config JSON (as ``paraplan export --to deepspeed`` writes it) back into a
plan: the batch triple, ``zero_optimization.stage`` and ``overlap_comm``, AutoTP
(``tensor_parallel.autotp_size``), the pipeline block (``pipeline.stages``; 1F1B, even
split) and activation checkpointing (whole layers)."""

from __future__ import annotations

from typing import Any

from paraplan.importers.common import ImportedConfig, ImportError_, as_int
from paraplan.specs.plan import ParallelPlan


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
    return ImportedConfig("deepspeed", plan, training, {}, path)
