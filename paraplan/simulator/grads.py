"""Per-parameter passes of a step on one GPU: accumulating each micro-batch's weight gradients
into the gradient buffer, as each trainer does it, and the memory-bound optimizer update.
All times are seconds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import DTYPE_BYTES, TrainingSpec

if TYPE_CHECKING:
    from paraplan.simulator.compute import Device

FP32_BYTES = DTYPE_BYTES["fp32"]


def grad_accumulation_time(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                           device: Device, *, moe: bool) -> float:
    """Seconds to add one micro-batch's weight gradients of one layer into the gradient buffer.

    Eager autograd (PyTorch DDP, the executor) writes each weight gradient to its own tensor
    and then ``AccumulateGrad`` adds it into the long-lived buffer: read both, write one
    (``accumulation_bytes_per_param``), on every micro-batch (DDP's first one copies into the
    bucket view instead, which this ignores). Fused stacks write the
    weight-gradient GEMM straight into the fp32 buffer (Megatron's
    ``gradient_accumulation_fusion``, GEMM beta = 1): no extra pass. DeepSpeed's BF16
    optimizer adds the 16-bit gradients into fp32 ones after every backward
    (``accumulation_bytes_per_param``). Under ZeRO-2/3 the gradient is reduce-scattered
    every micro-batch and only the 1/dp shard is accumulated, which this treats as free.
    """
    shared, routed = layer_grad_params(model, plan, moe=moe)
    return accumulation_time(shared + routed, training, plan, device)


def layer_grad_params(model: ModelSpec, plan: ParallelPlan, *, moe: bool) -> tuple[float, float]:
    """Parameters of one layer on one rank whose gradients it accumulates: (TP-split ones,
    the routed experts' ``E / (ep etp)`` share; 0 for a dense layer)."""
    if moe:
        return (model.moe_layer_shared_params / plan.tp,
                model.num_experts * model.expert_params / (plan.ep * plan.expert_tp))
    return model.dense_layer_params / plan.tp, 0.0


def accumulation_bytes_per_param(training: TrainingSpec) -> float:
    """Bytes moved per parameter per micro-batch to accumulate its weight gradient
    (``TrainingSpec.grad_accumulation``; None follows ``kernels``): fused 0; eager
    compute_bytes + 2 x grad_buffer_bytes (read the new 16-bit gradient, read and write the
    buffer in its own dtype: PyTorch ``AccumulateGrad`` into a 16-bit ``.grad``, 3 x 2 B, or
    Megatron without ``--gradient-accumulation-fusion``, whose DDP hook runs
    ``param.main_grad.add_(param.grad.data)`` into the fp32 buffer, 2 + 2 x 4 B:
    core/distributed/distributed_data_parallel.py ``_make_backward_post_hook``); fp32_add, as
    DeepSpeed's BF16 optimizer runs ``hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))``
    after every backward (runtime/bf16_optimizer.py ``update_hp_grads``, which
    pipe/engine.py calls after each micro-batch's backward): the cast reads the 16-bit
    gradient and writes an fp32 copy, the add reads that copy and the fp32 buffer and writes
    the buffer: compute_bytes + 4 * 4."""
    kind = training.grad_accumulation or ("eager" if training.kernels == "eager" else "fused")
    if kind == "eager":
        return training.compute_bytes + 2.0 * training.grad_buffer_bytes
    if kind == "fp32_add":  # the cast (none in fp32 training), then the in-place add
        cast = training.compute_bytes + FP32_BYTES if training.compute_bytes < FP32_BYTES else 0
        return cast + 3.0 * FP32_BYTES
    return 0.0


def accumulation_time(params_on_rank: float, training: TrainingSpec, plan: ParallelPlan,
                      device: Device) -> float:
    """Seconds of the accumulation pass over ``params_on_rank`` parameters, one micro-batch
    (``accumulation_bytes_per_param``; 0 under ZeRO-2/3, whose gradients are reduce-scattered
    every micro-batch)."""
    if plan.zero_stage >= 2:
        return 0.0
    return accumulation_bytes_per_param(training) * params_on_rank / device.memory_Bps


def optimizer_step_time(params_on_rank: float, training: TrainingSpec, device: Device) -> float:
    """Memory-bound optimizer update of ``params_on_rank`` parameters (seconds).

    Adam with fp32 master: read+write master, momentum, variance (24 B), read grads twice
    (norm/clip and update, 4 B), write 16-bit weights (2 B) = 30 bytes per parameter.
    """
    states = training.optimizer_state_bytes_per_param
    per_param = 2.0 * states + 2.0 * training.compute_bytes + training.compute_bytes
    if device.fp8_weights_cached:
        # The once-per-step fp8 weight cast: read the 16-bit weight, write the fp8 copy and
        # its transpose (Transformer Engine keeps both for the forward and dgrad GEMMs).
        per_param += 4.0
    return params_on_rank * per_param / device.memory_Bps
