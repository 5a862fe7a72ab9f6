"""What overlapping the tensor-parallel collectives with the GEMMs costs the GEMMs.

Transformer Engine's userbuffers (Megatron-Core ``--tp-comm-overlap``) hide the sequence-
parallel all-gathers and reduce-scatters behind the adjacent GEMMs by splitting those GEMMs
into chunks. The chunks run round-robin on several compute streams
(transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp: ``nvte_cublas_gemm(...,
_math_sms, _stream_compute[i % _stream_compute.size()])``), so one chunk fills the wave tail
of the one before and the split GEMM costs what the whole one does; the price is
``_math_sms``: the pipelined and bulk overlaps hold SMs for their communication kernels for
as long as the GEMM runs. The exposed communication that remains is
``layer.compose_parts``'.
"""

from __future__ import annotations

from paraplan.simulator.collectives import overlapped
from paraplan.simulator.compute import Device, gemm_time
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

# Transformer Engine userbuffers' defaults (transformer_engine/pytorch/module/base.py
# ``initialize_ub``): GEMMs that take an all-gathered input (QKV and FC1 forward; the
# O-projection and FC2 data gradients) run "ring_exchange" (tp chunks, the exchange on copy
# engines: ``num_sm`` 1, no SM margin); GEMMs whose output is reduce-scattered (O-projection
# and FC2 forward) run "pipeline" (4 chunks) and the QKV and FC1 data gradients overlap their
# reduce-scatter "bulk", both beside a communication kernel on ``num_sm`` 16 SMs held back
# from the GEMM (``set_sm_margin``).
UB_COMM_SMS = 16


def tp_overlap_split_time(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                          device: Device, *, moe: bool) -> tuple[float, float]:
    """Extra (forward, backward) GEMM seconds of one layer and micro-batch when the TP
    collectives overlap the GEMMs as Transformer Engine's userbuffers do
    (``plan.tp_comm_overlap``): the O-projection and FC2 forward GEMMs (pipelined
    reduce-scatter) and the QKV and FC1 data gradients (bulk reduce-scatter) run on the
    SMs their ``UB_COMM_SMS`` communication SMs leave, sm / (sm - 16) times as long; the
    ring-exchange GEMMs lose nothing (copy engines). The whole GEMMs are
    ``compute.attention_times`` and ``layer_terms.mlp_gemm_time``. The overlap covers the
    projections that read or write the hidden state and the dense MLP (an MoE layer's
    experts sit behind the expert all-to-alls instead)."""
    t = plan.tp
    sm = device.sm_count
    if not plan.tp_comm_overlap or t <= 1 or not sm or sm <= UB_COMM_SMS \
            or training.tp_overlap != "userbuffers":
        return 0.0, 0.0
    m = plan.micro_batch_size * training.seq_len / plan.cp  # rows once sequence-gathered
    h = model.hidden_size
    slower = UB_COMM_SMS / (sm - UB_COMM_SMS)
    gathered = [p.per_rank(t) for p in model.attention.projections
                if p.split == "column" and p.k_in == h]
    scattered = [p.per_rank(t) for p in model.attention.projections
                 if p.split == "row" and p.n_out == h]
    if not moe:
        ffn = model.ffn_hidden_size / t
        gathered.append((h, (2 if model.mlp_matrices == 3 else 1) * ffn))
        scattered.append((ffn, h))
    fwd = sum(gemm_time(device, m, n, k) for k, n in scattered) * slower
    bwd = sum(gemm_time(device, m, k, n) for k, n in gathered) * slower  # data gradients
    return fwd, bwd


def column_linear_times(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                        device: Device, *, moe: bool) -> tuple[float | None, float | None]:
    """Forward GEMM seconds (one layer and micro-batch; the weight- and data-gradient GEMMs do
    the same FLOPs) of the column-parallel linears that read the layer's hidden state:
    attention's fused QKV (MLA without a query LoRA rank: its q projection) and the dense MLP's
    FC1 (gated: gate and up). None where a side has no such linear: MLA with a query LoRA rank
    projects up from its latents, and an MoE block's TP traffic is its dispatcher's."""
    t, h = plan.tp, model.hidden_size
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    qkv = [p.per_rank(t) for p in model.attention.projections
           if p.split == "column" and p.k_in == h]
    attn = sum(gemm_time(device, tokens, n, k) for k, n in qkv) if qkv else None
    if moe:
        return attn, None
    gate = 2 if model.mlp_matrices == 3 else 1
    return attn, gemm_time(device, tokens, gate * model.ffn_hidden_size / t, h)


def dgrad_overlap_applies(training: TrainingSpec, plan: ParallelPlan) -> bool:
    """The trainer runs the column-parallel linears' backward collectives under their
    gradient GEMMs (``TrainingSpec.tp_dgrad_overlap``) and no TP overlap of its own prices
    them instead (``plan.tp_comm_overlap``: userbuffers or async TP)."""
    return training.tp_dgrad_overlap and not plan.tp_comm_overlap


def column_backward_exposed(cover_s: float, *, sequence_parallel: bool, reduce_s: float,
                            gather_s: float, scatter_s: float, sms: float) -> float:
    """Exposed seconds of one column-parallel linear's backward collectives run under its
    gradient GEMMs, each ``cover_s`` long (``dgrad_overlap_delta``): with sequence
    parallelism the input re-gather under the data gradient and the reduce-scatter under the
    weight gradient, else the all-reduce under the weight gradient; the covered part costs
    ``sms`` (``Device.nccl_slowdown``)."""
    if sequence_parallel:
        return overlapped(gather_s, cover_s, sms) + overlapped(scatter_s, cover_s, sms)
    return overlapped(reduce_s, cover_s, sms)


def dgrad_overlap_delta(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                        device: Device, *, moe: bool, reduce_s: float, gather_s: float,
                        scatter_s: float) -> float:
    """Change in one backward TP collective's exposed seconds (a layer's backward has two)
    when the trainer runs them as Megatron does (``TrainingSpec.tp_dgrad_overlap``;
    ``plan.tp_comm_overlap`` off), against the plain price (one all-reduce per collective;
    SP: an all-gather and a reduce-scatter). ``reduce_s``: one all-reduce of the layer's b s h
    activations on its TP group (read without sequence parallelism); ``gather_s``,
    ``scatter_s``: one all-gather and one reduce-scatter of them (read with it). Negative where
    the GEMMs hide the traffic; under sequence parallelism it prices the input re-gather
    Megatron always runs (it saves the sharded input), so it can be positive where the GEMMs
    are too short to hide that.

    Megatron-LM (megatron/mpu/layers.py ``LinearWithGradAccumulationAndAsyncCommunication``,
    2022-03; async all-reduce since cf7efd4f5a, 2021-08) and Transformer Engine
    (pytorch/module/linear.py ``_Linear.backward``) compute a column-parallel linear's data
    gradient, start its all-reduce (sequence parallel: reduce-scatter) asynchronously, run the
    weight-gradient GEMM and only then wait; under sequence parallelism the input the forward
    saved sharded is re-gathered asynchronously during the data-gradient GEMM. Korthikanti et
    al. 2022 (arXiv:2205.05198) sec. 6.2 measure it: the 22B layer's backward is 11.9 ms
    without recompute, and full recompute costs 39% rather than 33% "due to an optimization
    in the backward pass where we overlap all-reduce communication with the linear weight's
    gradient computation" (the recomputed forward's all-reduces stay exposed). What the GEMM
    covers costs NCCL's SMs (``Device.nccl_slowdown``); the row-parallel linears' output
    gradients (sequence parallel: all-gathers) stay exposed."""
    sp = plan.sequence_parallel
    base = gather_s + scatter_s if sp else reduce_s
    total = 0.0
    for cover in column_linear_times(model, training, plan, device, moe=moe):
        if cover is None:
            total += base
        else:  # SP: the row-parallel output gradient's all-gather stays exposed beside it
            total += (gather_s if sp else 0.0) + column_backward_exposed(
                cover, sequence_parallel=sp, reduce_s=reduce_s, gather_s=gather_s,
                scatter_s=scatter_s, sms=device.nccl_slowdown)
    return total / 2.0 - base
