"""Where an MoE layer's tokens go: how many each rank dispatches, how many rows its expert
GEMMs see, and the memory traffic of routing them (token counts and elements; no times).

Megatron-Core runs an MoE layer on the sequence-parallel shard of the tokens: with tensor
parallelism the layer input is ``[s/tp, b, h]`` on every rank (sequence parallelism is
required with TP and EP, megatron/core/transformer/moe/token_dispatcher.py,
``MoEAlltoAllTokenDispatcher``: "hidden_states: 3D tensor [S/TP, B, H]"), and the experts
of one expert-tensor-parallel group of ``etp`` ranks all-gather their tokens after the
expert-parallel all-to-all ("MoE parallel folding", Liu et al. 2025, arXiv 2504.14960,
sec. 3). torchtitan does the same when EP borrows the TP ranks
(``ReordererSequenceParallel``: tokens split across TP ranks before dispatch).
"""

from __future__ import annotations

from math import comb
from typing import Any

import numpy as np

from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec


def a2a_overlap_warmup(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> float:
    """Activations the expert-parallel all-to-all overlap keeps live beyond the plain schedule,
    in model-chunk micro-batches (``pipeline.inflight_microbatches``' ``extra``): one layer's
    worth, ``overlap_extra(L, pp, v)``, when it runs (an MoE model,
    ``training.moe_a2a_overlap`` and ep > 1); else 0.

    Megatron-Core warms up one forward more under ``overlap_moe_expert_parallel_comm``
    (schedules.py ``num_warmup_microbatches += 1``; without pipelining, micro-batch 0's forward
    runs alone: combined_1f1b.py), but then runs each forward merged with the oldest live
    micro-batch's backward, layer i of the one beside layer L-1-i of the other, releasing the
    backward layer's state after each pair (model_chunk_schedule_plan.py
    ``TransformerModelChunkSchedulePlan.run``). So the micro-batches live before each merged
    step are as many as the plain schedule's peak, and the step adds at most one layer on top.
    Measured: Qwen3-30B-A3B on 16 H100 (EP 16, pp 1, micro-batch 1, seq 4096) peaks at
    62.2 GiB allocated with the overlap (Megatron-Bridge
    skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md, 2026-07-25 benchmark), where a
    whole extra micro-batch of activations would not fit in 80 GiB."""
    if not (model.is_moe and training.moe_a2a_overlap and plan.ep > 1):
        return 0.0
    v = plan.virtual_stages if plan.schedule == "interleaved" else 1
    return float(overlap_extra(model.num_layers, plan.pp, v))


def overlap_extra(num_layers: Any, pp: Any, v: Any) -> Any:
    """One layer of a model chunk (``num_layers / (pp v)`` layers), in chunk micro-batches
    (numbers or numpy arrays)."""
    return 1.0 / np.maximum(1.0, num_layers / (pp * v))


def sp_split(plan: ParallelPlan) -> int:
    """How many ways the MoE layer's input tokens are split over the TP ranks: ``tp`` under
    sequence parallelism; 1 without it, when every TP rank holds (and routes) all of them.
    Megatron-Core refuses MoE with tp > 1 and no sequence parallelism in training
    (moe_layer.py, core_v0.15.3 L265: ``can.moe_tp_needs_sp``)."""
    return plan.tp if plan.sequence_parallel else 1


def etp_gather(plan: ParallelPlan) -> int:
    """Ranks whose tokens an expert-TP group gathers: ``etp`` when the tokens are split
    (sequence parallelism), 1 when every rank already holds them all."""
    return plan.expert_tp if plan.sequence_parallel else 1


def routed_copies_per_token(model: ModelSpec, plan: ParallelPlan) -> float:
    """Routed rows one rank's experts hold per token of the layer's ``b s / cp`` (mean load):
    ``g T k`` rows over ``T sp_split`` tokens, ``k etp / tp`` under sequence parallelism and
    ``k`` without; each row is ``h`` wide at the expert's input and ``ffn / etp`` inside."""
    return model.moe_top_k * etp_gather(plan) / sp_split(plan)


def dispatch_tokens(training: TrainingSpec, plan: ParallelPlan) -> float:
    """Tokens one rank routes into each MoE layer per micro-batch: ``b s / (cp tp)`` under
    sequence parallelism (``sp_split``)."""
    return plan.micro_batch_size * training.seq_len / (plan.cp * sp_split(plan))


def expert_rows(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> float:
    """Rows one local expert's GEMMs process per micro-batch on the busiest rank.

    The expert-model-parallel group of ``ep`` x ``etp`` ranks holds ``ep * g * T`` distinct
    tokens (``T = dispatch_tokens``, ``g = etp_gather``); their ``k`` copies spread over ``E``
    experts, and each expert's rows are processed by all ``etp`` ranks of its expert-TP group
    (each with ``1/etp`` of the expert's width): ``ep * g * T * k / E`` on average, times
    ``load_factor``.
    """
    return (plan.ep * etp_gather(plan) * dispatch_tokens(training, plan) * model.moe_top_k
            / model.num_experts * load_factor(training, plan))


def load_factor(training: TrainingSpec, plan: ParallelPlan) -> float:
    """Routed rows on the busiest rank over the mean: the capacity factor when experts are
    padded to capacity (``--moe-pad-expert-input-to-capacity``: every expert runs ``c`` times
    its mean rows, and no more), else ``training.moe_load_imbalance`` (dropless)."""
    return plan.moe_capacity_factor or training.moe_load_imbalance


def permute_elements_per_token(model: ModelSpec, plan: ParallelPlan, *,
                               eager: bool) -> float:
    """Elements read plus written per dispatched token to route it to its top-k experts and
    back (one MoE layer, forward), outside the GEMMs and the all-to-all.

    Fused (Megatron's ``moe_permute_fusion`` / Transformer Engine): permute reads the token
    and writes its k copies, unpermute reads the k expert outputs with their probabilities
    and writes one token: 2h + 2kh. Eager (index ops, as in the executor and unfused
    dispatchers): five gathers/scatters of the k copies (dispatch, gather for each expert,
    scatter of its output, combine gather, probability scale) each read and write k*h, then
    a scatter-add into a zeroed output (h zeros, k*h reads, h writes): 11kh + 2h; padded
    capacity buffers (``moe_capacity_factor`` c) are zero-filled twice (dispatch buffer and
    expert output): 2ckh more.
    """
    h, k = model.hidden_size, model.moe_top_k
    if not eager:
        return 2.0 * h + 2.0 * k * h
    padded = 2.0 * plan.moe_capacity_factor * k * h if plan.moe_capacity_factor else 0.0
    return 11.0 * k * h + 2.0 * h + padded


def sort_elements_per_token(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan
                            ) -> float:
    """Elements read plus written per dispatched token (``dispatch_tokens``) to sort the rows
    a rank receives by local expert after the dispatch all-to-all, and back before the
    combine.

    Megatron-Core's all-to-all dispatcher receives its rows grouped by source rank and, when a
    rank holds more than one expert, copies them into expert order ("Permutation 2",
    ``MoEAlltoAllTokenDispatcher.dispatch_postprocess``) and back ("Unpermutation 2",
    ``combine_preprocess``), both through ``moe_utils.sort_chunks_by_idxs`` (core_v0.15.0 to
    core_v0.19.0; with ``moe_pad_expert_input_to_capacity`` a ``transpose().contiguous()`` of
    the padded buffer, the same bytes). Each pass reads and writes every received row, ``h``
    wide: ``4 h`` per routed row, ``k`` rows per token gathered over the expert-TP group
    (``etp_gather``), times ``load_factor``. Per dispatched token, so that the sort reads
    the plan only through ``a2a_shape`` (as the all-to-all does). torchtitan's all-to-all
    path does the same with index gathers. The
    flex dispatchers (DeepEP, HybridEP: ``hierarchical``) return rows ready to permute per
    expert (``permute_elements_per_token`` counts that permute), and an eager stack's count
    already holds its per-expert gathers and scatters; neither adds this."""
    if (training.moe_dispatcher != "alltoall" or training.kernels == "eager"
            or model.num_experts // plan.ep <= 1):
        return 0.0
    return (4.0 * model.hidden_size * model.moe_top_k * etp_gather(plan)
            * load_factor(training, plan))


def expert_shape(training: TrainingSpec, plan: ParallelPlan) -> tuple:
    """Everything of the plan ``layer_terms.routed_terms`` reads: ep, expert TP, the expert-TP
    gather (``etp_gather``), the sequence-parallel split (``sp_split``), the tokens each rank
    routes (``dispatch_tokens``), the capacity factor and whether ZeRO >= 2 (no accumulation
    pass); plans with equal shapes have equal routed-expert costs."""
    return (plan.ep, plan.expert_tp, etp_gather(plan), sp_split(plan),
            dispatch_tokens(training, plan), plan.moe_capacity_factor, plan.zero_stage >= 2)


def a2a_shape(training: TrainingSpec, plan: ParallelPlan) -> tuple:
    """Everything of the plan ``layer_a2a_time`` reads (placed from rank 0): ep, expert TP,
    the expert-TP gather (``moe.etp_gather``), the tokens each rank routes
    (``moe.dispatch_tokens``), the capacity factor and the placement; plans with equal
    shapes have equal all-to-alls (and equal sorts by local expert, ``sort_elements_per_token``
    per dispatched token), so a search prices each shape once."""
    return (plan.ep, plan.expert_tp, etp_gather(plan),
            dispatch_tokens(training, plan), plan.moe_capacity_factor,
            None if plan.placement is None else tuple(plan.placement))


def dispatch_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> float:
    """Bytes the busiest rank moves in one all-to-all (dispatch or combine) of one MoE layer:
    ``T k`` token copies of width ``h`` (times ``training.moe_load_imbalance``, the share it
    receives in dispatch and sends back in combine), or the padded capacity when a capacity
    factor is set (padding caps the load: no imbalance on top)."""
    return (dispatch_tokens(training, plan) * model.moe_top_k * model.hidden_size
            * training.compute_bytes * load_factor(training, plan))


def other_groups_hit(model: ModelSpec, groups: int) -> float:
    """Expected number of the other ``groups`` a token's top-k experts sit in, when the ``E``
    experts are laid out in order over ``groups`` equal blocks (the nodes, or the ranks, of
    the expert-parallel group) and routing is balanced (each token picks k distinct experts
    uniformly: the forced balance NVIDIA's benchmarks use; Megatron's
    ``--moe-router-force-load-balancing`` keeps group-limited routing).

    Plain top-k: a block holds ``E/N`` experts and a token misses it with probability
    ``C(E - E/N, k) / C(E, k)`` (hypergeometric), so it reaches ``(N - 1)`` times the
    complement. Group-limited routing (DeepSeek-V3 sec. 2.1.2: 8 groups, 4 per token, "each
    token will be sent to at most M nodes") picks ``g`` of ``G`` router groups first and its
    experts among theirs: with ``G/N`` whole router groups per block, a block is hit when
    some of its router groups are picked and a chosen expert falls in them; with a router
    group spread over ``N/G`` blocks, when its group is picked and an expert falls in the
    block. Other layouts are counted as plain top-k."""
    if groups <= 1:
        return 0.0
    e, k = model.num_experts, model.moe_top_k
    rgroups, pick = model.moe_router_groups, model.moe_router_group_topk
    if rgroups is None or pick is None or (rgroups % groups and groups % rgroups):
        return (groups - 1) * (1.0 - comb(e - e // groups, k) / comb(e, k))
    per_group = e // rgroups
    pool = pick * per_group  # experts a token chooses from once its groups are picked
    if rgroups % groups == 0:
        q = rgroups // groups  # whole router groups per block
        hit = sum(comb(q, i) * comb(rgroups - q, pick - i) / comb(rgroups, pick)
                  * (1.0 - comb(pool - i * per_group, k) / comb(pool, k))
                  for i in range(1, min(q, pick) + 1))
    else:
        hit = pick / rgroups * (1.0 - comb(pool - e // groups, k) / comb(pool, k))
    return (groups - 1) * hit
