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


# Extra fp32 tensor passes per parameter of an unfused Adam/AdamW step over the one-kernel
# update (which reads master, gradient and both moments once and writes master and moments
# once: 7 accesses). PyTorch's ``foreach`` AdamW (torch/optim/adamw.py ``_multi_tensor_adamw``,
# torch 2.5/2.6) runs the decoupled weight decay (``_foreach_mul_`` on the parameters: read,
# write), ``_foreach_lerp_`` (momentum: read it and the gradient, write), ``_foreach_mul_`` and
# ``_foreach_addcmul_`` on the variance (2 + 3), ``_foreach_sqrt`` into a new list, its
# ``_foreach_div_`` and ``_foreach_add_`` (eps) (2 + 2 + 2) and ``_foreach_addcdiv_`` into the
# parameters (4): 20 accesses. Composer's ``DecoupledAdamW`` (composer/optim/
# decoupled_weight_decay.py ``adamw``, v0.14-v0.17) loops over the parameters with the same
# ops, the momentum as ``mul_`` then ``add_`` (2 + 3) and the decay ``param.mul_`` only when
# ``weight_decay != 0`` (llm-foundry's MPT yamls set 0.0): 20 accesses too. 20 - 7 = 13.
UNFUSED_ADAM_EXTRA_PASSES = 13


def optimizer_bytes_per_param(training: TrainingSpec) -> float:
    """Bytes of memory traffic per parameter of one optimizer step on its rank.

    - The update (``training.optimizer_impl``): a fused kernel (apex / Transformer Engine /
      DeepSpeed ``FusedAdam``, ``torch.optim.AdamW(fused=True)``) reads and writes the master
      weights and moments (2 x ``optimizer_state_bytes_per_param``: 24 B for fp32 Adam) and
      reads the gradient once; PyTorch's ``foreach`` and for-loop Adam pass over fp32 tensors
      ``UNFUSED_ADAM_EXTRA_PASSES`` more times (52 B).
    - Gradient clipping: the global norm reads every gradient once; PyTorch's
      ``clip_grad_norm_`` (and FSDP's) then multiplies every gradient by the clamped
      coefficient whether or not it clips (torch/nn/utils/clip_grad.py: "multiplying by the
      clamped coef is redundant when the coef is clamped to 1, but doing so avoids a
      ``if clip_coef < 1:`` conditional"; ``training.clip_scales_always``), read and write;
      Megatron-Core scales only when the norm exceeds the limit (core_v0.12
      optimizer/clip_grads.py ``if clip_coeff < 1.0``).
    - Copies around a mixed-precision optimizer that keeps fp32 master weights beside the
      16-bit model (Megatron's distributed optimizer, DeepSpeed's ZeRO and BF16 optimizers):
      the gradient shard becomes fp32 (Megatron ``_copy_model_grads_to_main_grads``:
      ``shard_model_grad.float()``, a copy from a 16-bit grad buffer, none from an fp32 one)
      and the updated master is copied into the 16-bit parameter (``_copy_main_params_to_
      model_params``: ``shard_model_param.data.copy_(shard_main_param)``, read 4, write 2);
      an optimizer keeping 16-bit state (Megatron's precision-aware optimizer, apex
      DistributedFusedAdam) writes the 16-bit parameter in its kernel. PyTorch FSDP
      (``fsdp_copies`` set) updates its fp32 parameter shards in place and casts them when it
      gathers them (priced with the gathers): no copies.
    - fp16 loss scaling unscales every fp32 gradient first (read, write). (fp8 with cached
      weights also casts each weight once per step: ``optimizer_step_time`` adds it.)

    Megatron-Core with a bf16 gradient buffer: 24 + 4 + 4 + 6 + 6 = 44 B; with an fp32 one
    38 B; torchtitan's FSDP2 with fused AdamW 24 + 4 + 4 + 8 = 40 B; its foreach AdamW and
    Composer's for-loop DecoupledAdamW 92 B."""
    cb, states = training.compute_bytes, training.optimizer_state_bytes_per_param
    mixed = training.master_weights and training.precision != "fp32"
    fsdp = training.fsdp_copies is not None
    separate = mixed and not fsdp and training.master_weights_dtype == "fp32" and \
        training.moments_dtype == "fp32"
    if fsdp:
        grad = float(training.sharded_grad_bytes)
    elif separate or training.precision == "fp32":  # fp32 main gradients
        grad = FP32_BYTES
    elif mixed:  # a 16-bit-state optimizer reads the gradient buffer
        grad = float(training.grad_buffer_bytes)
    else:  # no master copy: the 16-bit gradients of the 16-bit parameters
        grad = cb
    per_param = 2.0 * states + grad
    if training.optimizer_impl != "fused" and training.optimizer in ("adam", "adamw"):
        per_param += UNFUSED_ADAM_EXTRA_PASSES * FP32_BYTES
    per_param += grad * (3.0 if training.clip_scales_always else 1.0)
    if separate:
        buffer = training.grad_buffer_bytes
        per_param += (buffer + FP32_BYTES if buffer < FP32_BYTES else 0.0) + FP32_BYTES + cb
    elif mixed and not fsdp:
        per_param += cb
    if training.precision == "fp16" and mixed:
        per_param += 2.0 * grad
    return per_param


def optimizer_step_time(params_on_rank: float, training: TrainingSpec, device: Device) -> float:
    """Memory-bound optimizer update of ``params_on_rank`` parameters (seconds):
    ``optimizer_bytes_per_param`` at the achievable memory bandwidth."""
    per_param = optimizer_bytes_per_param(training)
    if device.fp8_weights_cached:
        # The once-per-step fp8 weight cast: read the 16-bit weight, write the fp8 copy and
        # its transpose (Transformer Engine keeps both for the forward and dgrad GEMMs).
        per_param += 4.0
    return params_on_rank * per_param / device.memory_Bps
