"""A layer's pass times from its parts: ``LayerParts`` (compute, exposed TP/CP/EP traffic,
the MoE all-to-all overlap's share, the host's synchronisation stall) composed under a
recompute kind into a ``LayerCost``, on numbers or numpy arrays alike (the vectorized search
composes every plan key at once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paraplan.simulator.collectives import overlapped
from paraplan.simulator.compute import LayerTimes
from paraplan.simulator.pipeline import inflight_microbatches

OVERLAPPED_A2A_STRETCH = (3958.997 / 0.3655) / (9.079 / 0.0011)
"""How much longer the MoE all-to-all kernels run with the all-to-all overlap on than off
(1.312): NVIDIA's Nsight Systems A/B of the 16-H100 Qwen3-30B-A3B HybridEP run, the same
463,348 rank-0 kernels with the overlap off and on (Megatron-Bridge
``skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md`` @067f987df): communication concurrent
with GEMM and attention 9.079 ms = 0.11% of the communication time off (8.25 s), 3,958.997 ms
= 36.55% on (10.83 s); the percentages' rounding bounds the ratio to 1.25-1.37. The dispatch
and combine kernels share the SMs' memory bandwidth and copy engines with the kernels they
run beside; the GPU-active time fell only 1.60 s (22.82 -> 21.22 s) where 3.96 s of
communication was hidden. Applied to every all-to-all of an overlapped layer, as the
profile's total measures it (NVIDIA's guide: "Small-EP MoE runs can still be flat or even
slower", docs/training/communication-overlap.md). Measured on HybridEP; NCCL's all-to-all,
also SM-driven, is given the same (no profile of it was published)."""


@dataclass(frozen=True)
class LayerCost:
    """One layer, one micro-batch, one rank: pass times incl. exposed communication (s).

    fwd/bwd include exposed TP/CP/EP communication (bwd also recompute); wgrad is the weight-
    gradient GEMM time (zb-h1's W pass); compute excludes communication; tp/cp/ep are the
    exposed communication of forward + backward."""

    fwd: float
    bwd: float
    wgrad: float
    compute: float
    tp: float
    cp: float
    ep: float
    ep_lone_fwd: float = 0.0
    """Under the MoE all-to-all overlap: what a forward with no backward beside it (the
    schedule's warm-up) exposes beyond ``fwd``'s overlapped share (0 without the overlap)."""
    ep_lone_bwd: float = 0.0
    """The same for a backward with no forward beside it (the cool-down)."""


@dataclass(frozen=True)
class LayerParts:
    """What a layer's cost is built from, independent of recompute (seconds)."""

    times: LayerTimes
    tp_s: float
    """One exposed TP all-reduce (or all-gather + reduce-scatter) of b*s*h in a forward pass
    (and in a re-run forward under recompute)."""
    tp_bwd_s: float
    """The same in a backward pass (more than ``tp_s`` where PyTorch's async TP leaves the
    input-gradient reduce-scatter exposed: ``layer.SharedParts.tp_bwd_exposed_s``; less, or
    under SP with short GEMMs more, where Megatron runs them under the gradient GEMMs:
    ``layer.SharedParts.tp_bwd_delta_s``)."""
    cp_s: float
    """Exposed ring-attention KV passing of one forward."""
    ep_s: float
    """Dispatch + combine all-to-all of one pass (MoE layers)."""
    cp_bwd_s: float
    """Exposed ring traffic of one backward: K/V again plus dK/dV (``cp_merge``: 16-bit for
    Transformer Engine, fp32 for PyTorch's ``context_parallel``)."""
    ep_overlap_slowdown: float | None = None
    """With ``moe_a2a_overlap``: the fraction of compute the overlapped all-to-all kernels
    take (None: the all-to-alls are exposed)."""
    host_stall_s: float = 0.0
    """GPU idle in one forward while the host issues the kernels after the MoE layer's
    device-to-host sync (``Device.moe_sync_stall_s``; MoE layers)."""
    tp_rerun_skip_s: float = 0.0
    """The TP collective after the MLP's down projection (one all-reduce; under sequence
    parallelism its reduce-scatter, ``layer.SharedParts.tp_scatter_share`` of ``tp_s``) that
    a whole-layer re-run stopping early before that GEMM (``LayerTimes.rerun_skip_s``) does
    not issue again."""
    tp_op_rerun_s: float = 0.0
    """The TP traffic an op-level re-run issues again: the all-gathers in front of attention
    and the MLP under sequence parallelism (fp8 ones where ``TrainingSpec.fp8_tp_gather``),
    else the all-reduce in front of the MLP (``compose_columns``)."""


PARTS = 17
"""How many ``part_columns`` a layer's parts make."""


def op_rerun_tp(tp_s: Any, scatter_share: Any) -> Any:
    """``LayerParts.tp_op_rerun_s`` from the exposed forward TP pair and its reduce-scatter
    share: the pair's two gathers under sequence parallelism; one all-reduce without it."""
    return 2.0 * (1.0 - scatter_share) * tp_s


def part_columns(parts: LayerParts) -> tuple[Any, ...]:
    """``compose_columns``' arguments but the recompute kind, from a layer's parts (numbers,
    or numpy arrays of one value per plan key in the evaluator): ``LayerTimes`` fields, the
    exposed TP/CP/EP traffic, the overlap's share (0 where the all-to-alls are exposed), the
    host stall, the forward part a whole-layer recompute skips, the GEMMs op-level
    checkpointing re-runs, the TP collective an early-stopping re-run skips and the TP
    traffic an op-level re-run issues again."""
    lt = parts.times
    slowdown = 0.0 if parts.ep_overlap_slowdown is None else parts.ep_overlap_slowdown
    return (lt.forward_s, lt.backward_s, lt.gemm_fwd_s, lt.attention_fwd_s,
            lt.elementwise_fwd_s, lt.expert_fwd_s, parts.tp_s, parts.tp_bwd_s, parts.cp_s,
            parts.ep_s, parts.cp_bwd_s, slowdown, parts.host_stall_s, lt.rerun_skip_s,
            lt.op_rerun_gemm_s, parts.tp_rerun_skip_s, parts.tp_op_rerun_s)


def compose_layer_cost(parts: LayerParts, recompute: str) -> LayerCost:
    """Pass times of one layer under ``recompute`` (none, selective, op, full, layer), seconds."""
    cols = compose_columns(*part_columns(parts), recompute)
    return LayerCost(*(float(x) for x in cols))


def compose_columns(fwd_s: Any, bwd_s: Any, gemm_s: Any, attn_s: Any, elem_s: Any,
                    expert_s: Any, tp_s: Any, tp_bwd_s: Any, cp_s: Any, ep_s: Any,
                    cp_bwd_s: Any,
                    slowdown: Any, stall_s: Any, skip_s: Any, op_gemm_s: Any,
                    tp_skip_s: Any, tp_op_s: Any, recompute: Any) -> tuple[Any, ...]:
    """``compose_layer_cost`` on numbers or numpy arrays alike (the vectorized search composes
    every plan key at once): ``LayerTimes`` / ``LayerParts`` fields, ``slowdown`` 0 where the
    all-to-alls are not overlapped (an overlapped one always takes SMs), ``stall_s`` the
    forward's host stall (``LayerParts.host_stall_s``), ``skip_s`` the forward part a
    whole-layer re-run leaves out (``LayerTimes.rerun_skip_s``), ``op_gemm_s`` the GEMMs
    op-level checkpointing re-runs (``LayerTimes.op_rerun_gemm_s``), ``tp_skip_s`` the TP
    collective an early-stopping re-run leaves out (``LayerParts.tp_rerun_skip_s``),
    ``tp_op_s`` the TP traffic an op-level re-run issues (``LayerParts.tp_op_rerun_s``),
    ``recompute`` names.
    Returns the ``LayerCost`` fields in order (fwd, bwd, wgrad, compute, tp, cp, ep,
    ep_lone_fwd, ep_lone_bwd). Masks are 0/1 factors, so one body serves both."""
    # Share of layers re-run whole: all under full, every other one under torchtitan's
    # layer-level checkpointing (``layer``: selective_ac_option "2").
    full = 1 * (recompute == "full") + 0.5 * (recompute == "layer")
    # What the backward re-runs (a whole layer less what an early-stopping checkpoint leaves
    # out); op-level SAC re-runs every second matmul and every memory-bound op.
    extra = full * (fwd_s - skip_s) + (recompute == "selective") * attn_s \
        + (recompute == "op") * (op_gemm_s + elem_s)
    # Per pass: TP 2 all-reduces forward, 2 backward, 2 more when the forward is re-run (less
    # the one after the MLP where the re-run stops early before it).
    # Op-level SAC saves reduce-scatter outputs but not all-gathers or all-reduces
    # (torchtitan parallelize_llama.py ``_save_list`` at ba24697, 2024-12; the same in
    # distributed/activation_checkpoint.py today), and both the eager recompute and
    # torch.compile's partitioner (``must_recompute``: PREFER_RECOMPUTE counts as MUST)
    # re-run every unsaved op the backward needs: the all-gathers in front of attention and
    # the MLP (or, without sequence parallelism, the all-reduce in front of the MLP): one
    # all-reduce's worth of traffic per layer in 16 bits, less with fp8 gathers. After the
    # MLP, sequence parallelism's
    # reduce-scatter is saved; without it the all-reduce there is re-run only where the
    # checkpoint does not stop early (not charged: torchtitan always pairs TP with SP).
    tp_f = 2 * tp_s
    tp_b = 2 * tp_bwd_s + full * (2 * tp_s - tp_skip_s) + (recompute == "op") * tp_op_s
    cp_f, cp_b = cp_s, cp_bwd_s + full * cp_s
    # Megatron-Core refuses the all-to-all overlap where whole layers are recomputed.
    over = (slowdown > 0) * (full == 0)
    # With the overlap on, every all-to-all kernel of the layer runs OVERLAPPED_A2A_STRETCH
    # times as long (the profile's total; partnered or not, as measured).
    stretch = 1.0 + (OVERLAPPED_A2A_STRETCH - 1.0) * over
    ep_f, ep_b = ep_s * stretch, (ep_s + full * ep_s) * stretch
    exposed = overlapped_a2a(fwd_s, bwd_s, gemm_s, expert_s, (ep_f + ep_b) / 4, extra,
                             over * slowdown)
    # The forward's host stall waits like the dispatch it sits in (counted with it), again
    # where the forward is re-run; under the overlap the paired backward's kernels, already
    # queued, keep the GPU busy through it (NVIDIA's Nsight of the Qwen3-30B HybridEP pair:
    # GPU-active time 22.8 s of the 24.7 s step without the overlap, 21.2 s against 21.0 s
    # with it), so only a forward with no partner (the warm-up) waits.
    lone_f, lone_b = over * (ep_f - exposed / 2 + stall_s), over * (ep_b - exposed / 2)
    ep_f, ep_b = ep_f + stall_s - lone_f, ep_b + full * stall_s - lone_b
    return (fwd_s + tp_f + cp_f + ep_f, bwd_s + extra + tp_b + cp_b + ep_b, gemm_s,
            fwd_s + bwd_s + extra, tp_f + tp_b, cp_f + cp_b, ep_f + ep_b, lone_f, lone_b)


def unpartnered_share(schedule: str, p: int, m: int, stage: int, v: int) -> float:
    """Fraction of a stage's (chunk-)forwards that run with no backward beside them under the
    MoE all-to-all overlap, and of its backwards with no forward: the warm-up forwards and as
    many cool-down backwards. Megatron-Core warms up the plain schedule's count plus one
    (schedules.py ``num_warmup_microbatches += 1``; without pipelining micro-batch 0's forward
    and the last backward run alone: combined_1f1b.py), which is the plain schedule's peak
    in-flight count (``pipeline.inflight_microbatches``) out of ``m`` micro-batches."""
    return inflight_microbatches(schedule, p, m, stage, v=v) / m


def overlapped_a2a(fwd_s: Any, bwd_s: Any, gemm_s: Any, expert_s: Any, a2a_s: Any,
                   recompute_s: Any, slowdown: Any) -> Any:
    """Exposed seconds of one MoE layer's four all-to-alls (``a2a_s`` each) under Megatron-Core's
    1F1B all-to-all overlap, for a forward merged with another micro-batch's backward
    (numbers or arrays of ``LayerTimes`` fields).

    Layer i of the forward runs beside layer L-1-i of the backward
    (model_chunk_schedule_plan.py ``TransformerModelChunkSchedulePlan.run``), and inside the
    pair each all-to-all runs beside one piece of compute, in order
    (``TransformerLayerSchedulePlan.run``):

    - backward combine | attention side forward (attention, norms, router, shared experts),
      after the previous pair's attention-side weight gradients;
    - forward dispatch | the experts' input gradients;
    - backward dispatch | the experts' weight gradients, then their forward;
    - forward combine | attention side backward (with ``recompute_s``, what it re-runs).

    Each phase lasts as long as the longer of the two; the covered part costs the
    communication kernels' SMs (``slowdown`` of the compute it runs under). ``a2a_s`` is
    already the overlapped run's (``OVERLAPPED_A2A_STRETCH``). Warm-up and
    cool-down passes, which have no partner, pay ``LayerCost.ep_lone_fwd`` / ``_bwd`` on top
    (``unpartnered_share``)."""
    side_wgrad = gemm_s - expert_s
    side_bwd = bwd_s + recompute_s - 2 * expert_s
    pieces = (side_wgrad + fwd_s - expert_s, expert_s, 2 * expert_s, side_bwd - side_wgrad)
    return sum(overlapped(a2a_s, x, slowdown) for x in pieces)
