"""Read a Megatron-LM launch (a ``MEGATRON_ARGS=(...)`` bash array as ``paraplan export --to
megatron`` writes it, or any text of ``--flag value`` arguments) back into a plan.

Flags as ``megatron/training/arguments.py`` (core_v0.15) defines them: parallel sizes,
``--sequence-parallel``, interleaving (``--num-layers-per-virtual-pipeline-stage`` or
``--num-virtual-stages-per-pipeline-rank``), uneven splits (``--decoder-first/last-pipeline-
num-layers``, ``--pipeline-model-parallel-layout``), batch, recompute, distributed optimizer /
Megatron-FSDP, the overlaps (absent flag = off, as in Megatron), gradient buckets
(``--ddp-bucket-size``) and accumulation (``--no-gradient-accumulation-fusion``), precision
and dropout (defaults 0.1).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from paraplan.importers.common import ImportedConfig, ImportError_, as_int
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer_names import MEGATRON_FP8_RECIPES, MEGATRON_FSDP_SHARDING
from paraplan.specs.training import MAX_BUCKET_ELEMENTS


def looks_like_megatron(text: str) -> bool:
    return "MEGATRON_ARGS=(" in text or "--tensor-model-parallel-size" in text


def flags_of(text: str) -> dict[str, list[str]]:
    """``--flag`` -> its values, from a MEGATRON_ARGS array (or the whole text)."""
    m = re.search(r"MEGATRON_ARGS=\((.*?)\)", text, re.S)
    body = m.group(1) if m else text
    try:
        tokens = shlex.split(body, comments=True)
    except ValueError as exc:
        raise ImportError_(f"cannot split the Megatron arguments: {exc}",
                           field="MEGATRON_ARGS") from None
    flags: dict[str, list[str]] = {}
    current = None
    for raw in tokens:
        tok = re.sub(r"^[A-Za-z_][A-Za-z0-9_]*=\(", "", raw).strip("()")
        if tok.startswith("--"):
            name, eq, value = tok.partition("=")
            current = name
            flags[current] = [value] if eq else []
            if eq:
                current = None
        elif current is not None and tok:
            flags[current].append(tok)  # one value per flag; stray words are not values
            current = None
    return flags


def _one(flags: dict[str, list[str]], name: str, default: Any = None) -> Any:
    values = flags.get(name)
    if values is None:
        return default
    if len(values) != 1:
        raise ImportError_(f"{name} needs one value (got {values})", field=name)
    return values[0]


def _layout(text: str) -> list[int]:
    """Transformer layers per chunk of a --pipeline-model-parallel-layout ('Et|tt|ttmL'): the
    multi-token-prediction layers (m) sit with the loss on the last chunk, where paraplan
    prices them (they are not decoder layers of the split)."""
    out = []
    segments = text.split("|")
    for i, segment in enumerate(segments):
        body = segment.replace("E", "").replace("L", "")
        if i == len(segments) - 1:
            body = body.replace("m", "")
        if set(body) - {"t"}:
            raise ImportError_(f"--pipeline-model-parallel-layout segment {segment!r} is not "
                               "E/t/L only, with m (MTP) on the last one (repeat syntax is "
                               "not read)", field="--pipeline-model-parallel-layout",
                               value=text)
        out.append(len(body))
    return out


def read_megatron(text: str, path: str = "") -> ImportedConfig:
    """The plan of a Megatron launch."""
    f = flags_of(text)
    size = lambda name, default=1, high=None: as_int(_one(f, name, default), name,  # noqa: E731
                                                    high=high)
    tp, pp, cp = (size(n) for n in ("--tensor-model-parallel-size",
                                    "--pipeline-model-parallel-size", "--context-parallel-size"))
    ep = size("--expert-model-parallel-size")
    etp = _one(f, "--expert-tensor-parallel-size")
    layers = _one(f, "--num-layers")
    model = {} if layers is None else {"num_layers": as_int(layers, "--num-layers")}
    for flag, key in (("--hidden-size", "hidden_size"),
                      ("--num-attention-heads", "num_attention_heads")):
        if flag in f:
            model[key] = as_int(_one(f, flag), flag)
    vpp, split = 1, None
    if "--num-virtual-stages-per-pipeline-rank" in f:
        vpp = size("--num-virtual-stages-per-pipeline-rank")
    elif "--num-layers-per-virtual-pipeline-stage" in f:
        per = size("--num-layers-per-virtual-pipeline-stage")
        if "num_layers" not in model:
            raise ImportError_("--num-layers-per-virtual-pipeline-stage needs --num-layers",
                               field="--num-layers")
        vpp = model["num_layers"] // (pp * per)
    if "--pipeline-model-parallel-layout" in f:
        split = _layout(_one(f, "--pipeline-model-parallel-layout"))
        vpp = max(1, len(split) // pp)
    elif "--decoder-first-pipeline-num-layers" in f or "--decoder-last-pipeline-num-layers" in f:
        if "num_layers" not in model or pp < 2:
            raise ImportError_("--decoder-first/last-pipeline-num-layers need --num-layers and "
                               "pp > 1", field="--decoder-first-pipeline-num-layers")
        first = as_int(_one(f, "--decoder-first-pipeline-num-layers", 0), "first", 0)
        last = as_int(_one(f, "--decoder-last-pipeline-num-layers", 0), "last", 0)
        rest = model["num_layers"] - first - last
        if pp == 2:
            split = [first, last]
        elif rest % (pp - 2):
            raise ImportError_(f"{rest} middle layers do not split over {pp - 2} stages",
                               field="--decoder-first-pipeline-num-layers")
        else:
            split = [first] + [rest // (pp - 2)] * (pp - 2) + [last]
    rc = {"full": "full", "selective": "selective"}.get(
        _one(f, "--recompute-granularity", "none"), "none")
    if "--recompute-activations" in f:
        rc = "selective"
    zero = 0
    if "--use-distributed-optimizer" in f:
        zero = 1
    if "--use-megatron-fsdp" in f:
        strategy = _one(f, "--data-parallel-sharding-strategy", "no_shard")
        if strategy not in MEGATRON_FSDP_SHARDING:
            raise ImportError_(f"--data-parallel-sharding-strategy {strategy!r} is unknown",
                               field="--data-parallel-sharding-strategy", value=strategy,
                               allowed=list(MEGATRON_FSDP_SHARDING))
        zero = max(zero, MEGATRON_FSDP_SHARDING[strategy])
    if "--use-torch-fsdp2" in f:
        zero = 3
    plan = ParallelPlan(
        tp=tp, pp=pp, cp=cp, ep=ep, etp=None if etp is None or int(etp) == tp else int(etp),
        sequence_parallel="--sequence-parallel" in f and tp > 1, zero_stage=zero,
        micro_batch_size=size("--micro-batch-size"), virtual_stages=vpp,
        schedule="interleaved" if vpp > 1 else "1f1b", recompute=rc, layers_per_stage=split,
        overlap_grad_reduce="--overlap-grad-reduce" in f,
        overlap_p2p_comm="--no-overlap-p2p-communication" not in f,
        tp_comm_overlap="--tp-comm-overlap" in f)
    training: dict[str, Any] = {}
    if "--global-batch-size" in f:
        training["global_batch_size"] = size("--global-batch-size")
    if "--seq-length" in f:
        training["seq_len"] = size("--seq-length")
    training["precision"] = ("fp8" if "--fp8-format" in f else "bf16" if "--bf16" in f
                             else "fp16" if "--fp16" in f else "fp32")
    recipe = _one(f, "--fp8-recipe", "delayed")
    scaling = MEGATRON_FP8_RECIPES.get(recipe)
    if scaling is None:
        raise ImportError_(f"--fp8-recipe {recipe!r} is not one paraplan models",
                           field="--fp8-recipe", value=recipe, allowed=list(MEGATRON_FP8_RECIPES))
    training["fp8_scaling"] = scaling
    hidden = float(_one(f, "--hidden-dropout", 0.1))
    attention = float(_one(f, "--attention-dropout", 0.1))
    training["dropout"] = hidden > 0 or attention > 0
    if "--grad-reduce-in-bf16" in f:
        training["grad_reduce_fp32"] = False
    # A script states its optimizer's moments either way (fp32 without the flag).
    training.update(_optimizer_dtypes(f) if "--use-precision-aware-optimizer" in f
                    else {"moments_dtype": "fp32"})
    if "--ddp-bucket-size" in f:
        training["ddp_bucket_size"] = size("--ddp-bucket-size", high=MAX_BUCKET_ELEMENTS)
    if "--no-gradient-accumulation-fusion" in f:
        # The weight-gradient GEMM writes param.grad and the DDP hook adds it into the fp32
        # main_grad (core/distributed/distributed_data_parallel.py _make_backward_post_hook).
        training["grad_accumulation"] = "eager"
    training.update(_moe_facts(f))
    if "--moe-pad-expert-input-to-capacity" in f and "--moe-expert-capacity-factor" in f:
        factor = _one(f, "--moe-expert-capacity-factor")
        try:
            plan = plan.model_copy(update={"moe_capacity_factor": float(factor)})
        except ValueError:
            raise ImportError_(f"--moe-expert-capacity-factor {factor!r} is not a number",
                               field="--moe-expert-capacity-factor", value=factor) from None
    return ImportedConfig("megatron-core", plan, training, model, path)


def _moe_facts(f: dict[str, list[str]]) -> dict[str, Any]:
    """The MoE run facts the launch states (``TrainingSpec`` fields): the flex dispatcher
    with DeepEP/HybridEP (``--moe-enable-deepep``, later ``--moe-flex-dispatcher-backend``)
    is ``hierarchical``; ``--overlap-moe-expert-parallel-comm`` the all-to-all overlap;
    ``--moe-router-force-load-balancing`` balanced routing (``moe_load_imbalance`` 1.0);
    the flex dispatcher's SMs ``moe_dispatcher_sms``."""
    out: dict[str, Any] = {}
    if "--moe-token-dispatcher-type" in f:
        flex = _one(f, "--moe-token-dispatcher-type") == "flex"
        out["moe_dispatcher"] = "hierarchical" if flex else "alltoall"
    if "--overlap-moe-expert-parallel-comm" in f:
        out["moe_a2a_overlap"] = True
    if "--moe-router-force-load-balancing" in f:
        out["moe_load_imbalance"] = 1.0
    # The flex dispatcher's SMs (``moe_dispatcher_sms``): core_v0.15.3 --moe-deepep-num-sms,
    # later --moe-flex-dispatcher-num-sms (and the deprecated --moe-hybridep-num-sms).
    for flag in ("--moe-flex-dispatcher-num-sms", "--moe-deepep-num-sms",
                 "--moe-hybridep-num-sms"):
        if flag in f:
            value = _one(f, flag)
            if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 1024:
                raise ImportError_(f"{flag} {value!r} must be a whole number of SMs, 1-1024",
                                   field=flag, value=value, allowed="1-1024")
            out["moe_dispatcher_sms"] = int(value)
            break
    return out


def _optimizer_dtypes(f: dict[str, list[str]]) -> dict[str, Any]:
    """``--use-precision-aware-optimizer``'s state dtypes (Megatron-LM arguments.py: main
    params fp32 or fp16, each Adam moment fp32, fp16, bf16 or fp8), as far as paraplan models
    them: both moments in fp32 or both in bf16, main params in fp32."""
    main = _one(f, "--main-params-dtype", "fp32")
    if main != "fp32":
        raise ImportError_(f"--main-params-dtype {main!r} is not modelled", value=main,
                           field="--main-params-dtype", allowed=["fp32"])
    avg, avg_sq = _one(f, "--exp-avg-dtype", "fp32"), _one(f, "--exp-avg-sq-dtype", "fp32")
    for flag, dtype in (("--exp-avg-dtype", avg), ("--exp-avg-sq-dtype", avg_sq)):
        if dtype not in ("fp32", "bf16") or dtype != avg:
            raise ImportError_(f"{flag} {dtype!r} is not modelled (both moments fp32 or both "
                               "bf16)", field=flag, value=dtype, allowed=["fp32", "bf16"])
    return {"moments_dtype": avg}

