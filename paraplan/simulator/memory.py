"""Per-rank memory: weights, gradients, optimizer states, activations, buffers, reserve.

Sources:
* Mixed-precision Adam: 2 (bf16 weights) + 2 (grads) + 12 (fp32 master, momentum, variance)
  bytes per parameter; ZeRO-1 shards the 12 over DP, ZeRO-2 also the grads, ZeRO-3 the
  weights too (Rajbhandari et al. 2020, "ZeRO", sec 5 and Figure 1).
* Activations per layer: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models"), eq. 1-4 and Table 2: s*b*h*(34 + 5*a*s/h) bytes without parallelism,
  generalised here term by term to GQA, gated MLPs and configurable dropout.
* In-flight micro-batches per pipeline schedule: Narayanan et al. 2021 sec 2.2; Korthikanti
  et al. 2022 sec 4.2.3 (interleaved: p*(1 + (p-1)/(p*v)) on the first stage).
All results are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from paraplan.simulator import moe as routing
from paraplan.simulator.compute import kv_widths
from paraplan.simulator.selective_ac import op_sac_matmuls
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

GiB = 2.0**30

# Memory the framework holds besides tensors: CUDA context + cuBLAS/NCCL workspaces. PyTorch
# reports ~0.5-1 GiB of context per process on Hopper/Ampere before any tensor is allocated,
# and NCCL allocates a few hundred MiB of buffers per communicator set.
CUDA_CONTEXT_BYTES = 1.0 * GiB
NCCL_BUFFER_BYTES = 0.5 * GiB
# The caching allocator reserves more than it hands out (fragmentation); PyTorch's memory
# docs and torchtitan's reserved-vs-active logs put this at roughly 5-10% of the peak.
ALLOCATOR_FRAGMENTATION = 0.07
# Gradient-reduction bucket of PyTorch DDP / Megatron's DDP (40M elements): the smallest bucket
# (``dp_bucket_elements``) and the bucket buffer counted in memory.
DDP_BUCKET_ELEMENTS = 40e6
# Megatron-Core grows the bucket with the data-parallel size, "larger DP sizes need larger
# buckets to ensure collectives do not become latency-bound": bucket_size = max(40000000,
# 1000000 * dp_size) parameters (megatron/core/distributed/distributed_data_parallel.py).
BUCKET_ELEMENTS_PER_RANK = 1e6


def dp_bucket_elements(ranks: Any, size: int | None = None) -> Any:
    """Parameters per gradient-reduction bucket over ``ranks`` data-parallel ranks (a number
    or an array): ``size`` where the run sets one (``TrainingSpec.ddp_bucket_size``), else
    Megatron-Core's default, max(40M, 1M x ranks) (distributed_data_parallel.py sizes it by
    the data-parallel group without CP, for the expert buffers too)."""
    if size is not None:
        return np.full(np.shape(ranks), float(size)) if np.ndim(ranks) else float(size)
    return np.maximum(DDP_BUCKET_ELEMENTS, BUCKET_ELEMENTS_PER_RANK * ranks)


@dataclass(frozen=True)
class StageMemory:
    """Bytes held by one rank of a pipeline stage at its peak."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float

    @property
    def peak(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.other


def layer_activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    plan: ParallelPlan,
    micro_batch: int,
    *,
    moe: bool,
    recompute: str | None = None,
) -> float:
    """Activation bytes one layer keeps for the backward pass, per rank, one micro-batch,
    under ``recompute`` (default: the plan's).

    Korthikanti et al. 2022 eq. 1: attention 11sbh + 5as^2b, MLP 19sbh, norms 4sbh (MHA, 4h
    GELU MLP, dropout). Term by term (16-bit tensors = 2 bytes/element, masks 1 byte):
    norm inputs 2+2, QKV input 2, Q 2, K and V 2*kv/a each, output-projection input 2,
    MLP input 2, activation input 2*ffn/h (x2 when gated), second-matmul input 2*ffn/h,
    dropout masks 1+1 (only with dropout), scores 5*a*s/h (2 softmax + 1 mask + 2 dropout
    output; 2 without dropout; 0 with flash attention or selective recompute).
    TP shards all but the norm/QKV/MLP inputs and masks by t; sequence parallelism shards
    everything by t (Korthikanti eq. 2-4). CP divides s; MoE layers hold the MLP terms for
    top-k routed copies of each token.
    """
    s = training.seq_len / plan.cp
    b = micro_batch
    h = model.hidden_size
    t = plan.tp
    a = model.num_attention_heads
    att = model.attention
    drop = 1.0 if training.dropout else 0.0
    recompute = recompute or plan.recompute
    if recompute == "layer":
        # Every other layer keeps only its input, the others everything: the mean of the two
        # per layer (exact over an even count of layers).
        return 0.5 * sum(layer_activation_bytes(model, training, plan, micro_batch, moe=moe,
                                                recompute=kind) for kind in ("full", "none"))
    if recompute == "full":
        # Only the layer input is kept (2sbh), sharded by t under sequence parallelism.
        return 2.0 * s * b * h / (t if plan.sequence_parallel else 1)
    if recompute == "op":
        return s * b * op_checkpoint_elements(model, training, plan, moe=moe) * 2.0

    # Per token, in units of h elements (bytes = 2 per element, 1 per mask element).
    replicated = 4.0 + 2.0 + 2.0 + 2.0 * drop  # norm inputs, QKV input, MLP input, masks
    # Q, K, V, output-projection input (2 + 4g/a + 2 for GQA with a*d = h); K and V as the
    # attention call gets them (repeated to the query heads: ``compute.kv_widths``).
    attn_split = 2.0 * (att.q_width + sum(kv_widths(model, training)) + att.o_width) / h
    # MLA: the down projection runs whole on every TP rank (also under SP); its latents are
    # kept before and after their norms (the up projections' inputs).
    latent = 4.0 * att.latent_width / h
    gate = 2.0 if model.mlp_matrices == 3 else 1.0
    # fp8 training (Transformer Engine): every Linear keeps its fp8 (1-byte) input for the
    # weight-gradient GEMM instead of the 16-bit one (TE ``_Linear.forward`` saves the
    # quantized ``inputmat``; Megatron Core MoE report, arXiv 2603.07685, sec. 5: "FP8 stores
    # linear-layer inputs only, halving them"); the attention output is kept twice, 16-bit
    # for the attention backward and fp8 for the output projection.
    lin = 1.0 if training.precision == "fp8" else 2.0
    # QKV and MLP inputs; an MoE layer's MLP input feeds the router, a plain 16-bit linear.
    replicated += (lin - 2.0) + (0.0 if moe else lin - 2.0)
    attn_split += (1.0 if lin == 1.0 else 0.0) * att.o_width / h
    ffn_in = lin  # the second matmul's input, per ffn element
    if moe:
        # Each token's top-k routed copies (expert input, activation input, second matmul
        # input) on the rank's T = s/tp dispatched tokens, gathered over expert TP
        # (``simulator.moe``): per layer token, k * (etp * in + ffn terms) / tp. Shared
        # experts are a TP-split dense MLP. The router keeps its fp32 logits and
        # probabilities (2 x 4 B x E per dispatched token). The busiest rank holds
        # ``moe.load_factor`` times the mean routed rows.
        shared = model.num_shared_experts
        ffn_ratio = model.expert_ffn / h
        ffn_terms = 2.0 * ffn_ratio * gate + ffn_in * ffn_ratio
        # Routed rows: inputs h wide, the rest ffn / etp wide (``moe.routed_copies_per_token``).
        routed = (routing.routed_copies_per_token(model, plan)
                  * (lin + ffn_terms / plan.expert_tp) * routing.load_factor(training, plan))
        mlp_split = (routed * t + shared * ffn_terms
                     + 8.0 * model.num_experts / h * t / routing.sp_split(plan))
        mlp_t = t
    else:
        ffn_ratio = model.ffn_hidden_size / h
        mlp_split = 2.0 * ffn_ratio * gate + ffn_in * ffn_ratio
        mlp_t = t
    score = 0.0
    if not training.flash_attention and recompute != "selective":
        score = (5.0 if training.dropout else 2.0) * a * s / h
    if plan.sequence_parallel:
        per_token_h = (replicated + attn_split + score) / t + mlp_split / mlp_t
    else:
        per_token_h = replicated + (attn_split + score) / t + mlp_split / mlp_t
    return s * b * h * (per_token_h + latent)


def op_checkpoint_elements(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, *,
                           moe: bool) -> float:
    """16-bit elements per token one layer keeps under op-level selective checkpointing.

    torchtitan's ``selective_ac_option = "op"`` policy (torchtitan/models/llama3/infra/
    parallelize.py, _save_list): the layer input, the fused attention output, and every other
    matmul output are saved (the odd-numbered ones in forward order where that order is known:
    ``selective_ac.op_sac_matmuls``; else half of them); norms, activations and rotary are
    recomputed.
    """
    t = plan.tp
    sp = t if plan.sequence_parallel else 1
    att = model.attention
    q_out = att.o_width / t
    calls = op_sac_matmuls(model, plan, moe=moe)
    if calls is not None:
        # The odd-numbered matmuls' outputs as the matmul writes them (a row-parallel one's
        # is the full-width partial sum), and under sequence parallelism the two
        # reduce-scatter outputs (after wo and after the MLP), also on the save list.
        saved = sum(n for n, _, keep, _ in calls if keep)
        scattered = 2.0 * model.hidden_size / sp if sp > 1 else 0.0
        return model.hidden_size / sp + q_out + saved + scattered
    qkv_outs = (att.q_width + att.k_width + att.v_width) / t + att.latent_width
    gated = 2 if model.mlp_matrices == 3 else 1
    if moe:
        # Routed rows (``moe.routed_copies_per_token``): outputs ffn / etp and h wide.
        routed = (routing.routed_copies_per_token(model, plan)
                  * (gated * model.expert_ffn / plan.expert_tp + model.hidden_size)
                  * routing.load_factor(training, plan))
        mlp_outs = routed + model.num_shared_experts * (gated * model.expert_ffn / t
                                                        + model.hidden_size / sp)
    else:
        mlp_outs = gated * model.ffn_hidden_size / t + model.hidden_size / sp
    matmul_outs = qkv_outs + model.hidden_size / sp + mlp_outs
    return model.hidden_size / sp + q_out + 0.5 * matmul_outs


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, t: int = 1, *, sp: bool = False,
                            selective: bool = False) -> float:
    """The paper's closed forms (eq. 1-4) for MHA, 4h GELU, dropout; used as a test oracle."""
    score = 0.0 if selective else 5.0 * a * s / h
    if t == 1:
        return s * b * h * (34 + score)
    if sp:
        return s * b * h * (34 + score) / t
    return s * b * h * (10 + 24 / t + score / t)


def moe_layers_in(model: ModelSpec, start: int, count: int) -> int:
    """MoE layers among global layers [start, start + count) (``ModelSpec.is_moe_layer``)."""
    return model.moe_layers_before(start + count) - model.moe_layers_before(start)


def params_per_stage(model: ModelSpec, plan: ParallelPlan, layers: list[int], stage: int,
                     moe_layers: list[int] | None = None) -> tuple[float, float]:
    """(dense params, expert params) held by one rank of ``stage`` (counts, not bytes).

    Dense weights are split by TP; expert weights by EP x expert-TP. The first stage holds the
    word embedding (and learned positions), the last the LM head and final norm; with tied
    embeddings or MTP modules and pp > 1 the last stage keeps its own copy of the word
    embedding (``ModelSpec.embedding_on_last_stage``; Megatron's shared-embedding all-reduce).
    Layer index ranges follow ``layers`` (layers per stage) unless ``moe_layers`` gives each
    stage's MoE layer count (interleaved ranks hold chunks that are not contiguous).
    """
    n = layers[stage]
    if moe_layers is not None:
        moe_here = moe_layers[stage]
    else:
        moe_here = moe_layers_in(model, sum(layers[:stage]), n)
    dense_here = n - moe_here
    dense = dense_here * model.dense_layer_params
    experts = 0.0
    if moe_here:
        dense += moe_here * model.moe_layer_shared_params
        experts = moe_here * model.num_experts * model.expert_params
    if stage == 0:
        dense += model.embedding_params
    if stage == len(layers) - 1:
        head = model.lm_head_params
        if model.embedding_on_last_stage and len(layers) > 1:  # the tied head, or MTP's input
            head += model.vocab_size * model.hidden_size
        dense += head + model.mtp_dense_params
        experts += model.mtp_expert_params
    return dense / plan.tp, experts / (plan.ep * plan.expert_tp)


@dataclass(frozen=True)
class LayerActivations:
    """Per-layer activation bytes of one micro-batch: dense layer, MoE layer, and the full
    activations one layer re-materialises while it is recomputed (0 unless the recompute kind
    is one of ``WORKING_SET_RECOMPUTES``: full, op and layer)."""

    dense: float
    moe: float
    working: float


WORKING_SET_RECOMPUTES = ("full", "op", "layer")
"""Recompute kinds whose backward re-materializes a whole layer at a time: its activations
without recompute (of an MoE layer where the model has them) are the working set
``LayerActivations.working``."""


def layer_activations(model: ModelSpec, training: TrainingSpec,
                      plan: ParallelPlan) -> LayerActivations:
    """Activation bytes per layer for ``plan`` (see layer_activation_bytes)."""
    mb = plan.micro_batch_size
    dense = layer_activation_bytes(model, training, plan, mb, moe=False)
    moe = layer_activation_bytes(model, training, plan, mb, moe=True) if model.is_moe else dense
    working = 0.0
    if plan.recompute in WORKING_SET_RECOMPUTES:
        working = layer_activation_bytes(model, training, plan, mb, moe=model.is_moe,
                                         recompute="none")
    return LayerActivations(dense, moe, working)


def loss_bytes_per_logit(training: TrainingSpec) -> float:
    """Bytes the cross entropy of one micro-batch holds per logit: fused vocab-parallel kernels
    keep bf16 logits and an fp32 softmax (6 B, Megatron's VocabParallelCrossEntropy); an eager
    loss also holds the fp32 upcast and the gradient (2 + 4 + 4 + 4 = 14 B); flash-attn's
    one-kernel loss keeps the bf16 logits and writes a bf16 gradient (2 + 2 = 4 B)."""
    kind = training.loss_kernels or training.kernels
    return 14.0 if kind == "eager" else 4.0 if kind == "one_kernel" else 6.0


@dataclass(frozen=True)
class _StaticStage:
    weights: float
    grads: float
    optimizer: float
    activations: float
    """Activation bytes that do not scale with in-flight micro-batches."""
    other: float
    """Framework memory before fragmentation."""


def _static_stage(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, dp: int,
                  layers: list[int], stage: int, la: LayerActivations,
                  moe_layers: list[int] | None = None) -> _StaticStage:
    dense, experts = params_per_stage(model, plan, layers, stage, moe_layers)
    edp = max(1, dp * plan.cp * plan.tp // (plan.ep * plan.expert_tp))
    ddp = dp * plan.cp
    wbytes = training.compute_bytes
    obytes = training.optimizer_state_bytes_per_param
    z = plan.zero_stage

    def shard(count: float, group: int, stage_min: int) -> float:
        return count / group if z >= stage_min else count

    weights = (shard(dense, ddp, 3) + shard(experts, edp, 3)) * wbytes
    if z == 3 and training.fsdp_copies is not None:
        # PyTorch FSDP's shard is the fp32 parameter itself (the optimizer's master weights);
        # the 16-bit copies exist only while gathered (``other``): no 16-bit shard to keep.
        weights = 0.0
    grads = (shard(dense, ddp, 2) + shard(experts, edp, 2)) * (
        training.sharded_grad_bytes if z >= 2 else training.grad_buffer_bytes)
    optimizer = (shard(dense, ddp, 1) + shard(experts, edp, 1)) * obytes
    mb = plan.micro_batch_size
    s_local = training.seq_len / plan.cp
    # Recomputing one layer re-materialises its full activations during its backward.
    act = la.working if layers[stage] else 0.0
    if stage == len(layers) - 1:  # the logits of the LM head and of every MTP module
        act += (loss_bytes_per_logit(training) * s_local * mb * model.vocab_size / plan.tp
                * (1 + model.num_mtp_layers))
    if stage == 0:
        act += 2.0 * s_local * mb * model.hidden_size  # embedding output
    other = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES
    if z == 3:
        # Two layers' full weights gathered at once (current + prefetch), FSDP-style.
        layer_params = max(model.dense_layer_params,
                           model.moe_layer_params / max(1, plan.ep) if model.is_moe else 0)
        other += 2.0 * layer_params / plan.tp * wbytes
    if dp > 1 and z < 3:
        # Gradient-reduction buckets (Megatron/DDP default ~ 40M elements, fp32).
        other += min(dense + experts, DDP_BUCKET_ELEMENTS) * 4.0
    return _StaticStage(weights, grads, optimizer, act, other)


def pipeline_memory(
    model: ModelSpec,
    training: TrainingSpec,
    plan: ParallelPlan,
    *,
    dp: int,
    layers: list[int],
    inflight: list[float],
    per_layer: LayerActivations | None = None,
    only: int | None = None,
    moe_layers: list[int] | None = None,
) -> list[StageMemory]:
    """Peak bytes of one rank of every pipeline stage (or only stage ``only``).

    ``inflight[r]`` is the number of micro-batches whose activations stage r holds at its peak
    (schedule dependent; see pipeline.inflight_microbatches). Expert weights are sharded over
    the expert-data-parallel group (dp*cp*tp / (ep*etp)) under ZeRO.

    Stages with the same shape (layer count, MoE layers, first/last) share their static part;
    activations scale with each stage's in-flight micro-batches. ``moe_layers`` gives each
    stage's MoE layer count when its layers are not contiguous (interleaved chunks); by
    default stage r holds layers sum(layers[:r]) onwards.
    """
    la = per_layer or layer_activations(model, training, plan)
    cache: dict[tuple, _StaticStage] = {}
    out: list[StageMemory] = []
    last = len(layers) - 1
    start = 0
    for stage, n in enumerate(layers):
        if only is not None and stage != only:
            start += n
            continue
        if not model.is_moe:
            n_moe = 0
        elif moe_layers is not None:
            n_moe = moe_layers[stage]
        else:
            n_moe = moe_layers_in(model, start, n)
        key = (n, n_moe, stage == 0, stage == last)
        st = cache.get(key)
        if st is None:
            st = cache[key] = _static_stage(model, training, plan, dp, layers, stage, la,
                                            moe_layers)
        mtp = model.num_mtp_layers if stage == last else 0  # MTP blocks: MoE layers here
        act = ((n - n_moe) * la.dense + (n_moe + mtp) * la.moe) * inflight[stage] \
            + st.activations
        tensors = st.weights + st.grads + st.optimizer + act
        out.append(StageMemory(st.weights, st.grads, st.optimizer, act,
                               st.other + ALLOCATOR_FRAGMENTATION * tensors))
        start += n
    return out
