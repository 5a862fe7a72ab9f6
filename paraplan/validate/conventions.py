"""Each published source's own conventions: FLOP formulas, metric units and its trainer.

TFLOP/s and MFU figures are only comparable once every row is turned back into a
convention-free quantity with the formula its authors used (``sources.md``). This module
holds those formulas (each with its citation), the conversion of a published metric to
seconds per optimizer step and back, and the per-source facts the loader needs (which
software produced the run, whether it used FlashAttention, which formula it divides by).
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- FLOP formulas, exactly as each source writes them ---------------------------------------


def narayanan_flops_per_iteration(batch: int, seq_len: int, layers: int, hidden: int,
                                  vocab: int) -> float:
    """Hardware FLOPs of one iteration with full activation recomputation.

    Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM" (arXiv:2104.04473), eq. (3): ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``. The
    factor 96 = 4 x 24 counts forward, backward (2x) and the recomputed forward.
    Megatron-DeepSpeed's ``throughput_calculator`` (``checkpoint_activations_factor = 4``) logs
    BLOOM's "TFLOPs" with the same expression: it reproduces tr11's 149.77 TFLOP/s from
    104.7 s/iteration at 384 GPUs.
    """
    b, s, n_l, h, v = batch, seq_len, layers, hidden, vocab
    return 96.0 * b * s * n_l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * n_l * h))


def korthikanti_model_flops_per_iteration(batch: int, seq_len: int, layers: int, hidden: int,
                                          vocab: int) -> float:
    """Model FLOPs (no recomputation) of one iteration, the numerator of Korthikanti's MFU.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
    (arXiv:2205.05198), sec. 6.3: ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` (forward + backward =
    3 x 24; the logit layer counted as 6 B s h V). MFU divides it by step time x GPUs x 312 TF.
    """
    b, s, n_l, h, v = batch, seq_len, layers, hidden, vocab
    return 72.0 * b * s * n_l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * n_l * h))


def dtfm_flops_per_iteration(batch: int, seq_len: int, layers: int, hidden: int) -> float:
    """FLOPs the DT-FM authors print for their Megatron baselines (forward + 3x backward).

    DS3Lab/Decentralized_FM_alpha ``results/gpt3_xl_fp16.md`` ("Computation of GPT3-XL (in PFlop):
    23.64; Forward: 5.91; Backward (with activation recompute X3): 17.73"): forward
    ``24 B s l h^2 (1 + s/(6h))`` with no logit layer, times 4 for backward with recompute.
    """
    b, s, n_l, h = batch, seq_len, layers, hidden
    return 4.0 * 24.0 * b * s * n_l * h * h * (1.0 + s / (6.0 * h))


def palm_flops_per_token(num_params: float, layers: int, hidden: int, seq_len: int) -> float:
    """PaLM's model FLOPs per token, ``6 N + 12 L H Q T`` (Chowdhery et al. 2022/2023,
    "PaLM: Scaling Language Modeling with Pathways", Appendix B; ``H Q`` = model width; no
    recompute, GQA ignored), with N = all parameters. Three sources divide by it:

    - torchtitan ``get_num_flop_per_token`` (pytorch/torchtitan ``torchtitan/utils.py``, 2024:
      ``6 * num_params + 12 * l * h * q * t``); with all parameters it reproduces the published
      MFU of ``docs/performance.md`` @6a6f755d2 (Llama 3 8B: 2904 WPS on A100 -> 56.8% of
      312 TF).
    - llm-foundry's benchmarking README, MFU = ``(6 N + 12 L d s) * tokens / (gpus * peak)``
      (mosaicml/llm-foundry ``scripts/train/benchmarking/README.md``; HFU adds the recomputed
      forward, ``(8 N + 16 L d s)``, when activation checkpointing is on). The peak comes
      from composer's ``GPU_AVAILABLE_FLOPS`` table, which was not re-read, so MPT MFU is not
      converted.
    - the Llama 3 paper's Table 4 ("BF16 Model FLOPs Utilization (MFU; Chowdhery et al.
      (2023)) of 38-43%", arXiv:2407.21783 v3 p. 10); counting only non-embedding parameters
      (as some PaLM readings do) would change Llama 3 405B's figure by 1%.
    """
    return 6.0 * num_params + 12.0 * layers * hidden * seq_len


# The sources' names for it (``SourceConvention.tflops_formula`` / ``mfu_formula``).
torchtitan_flops_per_token = mpt_flops_per_token = palm_flops_per_token


def stas00_flops_per_iteration(batch: int, seq_len: int, layers: int, hidden: int,
                               ffn_hidden: int, kv_width: int, vocab: int) -> float:
    """Model FLOPs of one step as stas00's H200/B200 benchmark counts them (causal attention,
    no recompute): ``6 N_dense tokens + 6 b s^2 (heads x head_dim) L``, with N_dense the
    linear layers' weights (3 h ffn for the gated MLP, h (2 h + 2 kv) for Q, K, V and the
    output projection, per layer) plus the LM head's V h. ``hidden`` stands for the query
    width heads x head_dim, as it is in Llama-3.1-8B, the only model these rows train.

    stas00/ml-engineering ``insights/when-to-upgrade-gpus/bench_decompose.py`` @744d01e1,
    ``flops_split`` (its TFLOP/s and MFU divide these by the measured wall-clock step)."""
    dense = layers * (3 * hidden * ffn_hidden + hidden * (2 * hidden + 2 * kv_width)) \
        + vocab * hidden
    return 6.0 * dense * batch * seq_len + 6.0 * batch * seq_len ** 2 * hidden * layers


# ---- per-source facts -------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceConvention:
    """What the loader needs to know about one source (see ``sources.md``)."""

    trainer: str
    """Trainer profile of the software that produced the run
    (``hardware_profiles/trainers/<name>.yaml``: what it runs and how)."""
    flash_attention: bool
    """The run used fused/Flash attention (no s^2 score tensor stored)."""
    tflops_formula: str | None
    """FLOP formula behind a published TFLOP/s figure: 'narayanan', 'dtfm', 'torchtitan',
    'palm', 'stas00'."""
    mfu_formula: str | None
    """FLOP formula behind a published MFU: 'korthikanti', 'torchtitan', 'mpt', 'palm'."""
    mfu_peak_tflops: float | None
    """Peak (TFLOP/s) the authors divided by for MFU; None when not re-read."""
    note: str
    grad_reduce_fp32: bool | None = None
    """The source's harness sets gradient reduction (and the buffer) away from its trainer's
    default; None: the trainer profile's."""
    tp_dgrad_overlap: bool | None = None
    """The source's code overlaps the backward's TP collectives with the weight-gradient GEMMs
    (``TrainingSpec.tp_dgrad_overlap``) where its trainer profile says otherwise; None: the
    profile's."""
    sync_free_moe: bool = False
    """The runs' MoE layers never synchronise with the host (Megatron-Core's sync-free MoE
    under full-iteration CUDA graphs), so no ``TrainingSpec.moe_host_sync_s``."""


# NVIDIA's performance harnesses reduce gradients in bf16 (bf16 grad buffer): Megatron-Bridge
# src/megatron/bridge/perf_recipes/_common.py ("cfg.ddp.grad_reduce_in_fp32 = False"), and
# NeMo scripts/performance/helpers.py set_precision_configs since the 25.07 scripts
# (ab020f6a72, 2025-06); the NeMo 24.09/24.11 dgxc hold-out runs predate it, so they keep
# the trainer's default.
NVIDIA_PERF_GRAD_REDUCE_FP32 = False

SOURCES: dict[str, SourceConvention] = {
    "megatron2021_narayanan": SourceConvention(
        "megatron-lm-2021", False, "narayanan", None, 312.0,
        "Megatron-LM 2021 (PTD-P); eq. 3 counts the recomputed forward; predates FlashAttention"),
    "korthikanti2022": SourceConvention(
        "megatron-lm-2021", False, None, "korthikanti", 312.0,
        "Megatron-LM 2022 (pre megatron-core: same DDP/optimizer code as 2021, plus sequence "
        "parallelism and selective recompute, which are plan fields); no FlashAttention",
        # Sec. 6.2: full recompute costs 39%, not 33%, "due to an optimization in the backward
        # pass where we overlap all-reduce communication with the linear weight's gradient
        # computation" (Megatron-LM's async TP all-reduce, cf7efd4f5a 2021-08, after the 2021
        # paper's runs; the sequence-parallel reduce-scatter the same way from 2022-03).
        tp_dgrad_overlap=True),
    "torchtitan": SourceConvention(
        "torchtitan", True, "torchtitan", "torchtitan", None,
        "FSDP2 + TP/PP/CP; SDPA flash kernels; MFU peak 312 (A100) / 989 (H100 SXM)"),
    "mosaicml_llmfoundry_mpt": SourceConvention(
        "llm-foundry", True, None, "mpt", None,
        "Composer + PyTorch FSDP; FlashAttention (README); MFU peak from composer, not re-read"),
    "bloom176b_bigscience": SourceConvention(
        "megatron-deepspeed-2022", False, "narayanan", None, 312.0,
        "Megatron-DeepSpeed pipeline engine, BF16Optimizer with ZeRO-1; fused softmax, no "
        "FlashAttention (2022); TFLOPs logged with the 4x2 (recompute) coefficient"),
    "dtfm_yuan2022": SourceConvention(
        "megatron-lm-2021", False, "dtfm", None, None,
        "Megatron-LM baselines run by the DT-FM authors on V100 (2022); no FlashAttention"),
    # ---- hold-out sources (paraplan/validate/data/holdout/SOURCES.md): never used to choose
    # a constant; they check that the model generalises.
    "dgxc_nemo_h100": SourceConvention(
        "megatron-core", True, None, None, None,
        "NVIDIA dgxc-benchmarking NeMo recipes on DGX H100 (Megatron-Core 2024-25: overlapped "
        "DP/TP communication, FlashAttention/cuDNN attention, TE fused kernels)"),
    "megatron_bridge_moe": SourceConvention(
        "megatron-core", True, None, None, None,
        "NVIDIA Megatron-Bridge performance summary (26.04.01 container) and dgxc-benchmarking "
        "DeepSeek-V3: MoE pre-training with routing forced to balance "
        "(moe_router_force_load_balancing), dropless, grouped GEMM, fused permute",
        grad_reduce_fp32=NVIDIA_PERF_GRAD_REDUCE_FP32),
    "megatron_bridge_moe_2608": SourceConvention(
        "megatron-core", True, None, None, None,
        "NVIDIA Megatron-Bridge performance summary (26.08 container, v0.6.0 perf recipes): "
        "MoE pre-training on DGX-GB200 in MXFP8 with HybridEP, the EP all-to-all overlap and "
        "full-iteration CUDA graphs (sync-free MoE); the 26.04.01 rows' configurations re-run",
        grad_reduce_fp32=NVIDIA_PERF_GRAD_REDUCE_FP32, sync_free_moe=True),
    "megatron_bridge_ep_overlap": SourceConvention(
        "megatron-core", True, None, None, None,
        "NVIDIA Megatron-Bridge's expert-parallel overlap benchmarks (skills/"
        "nemo-mbridge-perf-expert-parallel-overlap): Qwen3-30B-A3B on 16 H100 with the "
        "all-to-all overlap off and on, HybridEP and alltoall dispatchers",
        grad_reduce_fp32=NVIDIA_PERF_GRAD_REDUCE_FP32),
    "megatron_bridge_dense": SourceConvention(
        "megatron-core", True, None, None, None,
        "NVIDIA Megatron-Bridge performance summary (26.04.01 container, v0.4.2 perf configs): "
        "Llama 3 70B and 3.1 405B pre-training on DGX-GB200 and DGX-H100 in FP8 / MXFP8, no "
        "recompute, TP communication overlap",
        grad_reduce_fp32=NVIDIA_PERF_GRAD_REDUCE_FP32),
    "megascale2024_megatron_baseline": SourceConvention(
        "megatron-core", True, None, None, None,
        "MegaScale Table 2 Megatron-LM baseline (2023 Megatron-LM with FlashAttention and "
        "overlapped gradient reduction, per the paper's baseline description)"),
    "mtnlg530b": SourceConvention(
        "megatron-deepspeed-2022", False, "narayanan", None, 312.0,
        "Megatron-DeepSpeed MT-NLG 530B (2021): pipeline engine reduces after the flush"),
    "megatron_readme_gpt3_175b": SourceConvention(
        "megatron-lm-2021", False, None, None, None,
        "Megatron-LM README GPT-3 175B example on Selene (pre megatron-core)"),
    "llama3_paper": SourceConvention(
        "generic", True, "palm", "palm", 989.0,
        "Llama 3 paper Table 4: TFLOP/s per GPU and BF16 MFU after PaLM (the paper cites "
        "Chowdhery et al. for MFU); MFU over H100's rated 989 TFLOP/s, which gives its 43% "
        "and 38% (its 41% fits no single peak: 400/989 = 40.4%); the rows use TFLOP/s"),
    "stas00_h200_b200": SourceConvention(
        "generic", True, "stas00", None, None,
        "stas00's H200 vs B200 benchmark: HF transformers Llama-3.1-8B under DeepSpeed ZeRO-2 "
        "(overlap_comm), eager PyTorch modules, FlashAttention-3 / -4, one node"),
    "opt175b_meta": SourceConvention(
        "generic", False, None, None, None,
        "OPT-175B 'up to 147 TFLOP/s' with an unpublished formula and batch"),
}

# ---- metric conversion ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunShape:
    """The numbers of one row that a source's formula needs (values as the row states them)."""

    global_batch: int | None
    seq_len: int | None
    num_gpus: int
    layers: int
    hidden: int
    vocab: int
    num_params: float | None = None
    ffn_hidden: int | None = None
    kv_width: int | None = None
    """K (or V) projection width, kv heads x head dim (``stas00``'s formula)."""


def iteration_flops(source_id: str, metric: str, shape: RunShape) -> tuple[float | None, str]:
    """FLOPs the source credits to one optimizer step for ``metric`` ('tflops_per_gpu'/'mfu').

    Returns (flops, formula name) or (None, reason).
    """
    conv = SOURCES.get(source_id)
    if conv is None:
        return None, f"no FLOP convention is recorded for source {source_id!r}"
    formula = conv.tflops_formula if metric == "tflops_per_gpu" else conv.mfu_formula
    if formula is None:
        return None, f"{source_id} publishes no {metric} formula that was read (sources.md)"
    b, s = shape.global_batch, shape.seq_len
    if b is None or s is None:
        return None, f"global batch and seq_len are both needed to convert {metric} to step time"
    if formula == "narayanan":
        return narayanan_flops_per_iteration(b, s, shape.layers, shape.hidden, shape.vocab), formula
    if formula == "korthikanti":
        return (korthikanti_model_flops_per_iteration(b, s, shape.layers, shape.hidden,
                                                      shape.vocab), formula)
    if formula == "dtfm":
        return dtfm_flops_per_iteration(b, s, shape.layers, shape.hidden), formula
    if formula == "stas00":
        if shape.ffn_hidden is None or shape.kv_width is None:
            return None, "stas00 formula needs the MLP and K/V widths"
        return (stas00_flops_per_iteration(b, s, shape.layers, shape.hidden, shape.ffn_hidden,
                                           shape.kv_width, shape.vocab), formula)
    if shape.num_params is None:
        return None, f"{formula} formula needs the parameter count"
    # torchtitan, mpt and palm: the same PaLM count.
    per_token = palm_flops_per_token(shape.num_params, shape.layers, shape.hidden, s)
    return per_token * b * s, formula


def _peak(source_id: str) -> float | None:
    conv = SOURCES.get(source_id)
    return conv.mfu_peak_tflops if conv else None


def step_time_from_metric(source_id: str, metric: str, value: float,
                          shape: RunShape) -> tuple[float | None, str | None]:
    """Seconds per optimizer step implied by a published figure, with the source's own formula.

    ``mfu`` is in percent (54.2 means 54.2%). Returns (step_time_s, None) or (None, reason).
    """
    if not value > 0:
        return None, f"measured {metric}={value} is not positive"
    if metric == "step_time_s":
        return value, None
    if metric == "tokens_per_s_per_gpu":
        if shape.global_batch is None or shape.seq_len is None:
            return None, "tokens/s per GPU needs global batch and seq_len to give a step time"
        return shape.global_batch * shape.seq_len / (value * shape.num_gpus), None
    if metric in ("tflops_per_gpu", "mfu"):
        flops, why = iteration_flops(source_id, metric, shape)
        if flops is None:
            return None, why
        if metric == "tflops_per_gpu":
            return flops / (value * 1e12 * shape.num_gpus), None
        peak = _peak(source_id)
        if peak is None:
            return None, f"the peak {source_id} divided by for MFU was not re-read (sources.md)"
        return flops / (value / 100.0 * peak * 1e12 * shape.num_gpus), None
    return None, f"unknown measured_metric {metric!r}"


def metric_from_step_time(source_id: str, metric: str, step_time_s: float,
                          shape: RunShape) -> float | None:
    """Inverse of :func:`step_time_from_metric`: a step time in the row's published units."""
    if not step_time_s > 0:
        return None
    if metric == "step_time_s":
        return step_time_s
    if metric == "tokens_per_s_per_gpu":
        if shape.global_batch is None or shape.seq_len is None:
            return None
        return shape.global_batch * shape.seq_len / (step_time_s * shape.num_gpus)
    if metric in ("tflops_per_gpu", "mfu"):
        flops, _ = iteration_flops(source_id, metric, shape)
        if flops is None:
            return None
        if metric == "tflops_per_gpu":
            return flops / (step_time_s * shape.num_gpus) / 1e12
        peak = _peak(source_id)
        if peak is None:
            return None
        return 100.0 * flops / (step_time_s * shape.num_gpus * peak * 1e12)
    return None


# ---- CSV vocabulary -> spec values --------------------------------------------------------------


def precision_from_text(text: str) -> str | None:
    """'fp16 mixed' / 'amp_bf16' / 'float8 tensorwise' / 'amp_fp8' -> fp16 / bf16 / fp8."""
    low = text.strip().lower()
    if "fp8" in low or "float8" in low:
        return "fp8"
    if "bf16" in low or "bfloat16" in low:
        return "bf16"
    if "fp16" in low or "float16" in low:
        return "fp16"
    if "fp32" in low or "float32" in low:
        return "fp32"
    return None


def zero_stage_from_text(text: str) -> int | None:
    """ZeRO stage of a sharding description; None if the text is not understood.

    FSDP FULL_SHARD and FSDP2 shard weights, gradients and optimizer state (ZeRO-3);
    SHARD_GRAD_OP keeps weights whole between forward and backward (ZeRO-2).
    """
    low = text.strip().lower().replace("_", "").replace("-", "")
    if not low or low in ("0", "none", "no"):
        return 0
    if "shardgradop" in low or "zero2" in low:
        return 2
    if "fullshard" in low or "zero3" in low or "fsdp" in low:
        return 3
    if "zero1" in low:
        return 1
    if low in ("1", "2", "3"):
        return int(low)
    return None


def recompute_from_text(text: str) -> str | None:
    """'full' / True / 'activation checkpointing' -> full; 'selective' -> selective.

    None when the text is empty or not understood.
    """
    low = text.strip().lower()
    if not low:
        return None
    if "selective" in low or low in ("sel", "op", "layer"):
        return "selective"
    if low in ("full", "true", "yes", "1") or "checkpoint" in low or "uniform" in low:
        return "full"
    if low in ("none", "false", "no", "0"):
        return "none"
    return None
