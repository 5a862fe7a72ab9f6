"""One layer's compute time (one micro-batch, one rank), in two parts priced apart: the part
every layer has (projections, attention, the dense MLP or the router and shared experts, norms
and the other memory-bound ops, gradient accumulation) and the routed experts' part of an MoE
layer. The first does not read the plan's expert parallelism (ep, expert TP), the second reads
the plan only through ``moe.expert_shape``, so a search prices each once per the fields it
reads and composes them (``compose_times``, on numbers or on numpy arrays) for every plan
key. Seconds.

Tokens per rank: ``b s / cp``. GEMMs are ``compute.gemm_time`` (roofline with measured
tables), attention ``compute.attention_times``, memory-bound ops
``elementwise.elementwise_bytes_per_token`` at the achievable bandwidth, gradient accumulation
``grads.accumulation_time``; the backward runs each GEMM twice (input and weight gradients).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paraplan.simulator import moe as routing
from paraplan.simulator.compute import (
    KERNEL_OVERHEAD_S,
    KERNELS_PER_LAYER_FWD,
    Device,
    LayerTimes,
    attention_times,
    gemm_time,
)
from paraplan.simulator.elementwise import (
    routed_elementwise_bytes_per_token,
    shared_elementwise_bytes_per_token,
)
from paraplan.simulator.grads import accumulation_time, layer_grad_params
from paraplan.simulator.selective_ac import op_sac_matmuls, rerun_skips_down_projection
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec


@dataclass(frozen=True)
class SharedTerms:
    """The part of a layer's compute that does not read ep or expert TP (seconds; numbers, or
    numpy arrays of one value per plan key in the evaluator)."""

    gemm_fwd_s: Any
    """Projections plus the dense MLP, or the MoE router and shared experts."""
    attention_fwd_s: Any
    attention_bwd_s: Any
    elementwise_fwd_s: Any
    """Memory-bound forward ops, without the per-kernel launch floor."""
    accumulation_s: Any
    """Adding one micro-batch's weight gradients into the buffer (TP-split parameters)."""
    rerun_skip_s: Any
    """Forward seconds a whole-layer recompute leaves out (``rerun_skip_time``)."""
    op_rerun_gemm_s: Any
    """GEMM seconds op-level selective checkpointing re-runs here (``op_rerun_gemm_time``;
    where the order of matmuls is not known, half of ``gemm_fwd_s``; routed experts add
    half of theirs in ``compose_times``)."""


@dataclass(frozen=True)
class RoutedTerms:
    """An MoE layer's routed experts: their forward GEMMs, their memory-bound forward ops
    (activation, permute and unpermute, biases) and their gradient accumulation (seconds)."""

    gemm_fwd_s: Any
    elementwise_fwd_s: Any
    accumulation_s: Any


NO_ROUTED = RoutedTerms(0.0, 0.0, 0.0)


def shared_terms(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, device: Device,
                 *, moe: bool, attention: tuple[float, float, float] | None = None
                 ) -> SharedTerms:
    """``SharedTerms`` of one layer. Reads the plan's tp, cp, sequence parallelism,
    micro-batch size and whether ZeRO >= 2 (the accumulation pass); ``attention``: the plan's
    ``compute.attention_times`` when the caller has it."""
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    if attention is None:
        attention = attention_times(model, training, plan, device)
    proj, attn_fwd, attn_bwd = attention
    shared, _ = layer_grad_params(model, plan, moe=moe)
    gemm = proj + shared_mlp_gemm_time(model, training, plan, device, moe=moe)
    op = op_rerun_gemm_time(model, training, plan, device, moe=moe)
    return SharedTerms(
        gemm_fwd_s=gemm,
        attention_fwd_s=attn_fwd, attention_bwd_s=attn_bwd,
        elementwise_fwd_s=tokens * shared_elementwise_bytes_per_token(
            model, training, plan, moe=moe) / device.memory_Bps,
        accumulation_s=accumulation_time(shared, training, plan, device),
        rerun_skip_s=rerun_skip_time(model, training, plan, device, moe=moe),
        op_rerun_gemm_s=0.5 * gemm if op is None else op)


def op_rerun_gemm_time(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                       device: Device, *, moe: bool) -> float | None:
    """Forward GEMM seconds of one layer (one micro-batch, one rank) that torchtitan's
    op-level selective checkpointing runs again in the backward: every second matmul in
    forward order (``selective_ac.op_sac_matmuls``); None where that order is not known (the
    caller then takes half the layer's GEMM time)."""
    calls = op_sac_matmuls(model, plan, moe=moe)
    if calls is None:
        return None
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    return sum(gemm_time(device, tokens, n, k) for n, k, saved, _ in calls if not saved)


def rerun_skip_time(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                    device: Device, *, moe: bool) -> float:
    """Forward seconds of one layer (one micro-batch, one rank) that a whole-layer recompute
    does not run again when the checkpoint stops early (``training.recompute_early_stop``):
    the dense MLP's down projection (FC2; SwiGLU's w2).

    PyTorch's non-reentrant checkpoint (``use_reentrant=False``), whose early stop is on by
    default since torch 2.1 (pytorch/pytorch PR #96866 "Make early stop the default for
    checkpoint", 2023-03), counts
    the tensors the forward saved and stops the re-run as soon as the last of them is packed
    again (``torch/utils/checkpoint.py`` ``_recomputation_hook``: ``if
    target_frame.early_stop and target_frame.recomp_counter[gid] ==
    len(target_frame.weak_holders): raise _StopRecomputationError``). Autograd packs an op's
    saved inputs before the op runs (the generated ``VariableType`` kernels build the node's
    ``SavedVariable`` s, then redispatch), and the last op of a pre-norm block that saves
    anything is the MLP's down projection (its input and weight): the residual add after it
    saves nothing, so the re-run stops before that GEMM. Nothing is skipped where dropout
    follows it (the mask is saved after the GEMM runs) or in an MoE block (the combine saves
    the expert outputs and the routing weights); nor where the down projection is a custom
    autograd Function, which saves after its GEMM (eager fp8 linears: the trainer fact is off
    there, ``specs.trainer.trainer_training``)."""
    if moe or not rerun_skips_down_projection(training):
        return 0.0
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    return gemm_time(device, tokens, model.hidden_size, model.ffn_hidden_size / plan.tp)


def routed_terms(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                 device: Device) -> RoutedTerms:
    """``RoutedTerms`` of one MoE layer; it reads the plan only through ``moe.expert_shape``."""
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    _, routed = layer_grad_params(model, plan, moe=True)
    return RoutedTerms(
        gemm_fwd_s=expert_gemm_time(model, training, plan, device),
        elementwise_fwd_s=tokens * routed_elementwise_bytes_per_token(model, training, plan)
        / device.memory_Bps,
        accumulation_s=accumulation_time(routed, training, plan, device))


def compose_times(shared: SharedTerms, routed: RoutedTerms) -> LayerTimes:
    """The layer's ``LayerTimes`` from its two parts (numbers or arrays): the backward runs the
    GEMMs and the memory-bound ops twice, plus the accumulation; every layer launches
    ``KERNELS_PER_LAYER_FWD`` kernels forward and twice as many backward."""
    overhead = KERNELS_PER_LAYER_FWD * KERNEL_OVERHEAD_S
    gemms = shared.gemm_fwd_s + routed.gemm_fwd_s
    elem = shared.elementwise_fwd_s + routed.elementwise_fwd_s
    forward = gemms + shared.attention_fwd_s + elem + overhead
    backward = (2.0 * gemms + shared.attention_bwd_s + 2.0 * elem + 2.0 * overhead
                + shared.accumulation_s + routed.accumulation_s)
    op = shared.op_rerun_gemm_s + 0.5 * routed.gemm_fwd_s
    return LayerTimes(forward, backward, gemms, shared.attention_fwd_s, elem + overhead,
                      routed.gemm_fwd_s, shared.rerun_skip_s, op)


def layer_times(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, device: Device,
                *, moe: bool, attention: tuple[float, float, float] | None = None
                ) -> LayerTimes:
    """Forward/backward compute time of one layer, one micro-batch, one rank (seconds):
    ``compose_times`` of its ``shared_terms`` and (MoE layers) ``routed_terms``. Under EP each
    rank's experts see, on average, ``top_k`` times its tokens in all, split by expert TP."""
    routed = routed_terms(model, training, plan, device) if moe else NO_ROUTED
    return compose_times(shared_terms(model, training, plan, device, moe=moe,
                                      attention=attention), routed)


def shared_mlp_gemm_time(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                         device: Device, *, moe: bool) -> float:
    """Forward GEMM seconds of a dense layer's TP-split MLP, or of an MoE block's router (on
    the rank's dispatched tokens) and shared experts (a TP-split dense MLP on all the layer's
    tokens, Megatron-Core SharedExpertMLP), one micro-batch, one rank."""
    t = plan.tp
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    h = model.hidden_size
    gate = 2 if model.mlp_matrices == 3 else 1
    if not moe:
        ffn = model.ffn_hidden_size / t
        return gemm_time(device, tokens, gate * ffn, h) + gemm_time(device, tokens, h, ffn)
    mlp = gemm_time(device, routing.dispatch_tokens(training, plan), model.num_experts, h)
    if model.num_shared_experts:
        shared = model.num_shared_experts * model.expert_ffn / t
        mlp += gemm_time(device, tokens, gate * shared, h) + gemm_time(device, tokens, h, shared)
    return mlp


def mlp_gemm_time(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, device: Device,
                  *, moe: bool) -> float:
    """Forward GEMM seconds of one layer's MLP: ``shared_mlp_gemm_time`` plus, for an MoE
    block, its routed experts' ``expert_gemm_time``."""
    experts = expert_gemm_time(model, training, plan, device) if moe else 0.0
    return shared_mlp_gemm_time(model, training, plan, device, moe=moe) + experts


def expert_gemm_time(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                     device: Device) -> float:
    """Forward GEMM seconds of the rank's routed experts in one MoE layer and micro-batch:
    every local expert's two (three) matrices on its routed rows, split by expert TP.

    In fp8 each expert GEMM's input is cast by a kernel of its own (``own_cast``): Transformer
    Engine's grouped linear quantizes the permuted tokens and the activation output it is
    handed (``tex.split_quantize`` in ``_GroupedLinear.forward``, v2.x
    transformer_engine/pytorch/module/grouped_linear.py), so the cast reads the 16-bit rows
    that the permute or the activation wrote, where a dense layer's norm writes fp8 itself."""
    gate = 2 if model.mlp_matrices == 3 else 1
    ffn = model.expert_ffn / plan.expert_tp
    h = model.hidden_size
    routed = routing.expert_rows(model, training, plan)  # rows per local expert
    per_expert = gemm_time(device, routed, gate * ffn, h, own_cast=True) \
        + gemm_time(device, routed, h, ffn, own_cast=True)
    return max(1, model.num_experts // plan.ep) * per_expert
