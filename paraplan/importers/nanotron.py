"""Read a nanotron YAML (``parallelism``, ``tokens``, ``optimizer``, ``model.model_config``)
back into a plan. ``pp_engine`` afab is GPipe; ``tp_mode`` REDUCE_SCATTER is sequence
parallelism; ``recompute_layer`` is full recompute; the global batch is
``micro_batch_size * batch_accumulation_per_replica * dp`` (nanotron ``config.py``)."""

from __future__ import annotations

from typing import Any

from paraplan.importers.common import ImportedConfig, ImportError_, as_int, need
from paraplan.specs.plan import ParallelPlan


def looks_like_nanotron(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("parallelism"), dict) \
        and isinstance(data.get("tokens"), dict)


def read_nanotron(data: dict[str, Any], path: str = "") -> ImportedConfig:
    """The plan of a nanotron config."""
    par, tok = data["parallelism"], data["tokens"]
    dp, pp, tp = (as_int(need(par, k, "parallelism"), f"parallelism.{k}")
                  for k in ("dp", "pp", "tp"))
    engine = str(par.get("pp_engine", "afab")).lower()
    if engine not in ("afab", "1f1b"):
        raise ImportError_(f"parallelism.pp_engine {engine!r} is not afab or 1f1b",
                           field="parallelism.pp_engine", value=engine)
    opt = data.get("optimizer") or {}
    zero = as_int(opt.get("zero_stage", 0), "optimizer.zero_stage", 0)
    mbs = as_int(need(tok, "micro_batch_size", "tokens"), "tokens.micro_batch_size")
    acc = as_int(tok.get("batch_accumulation_per_replica", 1),
                 "tokens.batch_accumulation_per_replica")
    plan = ParallelPlan(
        tp=tp, pp=pp, dp=dp, cp=as_int(par.get("context_parallel_size", 1),
                                       "parallelism.context_parallel_size"),
        sequence_parallel=str(par.get("tp_mode", "ALL_REDUCE")).upper() == "REDUCE_SCATTER"
        and tp > 1, zero_stage=min(zero, 1), micro_batch_size=mbs,
        schedule="gpipe" if engine == "afab" else "1f1b",
        recompute="full" if par.get("recompute_layer") else "none",
        tp_comm_overlap=bool(par.get("tp_linear_async_communication", False)))
    training: dict[str, Any] = {"global_batch_size": mbs * acc * dp}
    if "sequence_length" in tok:
        training["seq_len"] = as_int(tok["sequence_length"], "tokens.sequence_length")
    if "accumulate_grad_in_fp32" in opt:
        training["grad_reduce_fp32"] = bool(opt["accumulate_grad_in_fp32"])
    shape = (data.get("model") or {}).get("model_config") or {}
    model = {k: v for k, v in (("num_layers", shape.get("num_hidden_layers")),
                               ("hidden_size", shape.get("hidden_size")),
                               ("num_attention_heads", shape.get("num_attention_heads")))
             if isinstance(v, int)}
    return ImportedConfig("nanotron", plan, training, model, path)
