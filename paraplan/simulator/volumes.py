"""Exact communication volumes: the payload bytes each rank hands to each kind of collective
in one optimizer step of a plan.

The step-time model (``step.py``) prices collectives; this module counts them, call by call,
for the Megatron-style implementation that ``paraplan.executor`` runs, so a real run's
counted bytes can be checked against the simulator exactly (``paraplan validate-executor``).

Counting contract (the one ``paraplan.executor.comm.Comm`` counts by): one count per call
on every rank that takes part, the payload of ONE tensor: ``all_reduce`` the reduced tensor,
``all_gather`` the input shard, ``reduce_scatter`` the full (unsharded) input,
``all_to_all`` the input, ``p2p_send`` each sent tensor (sender only). A group of one rank
moves nothing. Wire bytes (e.g. 2(n-1)/n x payload for a ring all-reduce) are the cost
model's business, not this module's.

What is communicated (Shoeybi et al. 2019 for TP, Korthikanti et al. 2022 Fig. 5 for SP,
Narayanan et al. 2021 for PP, Rajbhandari et al. 2020 for ZeRO-1, GShard for EP), per
micro-batch ``b x s`` tokens of width ``h``, ``e`` bytes per element:

- TP, per dense layer: the attention and the MLP each enter a TP region once and leave it
  once: without SP 2 all-reduces of ``b s h`` forward (leaving) and 2 backward (entering);
  with SP, entering all-gathers the ``b (s/t) h`` shard (backward: reduce-scatter of
  ``b s h``) and leaving reduce-scatters ``b s h`` (backward: all-gather of the shard). An MoE
  layer's experts sit outside TP (whole on every TP rank), so only its attention counts.
  The vocab-parallel embedding leaves a region (forward), the LM head enters one (its
  backward); the vocab-parallel cross-entropy all-reduces 3 fp32 values per token (max,
  sum of exponentials, target logit; Megatron ``vocab_parallel_cross_entropy``). With SP
  the gradients of tensors every TP rank holds whole (norms, row-parallel biases, learned
  positions, MoE routers and experts) are partial sums and are all-reduced over TP once per
  step (Megatron's layernorm-gradient all-reduce).
- PP: every micro-batch sends its ``b s_loc h`` activation forward and its gradient
  backward at every stage boundary (``s_loc = s/t`` under SP; full tensors otherwise, as
  Megatron-Core).
- EP, per MoE layer and micro-batch: one all-to-all of the ``E`` int64 routing counts, the
  dispatch and combine all-to-alls forward and their transposes backward, each of
  ``cf x T k`` rows of width ``h`` (``T = b s_loc`` local tokens, top-k ``k``;
  ``cf = plan.moe_capacity_factor``, None = 1: exactly the routed rows).
- DP, once per step over the flat gradient buffer (``P`` parameters this rank holds; the
  ``dp`` group for dense tensors, the ``dp/ep`` ranks holding the same experts for expert
  tensors): all-reduce of ``P`` gradient elements (ZeRO 0); reduce-scatter of ``P'`` and
  all-gather of ``P'/n`` elements with ``P' = ceil(P/n) n`` (ZeRO-1, padded to the group
  size ``n``). Divided by ``dp_sync_interval`` and ``grad_compression_ratio`` as the time
  model does.

Plans this module does not count (it raises ValueError naming the field): cp > 1,
virtual_stages > 1, zero_stage 2/3, recompute, etp > 1, placement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paraplan.simulator.memory import moe_layers_in
from paraplan.simulator.step import CE_VALUES_PER_TOKEN, FP32_BYTES, even_split
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

KINDS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                          "p2p_send")
INDEX_BYTES = 8  # int64 routing counts


@dataclass(frozen=True)
class RankParams:
    """Parameters one rank holds (counts, not bytes)."""

    dense: int
    """Non-expert tensors (TP shards and TP-replicated tensors, routers included)."""
    experts: int
    """Expert tensors (whole experts, E/ep per MoE layer)."""
    tp_replicated: int
    """Of dense + experts, the tensors every TP rank holds whole (partial gradients under
    SP): norms, row-parallel biases, learned positions, routers, experts."""


def unsupported(plan: ParallelPlan) -> list[str]:
    """Why ``comm_bytes`` cannot count ``plan`` (empty when it can)."""
    out = []
    for field, value, ok in (("cp", plan.cp, 1), ("virtual_stages", plan.virtual_stages, 1)):
        if value != ok:
            out.append(f"{field}={value} is not counted (use {ok})")
    if plan.zero_stage > 1:
        out.append(f"zero_stage={plan.zero_stage} is not counted (use 0 or 1)")
    if plan.recompute != "none":
        out.append(f"recompute={plan.recompute!r} is not counted (use 'none')")
    if plan.etp not in (None, 1):
        out.append(f"etp={plan.etp} is not counted (experts are whole on every TP rank)")
    if plan.placement is not None:
        out.append("placement is not counted (rank order only)")
    if plan.grad_compression != "none" or plan.activation_compression_bits is not None:
        out.append("compressed gradients or activations are not counted (the executor sends "
                   "them dense)")
    return out


def rank_params(model: ModelSpec, plan: ParallelPlan, stage_layers: list[int],
                stage: int) -> RankParams:
    """Exact parameter counts of one rank of ``stage`` (Megatron TP sharding: column-parallel
    QKV / fc1 / LM head and vocab-parallel embedding split their outputs, row-parallel O /
    fc2 their inputs; their biases stay whole; experts are not TP-split)."""
    t, h = plan.tp, model.hidden_size
    if model.attention.latent_width or model.qk_norm or model.attention_sinks:
        raise ValueError("exact per-rank counts cover standard attention only (no MLA, "
                         "q/k norms or sinks)")
    d = model.head_size
    q_out, kv_out = model.num_attention_heads * d, model.kv_heads * d
    attn_sharded = (h * q_out + 2 * h * kv_out + q_out * h) // t
    attn_repl = 0
    if model.use_bias:
        attn_sharded += (q_out + 2 * kv_out) // t
        attn_repl = h
    elif model.qkv_bias:
        attn_sharded += (q_out + 2 * kv_out) // t
    mats = model.mlp_matrices
    mlp_sharded = mats * h * model.ffn_hidden_size // t
    mlp_repl = 0
    if model.use_bias:
        mlp_sharded += (mats - 1) * model.ffn_hidden_size // t
        mlp_repl = h
    norms = model.norm_params_per_layer
    n = stage_layers[stage]
    n_moe = moe_layers_in(model, sum(stage_layers[:stage]), n)
    n_dense = n - n_moe
    dense = n * (attn_sharded + attn_repl + norms) + n_dense * (mlp_sharded + mlp_repl)
    repl = n * (attn_repl + norms) + n_dense * mlp_repl
    experts = 0
    if n_moe:
        router = model.router_params
        per_expert = model.expert_params
        experts = n_moe * (model.num_experts // plan.ep) * per_expert
        dense += n_moe * router
        repl += n_moe * router + experts
        if model.num_shared_experts:
            raise ValueError("shared experts are not counted")
    if stage == 0:
        dense += model.vocab_size * h // t
        extra = model.embedding_params - model.vocab_size * h
        dense += extra
        repl += extra
    if stage == len(stage_layers) - 1:
        final_norm = model.lm_head_params - (0 if model.tie_word_embeddings
                                             else model.vocab_size * h)
        head = 0 if (model.tie_word_embeddings and len(stage_layers) == 1) else \
            model.vocab_size * h // t
        dense += head + final_norm
        repl += final_norm
    return RankParams(dense, experts, repl)


def comm_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, num_gpus: int,
               rank: int = 0) -> dict[str, int]:
    """Payload bytes per collective kind that global ``rank`` moves in one optimizer step.

    Ranks are in Megatron order (tp fastest): ``rank = tp_r + tp * (dp_r + dp * pp_r)``.

    Args:
        model, training, plan: the run; ``plan.dp`` None = ``num_gpus / (tp * pp)``.
        num_gpus: world size.
        rank: the rank to count (ranks of one stage move the same bytes).

    Returns:
        ``{kind: bytes}`` for every kind in ``KINDS`` (module docstring: what is counted).

    Raises:
        ValueError: a plan field this module does not count (see ``unsupported``), or a
            rank outside the world, or a global batch that does not split into
            micro-batches.
    """
    problems = unsupported(plan)
    if problems:
        raise ValueError("comm_bytes: " + "; ".join(problems))
    t, p = plan.tp, plan.pp
    dp = plan.resolved_dp(num_gpus)
    world = dp * t * p
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} is outside the world of {world} ranks")
    if training.global_batch_size % (dp * plan.micro_batch_size):
        raise ValueError(f"global_batch_size={training.global_batch_size} is not a multiple "
                         f"of dp * micro_batch_size = {dp * plan.micro_batch_size}")
    stage = rank // (dp * t)  # every replica of a stage moves the same bytes
    m = training.global_batch_size // (dp * plan.micro_batch_size)
    layers = plan.layers_per_stage or even_split(model.num_layers, p)
    params = rank_params(model, plan, layers, stage)
    n_moe = moe_layers_in(model, sum(layers[:stage]), layers[stage])
    n_dense = layers[stage] - n_moe
    first, last = stage == 0, stage == p - 1
    e = training.compute_bytes
    b, s, h = plan.micro_batch_size, training.seq_len, model.hidden_size
    sp = plan.sequence_parallel and t > 1
    s_loc = s // t if sp else s
    act = b * s * h * e  # one full micro-batch activation
    shard = b * s_loc * h * e
    out = dict.fromkeys(KINDS, 0)

    # ---- tensor parallelism, per micro-batch -------------------------------------------
    if t > 1:
        regions = 2 * n_dense + n_moe  # TP regions entered (and left) per forward
        if sp:
            # The blocks' gathers in fp8 where the trainer quantizes first (fp8_tp_gather).
            q = training.tp_gather_bytes / e
            out["all_gather"] += m * (2 * regions * shard * q + first * shard + last * shard)
            out["reduce_scatter"] += m * (2 * regions * act + first * act + last * act)
        else:
            out["all_reduce"] += m * (2 * regions * act + first * act + last * act)
        if last:
            out["all_reduce"] += m * CE_VALUES_PER_TOKEN * b * s * FP32_BYTES
        if sp:  # partial gradients of TP-replicated tensors, once per step
            out["all_reduce"] += params.tp_replicated * training.grad_reduce_bytes

    # ---- pipeline p2p ------------------------------------------------------------------
    out["p2p_send"] += m * shard * ((not last) + (not first))

    # ---- expert parallelism --------------------------------------------------------------
    if n_moe and plan.ep > 1:
        cf = plan.moe_capacity_factor or 1.0
        rows = cf * b * s_loc * model.moe_top_k
        if rows != int(rows):
            raise ValueError(f"moe_capacity_factor={cf} gives {rows} rows per all-to-all; "
                             "it must be a whole number")
        per_layer = INDEX_BYTES * model.num_experts + 4 * int(rows) * h * e
        out["all_to_all"] += m * n_moe * per_layer

    # ---- data parallelism, once per step -------------------------------------------------
    edp = dp // plan.ep if params.experts else 1
    g = training.grad_reduce_bytes / plan.grad_compression_ratio / plan.dp_sync_interval
    for count, n in ((params.dense, dp), (params.experts, edp)):
        if n <= 1 or count == 0:
            continue
        if plan.zero_stage == 0:
            out["all_reduce"] += round(count * g)
        else:
            padded = math.ceil(count / n) * n
            out["reduce_scatter"] += round(padded * g)
            out["all_gather"] += round(padded // n * e / plan.dp_sync_interval)
    return {k: int(v) for k, v in out.items()}
