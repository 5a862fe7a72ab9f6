"""Per-layer and LM-head costs on one GPU: compute, exposed TP/CP/EP communication, recomputation,
and the TP collectives outside the layers (embedding, LM head, loss)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from paraplan.simulator import collectives as coll
from paraplan.simulator import moe as routing
from paraplan.simulator.compute import (
    Device,
    LayerTimes,
    dispatch_sort_time,
    gemm_time,
    kv_widths,
    with_dispatch_sort,
)
from paraplan.simulator.grads import FP32_BYTES
from paraplan.simulator.layer_compose import (
    LayerCost,
    LayerParts,
    compose_columns,
    compose_layer_cost,
    op_rerun_tp,
    overlapped_a2a,
    unpartnered_share,
)
from paraplan.simulator.layer_terms import (
    NO_ROUTED,
    RoutedTerms,
    SharedTerms,
    compose_times,
    routed_terms,
    shared_terms,
)
from paraplan.simulator.loss import lm_head_times
from paraplan.simulator.tp_overlap import (
    column_backward_exposed,
    dgrad_overlap_applies,
    dgrad_overlap_delta,
    tp_overlap_split_time,
)
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.topology import Topology
from paraplan.specs.training import TrainingSpec

__all__ = ["HeadTimes", "LayerCost", "LayerParts", "compose_columns", "compose_layer_cost",
           "head_times", "host_stall", "layer_a2a_time", "layer_cost",
           "layer_ep_parts", "layer_parts", "lm_head_cost", "mtp_columns", "mtp_projection_time",
           "overlapped_a2a", "placed_group", "unpartnered_share", "with_mtp"]


def placed_group(plan: ParallelPlan, ranks: tuple[int, ...], base_rank: int = 0
                 ) -> tuple[int, ...]:
    """The GPUs of a group of ranks counted from ``base_rank``: ``base_rank + r`` for each r,
    mapped through ``plan.placement`` (rank r on GPU r when None)."""
    if base_rank:
        ranks = tuple(base_rank + r for r in ranks)
    return ranks if plan.placement is None else tuple(plan.placement[r] for r in ranks)


def layer_parts(model: ModelSpec, topo: Topology, training: TrainingSpec, plan: ParallelPlan,
                device: Device, *, moe: bool, base_rank: int = 0) -> LayerParts:
    """Compute time and exposed TP/CP/EP communication of one layer and micro-batch.
    Depends on the plan only through tp, cp, ep, etp, sequence parallelism, micro-batch size,
    tp_comm_overlap, placement, the capacity factor (never searched) and (eager kernels)
    whether ZeRO >= 2. Groups are the TP/CP/EP groups that start at rank ``base_rank`` (a
    multiple of tp*cp; 0 = the first groups in rank order, tp fastest), on the GPUs
    ``plan.placement`` maps those ranks to (rank r on GPU r if None)."""
    routed = routed_terms(model, training, plan, device) if moe else NO_ROUTED
    shared = shared_parts(model, topo, training, plan, device, moe=moe, base_rank=base_rank)
    lt, tp_c, tp_b, cp_c, cp_b = compose_parts(shared, routed)
    if moe:  # the dispatcher's sort by local expert (it reads the dispatcher)
        lt = with_dispatch_sort(lt, dispatch_sort_time(model, training, plan, device))
    ep_c, overlap = layer_ep_parts(model, topo, training, plan, device, moe=moe,
                                   base_rank=base_rank)
    # The collective after the down projection that an early-stopping re-run does not reach.
    trail = (shared.tp_scatter_share * tp_c if plan.sequence_parallel else tp_c) \
        if lt.rerun_skip_s else 0.0
    return LayerParts(lt, tp_c, tp_b, cp_c, ep_c, cp_b, overlap,
                      host_stall(device, plan, moe=moe), trail,
                      op_rerun_tp(tp_c, shared.tp_scatter_share))


def host_stall(device: Device, plan: ParallelPlan, *, moe: bool) -> float:
    """``LayerParts.host_stall_s``: the device's MoE sync stall for a dropless MoE layer; none
    for dense layers, nor with a capacity factor (Megatron pads each expert's input to it,
    ``--moe-pad-expert-input-to-capacity``, and its dispatcher's preprocess returns before the
    device-to-host copy)."""
    return device.moe_sync_stall_s if moe and plan.moe_capacity_factor is None else 0.0


@dataclass(frozen=True)
class SharedParts:
    """What of a layer's compute and TP/CP traffic does not read ep or expert TP (seconds;
    numbers, or numpy arrays of one value per plan key in the evaluator)."""

    terms: SharedTerms
    split_fwd_s: Any
    """``tp_overlap.tp_overlap_split_time``: the userbuffers overlap's slower GEMMs."""
    split_bwd_s: Any
    tp_s: Any
    """The TP collectives of one forward, before any overlap."""
    tp_cover: Any
    """Share of the layer's forward GEMMs each TP collective hides under (0: no overlap)."""
    tp_cover_sms: Any
    """Share of the covered collective's time the GEMMs lose to its SMs."""
    cp_s: Any
    cp_bwd_s: Any
    tp_bwd_exposed_s: Any = 0.0
    """Of ``tp_s``, what a backward pass cannot hide under the overlap: PyTorch's async TP
    fuses no reduce-scatter of an input gradient (``shared_parts``); 0 otherwise."""
    tp_bwd_delta_s: Any = 0.0
    """Added to one backward TP collective's exposed time where the trainer runs the column-
    parallel linears' backward collectives under their gradient GEMMs, sequence parallelism's
    input re-gather included (``tp_overlap.dgrad_overlap_delta``; positive where the GEMMs are
    too short to hide that re-gather); 0 otherwise."""
    tp_scatter_share: Any = 0.5
    """Under sequence parallelism, the reduce-scatter's share of ``tp_s`` (half in 16 bits;
    more where the all-gather runs in fp8: ``TrainingSpec.fp8_tp_gather``)."""


def compose_parts(shared: SharedParts, routed: RoutedTerms
                  ) -> tuple[LayerTimes, Any, Any, Any, Any]:
    """A layer's times and exposed TP and CP traffic (forward, backward each) from its two
    parts (numbers or numpy arrays): all but the expert all-to-alls and their overlap."""
    lt = compose_times(shared.terms, routed)
    lt = replace(lt, forward_s=lt.forward_s + shared.split_fwd_s,
                 backward_s=lt.backward_s + shared.split_bwd_s)
    cover = lt.gemm_fwd_s * shared.tp_cover
    tp_c = coll.overlapped(shared.tp_s, cover, shared.tp_cover_sms)
    tp_b = coll.overlapped(shared.tp_s - shared.tp_bwd_exposed_s, cover,
                           shared.tp_cover_sms) + shared.tp_bwd_exposed_s \
        + shared.tp_bwd_delta_s
    return lt, tp_c, tp_b, shared.cp_s, shared.cp_bwd_s


def shared_parts(model: ModelSpec, topo: Topology, training: TrainingSpec, plan: ParallelPlan,
                 device: Device, *, moe: bool, base_rank: int = 0,
                 attention: tuple[float, float, float] | None = None) -> SharedParts:
    """``SharedParts`` of one layer: it reads the plan's tp, cp, sequence parallelism,
    micro-batch size, TP overlap, placement and whether ZeRO >= 2."""
    t, cp = plan.tp, plan.cp

    def on(ranks: tuple[int, ...]) -> tuple[int, ...]:
        return placed_group(plan, ranks, base_rank)

    mb_tokens = plan.micro_batch_size * training.seq_len / cp
    act_bytes = mb_tokens * model.hidden_size * training.compute_bytes
    terms = shared_terms(model, training, plan, device, moe=moe, attention=attention)
    split_fwd, split_bwd = tp_overlap_split_time(model, training, plan, device, moe=moe)
    tp_c = cover = sms = bwd_exposed = bwd_delta = 0.0
    scatter_share = 0.5
    if t > 1:  # one all-reduce of b*s*h (SP: an all-gather and a reduce-scatter of it)
        tp_group = on(tuple(range(t)))
        reduce = gather = scatter = 0.0
        if plan.sequence_parallel:
            scatter = coll.group_collective(topo, tp_group, "reduce_scatter", act_bytes)
            gather = coll.group_collective(topo, tp_group, "all_gather", act_bytes)
            if training.tp_gather_bytes != training.compute_bytes:
                # fp8 gathers (TrainingSpec.fp8_tp_gather); an MoE block's own half gathers
                # 16-bit tokens in its dispatcher, so only its attention half is quantized.
                quant = coll.group_collective(topo, tp_group, "all_gather", act_bytes
                                              * training.tp_gather_bytes
                                              / training.compute_bytes)
                gather = 0.5 * (quant + gather) if moe else quant
            tp_c = gather + scatter
            scatter_share = scatter / tp_c
        else:
            tp_c = reduce = coll.group_collective(topo, tp_group, "all_reduce", act_bytes)
        if dgrad_overlap_applies(training, plan):
            bwd_delta = dgrad_overlap_delta(model, training, plan, device, moe=moe,
                                            reduce_s=reduce, gather_s=gather, scatter_s=scatter)
        if plan.tp_comm_overlap:
            # Chunks under the adjacent GEMM (a quarter of the layer's GEMMs per collective,
            # routed experts included: ``compose_parts``); the SMs it holds:
            # ``tp_overlap_split_time`` (userbuffers), NCCL's (async TP).
            cover = 0.25
            if training.tp_overlap == "async_tp":
                sms = device.nccl_slowdown
                # Inductor's micro_pipeline_tp fuses an all-gather into the matmul reading it
                # and a reduce-scatter into the one matmul writing it; a backward's input
                # gradient is the sum of the q/k/v (or gate/up) data gradients before it is
                # reduce-scattered, so that reduce-scatter stays whole (pytorch PR #149946
                # review, 2025-03-28: "there were only valid scaled_mm-reduce-scatter patterns
                # in the forward graph, but not in the backward graph ... the reduce-scatters
                # are receiving as input the addition of various scaled_mms"). PyTorch's own
                # figures agree: up to 20-29% faster forwards but ~8% end to end (dev-discuss
                # "Introducing Async Tensor Parallelism in PyTorch", Llama3 8B and 70B).
                bwd_exposed = scatter
    cp_c = cp_b = 0.0
    if cp > 1:  # ring attention: pass K and V blocks cp-1 times, overlapped with attention
        # Every rank sends to its ring neighbour at once, so each step runs at the ring's
        # bottleneck edge (an inter-node hop once the CP group spans nodes).
        # K and V as the attention kernel reads them (MLA: expanded; repeated to the query
        # heads where the trainer does so first: ``compute.kv_widths``).
        kv = mb_tokens * sum(kv_widths(model, training)) * training.compute_bytes / t
        ring = topo.p2p_ring(on(tuple(range(0, t * cp, t))))
        step = coll.p2p(kv, ring.bandwidth_GBps * 1e9 * coll.kind_efficiency(topo, "p2p"),
                        ring.latency_s)
        # What the attention cannot cover stays exposed; the covered part costs NCCL's SMs
        # (as for every overlapped collective: ``Device.nccl_slowdown``).
        ring_s, under = (cp - 1) * step, terms.attention_fwd_s
        ring_c = coll.overlapped(ring_s, under, device.nccl_slowdown)
        # Backward: K/V travel again and dK/dV with them, at the accumulator's width (PyTorch
        # sends fp32 dK/dV: torch/distributed/tensor/experimental/_attention.py).
        # dK/dV go round cp times there (dkv_rotater sends at every step), K/V cp - 1 times.
        dkv = (4.0 / training.compute_bytes * cp / (cp - 1)
               if training.cp_merge == "eager_fp32" else 1.0)
        cp_c, cp_b = ring_c, (1.0 + dkv) * ring_c
        if training.cp_kv_exchange == "allgather":
            # PyTorch's _AllGatherRotater gathers every rank's K/V block in one collective,
            # issued before the first (local) attention step and waited on before the second,
            # so only that step, 1/cp of the rank's attention under the round-robin load
            # balance, covers it; the backward gathers K/V again the same way, while its dK/dV
            # still pass round the ring step by step (the dK/dV rotater is always ALL_TO_ALL:
            # _templated_ring_attention_backward).
            gather = coll.group_collective(topo, on(tuple(range(0, t * cp, t))), "all_gather",
                                           kv * cp)
            first = terms.attention_fwd_s / cp
            cp_c = coll.overlapped(gather, first, device.nccl_slowdown)
            cp_b = cp_c + dkv * ring_c
    return SharedParts(terms, split_fwd, split_bwd, tp_c, cover, sms, cp_c, cp_b, bwd_exposed,
                       bwd_delta, scatter_share)


def layer_ep_parts(model: ModelSpec, topo: Topology, training: TrainingSpec,
                   plan: ParallelPlan, device: Device, *, moe: bool, base_rank: int = 0
                   ) -> tuple[float, float | None]:
    """``layer_parts``' expert all-to-alls of one pass (``layer_a2a_time``) and the share of
    compute their overlapped kernels take (``a2a_overlap_share``; None: exposed)."""
    return (layer_a2a_time(model, topo, training, plan, moe=moe, base_rank=base_rank),
            a2a_overlap_share(training, plan, device, moe=moe))


def layer_a2a_time(model: ModelSpec, topo: Topology, training: TrainingSpec,
                   plan: ParallelPlan, *, moe: bool, base_rank: int = 0) -> float:
    """Seconds of a MoE layer's dispatch and combine all-to-alls in one pass (one micro-batch,
    one rank), by the MoE dispatcher; it does not read the all-to-all overlap, and reads the
    plan only through ``moe.a2a_shape``."""

    def on(ranks: tuple[int, ...]) -> tuple[int, ...]:
        return placed_group(plan, ranks, base_rank)

    ep_c = 0.0
    if moe and plan.ep * plan.expert_tp > 1:
        # Dispatch + combine all-to-all of each rank's T*k token copies (T = b s / (cp tp),
        # the sequence-parallel shard: ``moe.dispatch_tokens``), then, with expert TP (and SP), the
        # expert-TP group all-gathers what its members received and reduce-scatters the
        # expert outputs before the combine (Megatron-Core MoEAlltoAllTokenDispatcher).
        a2a = routing.dispatch_bytes(model, training, plan)
        etp = plan.expert_tp
        ep_group = on(tuple(range(0, etp * plan.ep, etp)))
        if training.moe_dispatcher == "hierarchical":
            # DeepEP/HybridEP send a token once to each other rank it is routed to (not once
            # per expert), and across nodes once per remote node, forwarded over NVLink there.
            nodes = topo.memoized("nodes", ep_group, lambda g: len(np.unique(
                topo.node_of_gpu[np.asarray(g)])))
            token = a2a / model.moe_top_k
            remote = token * routing.other_groups_hit(model, nodes)
            local = token * routing.other_groups_hit(model, plan.ep)
            ep_c = 2 * coll.forwarded_all_to_all(topo, ep_group, remote, local)
        else:
            ep_c = 2 * coll.group_collective(topo, ep_group, "all_to_all", a2a)
        if routing.etp_gather(plan) > 1:  # without SP every expert-TP rank has the tokens
            etp_group = on(tuple(range(etp)))
            ep_c += (coll.group_collective(topo, etp_group, "all_gather", etp * a2a)
                     + coll.group_collective(topo, etp_group, "reduce_scatter", etp * a2a))
    return ep_c


def a2a_overlap_share(training: TrainingSpec, plan: ParallelPlan, device: Device, *,
                      moe: bool) -> float | None:
    """With ``moe_a2a_overlap``: the share of compute the overlapped all-to-all kernels take
    (None: the all-to-alls are exposed)."""
    if moe and training.moe_a2a_overlap and plan.ep > 1 and device.sm_count:
        # The communication kernels take SMs from the compute they run under: NCCL's
        # channels, or the flex dispatcher's (``TrainingSpec.moe_dispatcher_sms``; by
        # default the 20 DeepSeek gives DeepEP, DeepSeek-V3 report sec. 3.2.2).
        sms = training.moe_dispatcher_sms or DEEPEP_SMS
        return (min(sms, device.sm_count) / device.sm_count
                if training.moe_dispatcher == "hierarchical"
                else device.nccl_slowdown)
    return None


CE_VALUES_PER_TOKEN = 3  # max, sum of exponentials, target logit (Megatron)
DEEPEP_SMS = 20  # SMs DeepSeek-V3 gives its dispatch/combine kernels (report sec. 3.2.2)


@dataclass(frozen=True)
class HeadTimes:
    """The embedding, LM head and loss of one micro-batch on one rank, charged to the last
    pipeline stage (seconds)."""

    fwd: float
    """LM head + cross entropy forward, plus the exposed TP collectives below."""
    bwd: float
    """Their backward, plus its exposed TP collectives."""
    tp: float
    """The TP-collective part of ``fwd + bwd``."""


def head_times(model: ModelSpec, topo: Topology, training: TrainingSpec, plan: ParallelPlan,
               device: Device, *, base_rank: int = 0) -> HeadTimes:
    """``lm_head_times`` plus the TP collectives outside the transformer layers, per
    micro-batch (the bytes ``volumes.comm_bytes`` counts; Megatron's layout):

    - the vocab-parallel embedding leaves a TP region: forward all-reduce of ``b s h``
      (SP: reduce-scatter; its backward all-gathers the shard);
    - the LM head enters one: backward all-reduce of ``b s h`` (SP: forward all-gather,
      backward reduce-scatter);
    - the vocab-parallel cross entropy all-reduces ``CE_VALUES_PER_TOKEN`` fp32 values per
      token in as many calls (max, sum of exponentials, target logit).

    The embedding's collectives belong to the first stage; they are charged here with the
    LM head's, on the last one (one collective per micro-batch, next to the 2L/p per layer
    stage: a pipelined plan's first stage, which has no LM head, is rarely its slowest).
    ``tp_comm_overlap`` does not hide them. Groups as ``layer_parts`` (``base_rank``)."""
    head = lm_head_cost(model, topo, training, plan, device, base_rank)
    if not model.num_mtp_layers:
        return head
    block = layer_cost(model, topo, training, plan, device, moe=True, base_rank=base_rank)
    return with_mtp(model, training, plan, device, head, block)


def with_mtp(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, device: Device,
             head: HeadTimes, block: LayerCost) -> HeadTimes:
    """``head`` (``lm_head_cost``) plus the model's multi-token-prediction modules, given
    the cost of one MoE layer under the plan's recompute (``block``).

    DeepSeek-V3 sec 2.2 (Megatron places it on the last stage): each module concatenates two
    normed b*s*h inputs, projects 2h -> h (column-parallel), runs one MoE block and the
    shared output head with its loss."""
    if not model.num_mtp_layers:
        return head
    return HeadTimes(*(float(x) for x in mtp_columns(
        model.num_mtp_layers, mtp_projection_time(model, training, plan, device),
        (head.fwd, head.bwd, head.tp), (block.fwd, block.bwd, block.tp))))


def mtp_projection_time(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                        device: Device) -> float:
    """Forward seconds of one MTP module's 2h -> h projection (column-parallel), one
    micro-batch."""
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    return gemm_time(device, tokens, model.hidden_size / plan.tp, 2 * model.hidden_size)


def mtp_columns(n: int, proj_s: Any, head: tuple[Any, Any, Any], block: tuple[Any, Any, Any]
                ) -> tuple[Any, Any, Any]:
    """``with_mtp`` on numbers or arrays: (fwd, bwd, tp) of the head plus ``n`` MTP modules,
    from the head's and one MoE block's (fwd, bwd, tp) and the projection's seconds."""
    return (head[0] + n * (block[0] + proj_s + head[0]),
            head[1] + n * (block[1] + 2 * proj_s + head[1]),
            head[2] + n * (block[2] + head[2]))


def lm_head_cost(model: ModelSpec, topo: Topology, training: TrainingSpec, plan: ParallelPlan,
                 device: Device, base_rank: int = 0) -> HeadTimes:
    """The LM head, loss and their TP collectives (``head_times`` without MTP)."""
    head_f, head_b = lm_head_times(model, training, plan, device)
    t = plan.tp
    if t <= 1:
        return HeadTimes(head_f, head_b, 0.0)
    ranks = placed_group(plan, tuple(range(t)), base_rank)
    tokens = plan.micro_batch_size * training.seq_len / plan.cp
    act = tokens * model.hidden_size * training.compute_bytes
    ce = CE_VALUES_PER_TOKEN * coll.group_collective(topo, ranks, "all_reduce",
                                                     tokens * FP32_BYTES)
    reduce = gather = scatter = 0.0
    if plan.sequence_parallel:
        gather = coll.group_collective(topo, ranks, "all_gather", act)
        scatter = coll.group_collective(topo, ranks, "reduce_scatter", act)
        tp_f, tp_b = scatter + gather + ce, gather + scatter
    else:
        reduce = coll.group_collective(topo, ranks, "all_reduce", act)
        tp_f, tp_b = reduce + ce, reduce
    if dgrad_overlap_applies(training, plan):
        # The output layer is a column-parallel linear too: its backward collectives run
        # under its gradient GEMMs, each as long as the head's forward GEMM.
        tp_b = column_backward_exposed(
            gemm_time(device, tokens, model.vocab_size / t, model.hidden_size),
            sequence_parallel=plan.sequence_parallel, reduce_s=reduce, gather_s=gather,
            scatter_s=scatter, sms=device.nccl_slowdown)
    return HeadTimes(head_f + tp_f, head_b + tp_b, tp_f + tp_b)


def layer_cost(model: ModelSpec, topo: Topology, training: TrainingSpec, plan: ParallelPlan,
               device: Device, *, moe: bool, base_rank: int = 0) -> LayerCost:
    """One layer, one micro-batch, one rank: pass times incl. exposed TP/CP/EP communication
    and recomputation (``layer_parts`` composed under ``plan.recompute``), seconds."""
    return compose_layer_cost(layer_parts(model, topo, training, plan, device, moe=moe,
                                          base_rank=base_rank), plan.recompute)
