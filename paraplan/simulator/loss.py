"""The LM head and the cross-entropy loss of one micro-batch: the vocab-parallel GEMM plus
the memory-bound passes each loss implementation makes over the logits (seconds, bytes)."""

from __future__ import annotations

from paraplan.simulator.compute import Device, gemm_time
from paraplan.simulator.grads import accumulation_time
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

# Bytes moved per logit by the cross entropy, (forward, backward), by implementation:
# - "fused" (``loss_kernels`` None takes ``kernels``; Megatron's vocab-parallel cross entropy
#   on the upcast logits): about five passes over 4-byte logits each way.
# - "eager": PyTorch ``F.cross_entropy`` on 16-bit logits under autocast, whose log_softmax
#   runs in fp32. Forward: the upcast (read 2, write 4), log_softmax's max, sum and write
#   passes (read 4 x 3, write 4), the target gather (negligible): 22 B. Backward: nll_loss's
#   zero-filled gradient (write 4), log_softmax's backward (read 4 + 4, write 4), the
#   downcast's (read 4, write 2): 22 B.
# - "one_kernel": one fused kernel each way on the 16-bit logits (flash-attn's
#   ``xentropy_cuda_lib`` CrossEntropyLoss, llm-foundry's default ``fused_crossentropy``):
#   the forward reads the logits (2), the backward reads them and writes the gradient (4).
CE_BYTES_PER_LOGIT = {"fused": (20.0, 20.0), "eager": (22.0, 22.0), "one_kernel": (2.0, 4.0)}
# A no-grad evaluation of the loss for a logged training metric (Composer's
# ``LanguageCrossEntropy`` / ``LanguagePerplexity``: ``torch.nn.CrossEntropyLoss`` under
# autocast): the eager forward, 22 B per logit each.
METRIC_BYTES_PER_LOGIT = CE_BYTES_PER_LOGIT["eager"][0]


def loss_bytes_per_logit_moved(training: TrainingSpec) -> tuple[float, float]:
    """(forward, backward) bytes of memory traffic per logit of the loss and the training
    metrics evaluated on the logits every micro-batch (``TrainingSpec.logit_metric_passes``),
    at 16-bit logits."""
    fwd, bwd = CE_BYTES_PER_LOGIT[training.loss_kernels or training.kernels]
    return fwd + training.logit_metric_passes * METRIC_BYTES_PER_LOGIT, bwd


def lm_head_times(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                  device: Device) -> tuple[float, float]:
    """(forward, backward) seconds of the vocab-parallel LM head + cross entropy (1 micro-batch)."""
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    v = model.vocab_size / plan.tp
    gemm = gemm_time(device, tokens, v, model.hidden_size)
    ce_f, ce_b = loss_bytes_per_logit_moved(training)
    logits = tokens * v / device.memory_Bps
    accumulate = accumulation_time(model.lm_head_params / plan.tp, training, plan, device)
    return gemm + ce_f * logits, 2.0 * gemm + ce_b * logits + accumulate
