"""Relaxed synchronization and compression as plan knobs: bytes on the wire, not convergence.

Every function returns the fraction of the dense bytes a knob sends (<= 1); the simulator
multiplies the data-parallel gradient bytes and the pipeline activation bytes by them. None
of this models what compression or infrequent synchronization does to the loss curve:
reports say so.

Data-parallel gradients (``plan.grad_compression``), per DP synchronization, relative to the
dense gradient of ``g`` bytes per element (``TrainingSpec.grad_reduce_bytes``):
- ``powersgd`` rank r (Vogels et al. 2019, NeurIPS, "PowerSGD"): each weight matrix shard of
  shape m x n sends P (m x r) and Q (n x r) instead of m*n values; vectors (norms, biases) go
  uncompressed. Ratio = (sum r(m+n) + vectors) / all parameters of the rank, with the TP shard
  shapes (column-parallel matrices split their output, row-parallel their input, by tp;
  experts by etp).
- ``quantize`` to q bits (e.g. QSGD / 1-bit-Adam style): q / (8 g).
- ``topk`` keeping a fraction k (Stich et al. 2018): k * (g + 4) / g: every kept value
  travels with a 4-byte index.
- ``cocktail`` (CocktailSGD, Wang et al. 2023, ICML): top-k fraction k of the values, each
  quantized to q bits, with its 4-byte index: k * (q/8 + 4) / g (the plain composition of
  the two; CocktailSGD's random-subset index coding sends less, so this is an upper bound).
- DiLoCo / local SGD (Douillard et al. 2023): replicas synchronize every
  ``dp_sync_interval`` = H steps (the simulator divides the synchronization time by H); the
  outer pseudo-gradient may be sent at ``pseudo_grad_bits`` bits: q / (8 g).

Pipeline activations (``plan.activation_compression_bits``, AQ-SGD, Wang et al. 2022,
NeurIPS): activations forward and their gradients backward cross each stage boundary at q
bits instead of the compute dtype: q / (8 * compute_bytes).
"""

from __future__ import annotations

from typing import Any

from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

INDEX_BYTES = 4.0
NOT_MODELLED = ("compression and local SGD change convergence (extra steps to reach the same "
                "loss); that is not modelled: only the bytes on the wire are")


def _powersgd(model: ModelSpec, tp: int, etp: int, rank: int) -> float:
    """PowerSGD wire fraction for one rank's parameters (TP shards of every matrix)."""
    h = model.hidden_size
    gate = 2 if model.mlp_matrices == 3 else 1

    def mat(m: float, n: float) -> tuple[float, float]:
        """(dense elements, sent elements) of one m x n matrix."""
        return m * n, min(m * n, rank * (m + n))

    def mlp(ffn: int, t: int) -> list[tuple[float, float]]:
        # column-parallel up (and gate) projections, row-parallel down projection
        return [mat(h, gate * ffn / t), mat(ffn / t, h)]

    attn = [mat(*p.per_rank(tp)) for p in model.attention.projections]
    dense_layer = attn + mlp(model.ffn_hidden_size, tp)
    mats: list[tuple[float, float]] = []
    mats += dense_layer * model.num_dense_layers
    if model.is_moe:
        moe_layer = attn + [mat(h, model.num_experts)]
        moe_layer += mlp(model.expert_ffn, etp) * model.num_experts
        moe_layer += mlp(model.expert_ffn, tp) * model.num_shared_experts
        mats += moe_layer * model.num_moe_layers
    mats.append(mat(model.vocab_size / tp, h))  # word embedding (vocab-parallel)
    if not model.tie_word_embeddings:
        mats.append(mat(h, model.vocab_size / tp))  # LM head
    dense = sum(x for x, _ in mats)
    sent = sum(y for _, y in mats)
    vectors = max(0.0, model.num_params / tp - dense)  # norms, biases, positions (rough)
    return (sent + vectors) / (dense + vectors)


def dp_ratio(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> float:
    """Fraction of the dense gradient bytes one DP synchronization sends (<= 1), from
    ``grad_compression`` and, with ``dp_sync_interval > 1``, ``pseudo_grad_bits``. The
    generic ``grad_compression_ratio`` divides on top."""
    g = float(training.grad_reduce_bytes)
    method = plan.grad_compression
    if method == "powersgd":
        ratio = _powersgd(model, plan.tp, plan.expert_tp, int(plan.compression_rank or 0))
    elif method == "quantize":
        ratio = plan.compression_bits / (8.0 * g)  # type: ignore[operator]
    elif method == "topk":
        ratio = plan.compression_topk * (g + INDEX_BYTES) / g  # type: ignore[operator]
    elif method == "cocktail":
        ratio = plan.compression_topk * (  # type: ignore[operator]
            plan.compression_bits / 8.0 + INDEX_BYTES) / g  # type: ignore[operator]
    else:
        ratio = 1.0
    if plan.dp_sync_interval > 1 and plan.pseudo_grad_bits is not None:
        ratio *= plan.pseudo_grad_bits / (8.0 * g)
    return min(1.0, ratio) / plan.grad_compression_ratio


def pp_ratio(training: TrainingSpec, plan: ParallelPlan) -> float:
    """Fraction of the dense activation bytes a pipeline send carries (AQ-SGD), <= 1."""
    bits = plan.activation_compression_bits
    if bits is None:
        return 1.0
    return min(1.0, bits / (8.0 * training.compute_bytes))


def effective_grad_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> float:
    """Bytes per gradient element one DP synchronization sends (dense: grad_reduce_bytes)."""
    return training.grad_reduce_bytes * dp_ratio(model, training, plan)


def savings(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> dict[str, Any]:
    """What the plan's relaxed-synchronization knobs save, for the report."""
    dp = dp_ratio(model, training, plan)
    interval = plan.dp_sync_interval
    return {
        "grad_compression": plan.grad_compression,
        "dp_bytes_fraction_per_sync": dp,
        "dp_sync_interval": interval,
        "dp_bytes_fraction_per_step": dp / interval,
        "dp_traffic_reduction": interval / dp,
        "pp_bytes_fraction": pp_ratio(training, plan),
        "note": NOT_MODELLED,
    }


def uses_knobs(plan: ParallelPlan) -> bool:
    """Whether the plan compresses or synchronizes less than every step."""
    return (plan.grad_compression != "none" or plan.dp_sync_interval > 1
            or plan.activation_compression_bits is not None
            or plan.grad_compression_ratio != 1.0)
