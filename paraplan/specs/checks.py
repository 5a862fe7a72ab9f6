"""Plan legality: every rule a plan breaks, each as a plain-English reason with a fix.

Rules mirror what the trainers assert at start-up (Megatron-LM ``arguments.py``: heads and
query groups divisible by TP, ``seq_length % (2*cp) == 0``, sequence parallel needs TP > 1,
interleaving needs PP > 1, global batch divisible by micro-batch x DP; torchtitan
``ParallelDims``: degrees multiply to the world size).
"""

from __future__ import annotations

from math import gcd

from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Positive divisors of n (up to ``limit``), ascending."""
    out = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    out = sorted(set(out + [n // d for d in out]))
    return [d for d in out if limit is None or d <= limit]


def _fmt(values: list[int], cap: int = 12) -> str:
    shown = values[:cap]
    return "{" + ", ".join(str(v) for v in shown) + (", ...}" if len(values) > cap else "}")


def check_plan(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: ParallelPlan
) -> list[str]:
    """Return every violated rule as a reason naming the field, value, rule and a fix.

    The rules that need only the world size (``check_plan_on_world``, on the cluster's GPU
    count), then those of the cluster itself: the placement, TP groups inside a node, and
    the precision every GPU type supports. An empty list means the plan is structurally
    legal (memory is checked by the simulator).
    """
    n_gpus = cluster.num_gpus
    min_gpn = min(g.gpus_per_node for g in cluster.node_groups)
    reasons = check_plan_on_world(model, training, plan, n_gpus,
                                  where=f"the cluster's {n_gpus} GPUs",
                                  tp_cap=None if plan.allow_cross_node_tp else min_gpn,
                                  stage_cap=n_gpus)

    # Placement (rank -> GPU): a permutation of the cluster's GPUs; TP groups stay in a node.
    if plan.placement is not None:
        if sorted(plan.placement) != list(range(n_gpus)):
            reasons.append(
                f"placement has {len(plan.placement)} entries; it must list each of the "
                f"cluster's {n_gpus} GPUs (0..{n_gpus - 1}) exactly once, one per rank"
            )
        elif plan.tp > 1 and not plan.allow_cross_node_tp:
            node = cluster.topology.node_of_gpu
            for start in range(0, n_gpus, plan.tp):
                gpus = plan.placement[start:start + plan.tp]
                if len({int(node[g]) for g in gpus}) > 1:
                    reasons.append(
                        f"placement puts TP group of ranks {start}..{start + plan.tp - 1} on "
                        f"GPUs {gpus} in different nodes; keep each TP group in one node "
                        "(or set allow_cross_node_tp)"
                    )
                    break

    # TP groups inside a node.
    if plan.tp > min_gpn and not plan.allow_cross_node_tp:
        reasons.append(
            f"tp={plan.tp} exceeds the {min_gpn} GPUs per node, so TP traffic would cross the "
            f"slow inter-node network; use tp <= {min_gpn} (or set allow_cross_node_tp=true)"
        )
    elif min_gpn % plan.tp and not plan.allow_cross_node_tp:
        reasons.append(
            f"tp={plan.tp} does not divide the {min_gpn} GPUs per node, so some TP groups "
            f"would straddle nodes; use tp in {_fmt(divisors(min_gpn))}"
        )

    # Precision supported by every GPU type.
    for group in cluster.node_groups:
        if training.precision not in group.gpu.peak_tflops:
            have = sorted(group.gpu.peak_tflops)
            reasons.append(
                f"precision={training.precision} is not supported by {group.gpu.name} "
                f"(it has {', '.join(have)}); use precision="
                + ("fp16" if "fp16" in have else have[0])
            )
            break
    return reasons


def check_plan_on_world(
    model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, world: int, *,
    where: str | None = None, tp_cap: int | None = None, stage_cap: int | None = None
) -> list[str]:
    """The rules of ``check_plan`` that need only the world size (``world`` GPUs, no cluster):
    degrees vs the world, heads and widths vs TP, layers vs pipeline stages, experts, the
    batch and context parallelism. What a trainer asserts at start-up, so a plan JSON loaded
    without its cluster (``paraplan export``) is held to the same rules.

    Args:
        where: how messages name the world (default ``"the world size N"``).
        tp_cap: largest TP suggested in fixes (the GPUs per node), None = no cap.
        stage_cap: largest pp*vpp suggested in fixes, None = no cap.
    """
    reasons: list[str] = []
    where = where or f"the world size {world}"
    mp = plan.model_parallel_size

    # World size (torchtitan ParallelDims._validate).
    if plan.dp is not None:
        if plan.dp * mp != world:
            reasons.append(
                f"dp*tp*pp*cp = {plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.dp * mp} "
                f"does not equal {where}; "
                + (f"use dp={world // mp}" if world % mp == 0 else "change tp, pp or cp")
            )
    elif world % mp:
        reasons.append(
            f"tp*pp*cp = {mp} does not divide {where}, so dp cannot be "
            f"derived; choose tp*pp*cp in {_fmt(divisors(world))}"
        )
    dp = plan.resolved_dp(world)

    # Tensor parallel vs heads (Megatron: num_attention_heads % tp == 0 and
    # num_query_groups % tp == 0).
    heads, kv = model.num_attention_heads, model.kv_heads
    if heads % plan.tp:
        reasons.append(
            f"tp={plan.tp} does not divide num_attention_heads={heads}; use tp in "
            f"{_fmt(divisors(heads, tp_cap))}"
        )
    elif kv % plan.tp:
        reasons.append(
            f"tp={plan.tp} does not divide num_kv_heads={kv} (grouped-query attention needs "
            f"whole KV heads per rank); use tp in {_fmt(divisors(gcd(heads, kv), tp_cap))}"
        )
    if model.ffn_hidden_size % plan.tp:
        reasons.append(
            f"tp={plan.tp} does not divide ffn_hidden_size={model.ffn_hidden_size}; use tp in "
            f"{_fmt(divisors(model.ffn_hidden_size, tp_cap))}"
        )
    if plan.sequence_parallel and plan.tp == 1:
        reasons.append("sequence_parallel=true needs tp > 1; set sequence_parallel=false or tp>1")

    # Pipeline: layers vs stages.
    chunks = plan.pp * plan.virtual_stages
    if plan.layers_per_stage is not None:
        total = sum(plan.layers_per_stage)
        if total != model.num_layers:
            reasons.append(
                f"layers_per_stage sums to {total} but the model has num_layers="
                f"{model.num_layers}; make the entries add up to {model.num_layers}"
            )
        # Megatron-Core lays the embedding and the loss out as a pipeline layer each
        # (account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split,
        # transformer_block.py get_num_layers_to_build), so with interleaving the first and the
        # last model chunk may hold no decoder layer (Llama 3.1 405B's recipe at pp=16, vpp=8:
        # [embedding] + 126 x [1] + [loss]); every other chunk, and every rank, needs one.
        split, v = plan.layers_per_stage, plan.virtual_stages
        inner = split[1:-1] if v > 1 else split
        ranks = [sum(split[c * plan.pp + r] for c in range(v)) for r in range(plan.pp)] \
            if len(split) == plan.pp * v else split
        if any(n == 0 for n in inner) or not all(ranks):
            reasons.append("layers_per_stage has an empty stage (0 layers); give every stage >= 1"
                           " (with virtual_stages > 1 only the first and last chunk may be empty)")
    elif model.num_layers % chunks:
        ok = divisors(model.num_layers, stage_cap)
        reasons.append(
            f"pp*virtual_stages = {plan.pp}*{plan.virtual_stages} = {chunks} does not divide "
            f"num_layers={model.num_layers}; use pp*virtual_stages in {_fmt(ok)} or give "
            "layers_per_stage for an uneven split"
        )
    if plan.pp > model.num_layers:
        reasons.append(f"pp={plan.pp} exceeds num_layers={model.num_layers}; use pp <= "
                       f"{model.num_layers}")
    if plan.schedule == "interleaved" and plan.virtual_stages < 2:
        reasons.append("schedule=interleaved needs virtual_stages >= 2; set vpp=2 or more, or "
                       "use schedule=1f1b")
    if plan.virtual_stages > 1 and plan.schedule != "interleaved":
        reasons.append(f"virtual_stages={plan.virtual_stages} needs schedule=interleaved "
                       f"(got {plan.schedule})")
    if plan.virtual_stages > 1 and plan.pp == 1:
        reasons.append(f"virtual_stages={plan.virtual_stages} (interleaving) needs pp > 1; "
                       "set vpp=1 or pp>1")

    # Experts.
    etp = plan.expert_tp
    if plan.ep > 1 and not model.is_moe:
        reasons.append(f"ep={plan.ep} but {model.name} has no experts; use ep=1")
    if model.is_moe:
        if model.num_experts % plan.ep:
            reasons.append(
                f"ep={plan.ep} does not divide num_experts={model.num_experts}; use ep in "
                f"{_fmt(divisors(model.num_experts))}"
            )
        if (plan.tp * plan.cp * dp) % (plan.ep * etp):
            reasons.append(
                f"ep*etp = {plan.ep}*{etp} does not divide tp*cp*dp = {plan.tp * plan.cp * dp}"
                " (experts are placed inside the data/context/tensor-parallel ranks of a stage);"
                " lower ep or raise dp"
            )
        if model.expert_ffn % etp:
            reasons.append(f"etp={etp} does not divide the expert width {model.expert_ffn}")
    elif plan.etp not in (None, plan.tp):
        reasons.append(f"etp={plan.etp} only applies to MoE models; leave it unset")

    # Batch (Megatron: global_batch_size % (micro_batch_size * dp) == 0).
    per_step = plan.micro_batch_size * dp
    if training.global_batch_size % per_step:
        ok = [m for m in divisors(max(1, training.global_batch_size // dp))
              if training.global_batch_size % (m * dp) == 0]
        reasons.append(
            f"global_batch_size={training.global_batch_size} is not divisible by "
            f"micro_batch_size*dp = {plan.micro_batch_size}*{dp} = {per_step}; "
            + (f"use micro_batch_size in {_fmt(ok)}" if ok and training.global_batch_size >= dp
               else f"use a global batch that is a multiple of dp={dp}")
        )

    # Context parallel (Megatron: seq_length % (2 * cp) == 0 for load-balanced causal CP).
    if plan.cp > 1 and training.seq_len % (2 * plan.cp):
        ok = [c for c in divisors(training.seq_len) if training.seq_len % (2 * c) == 0]
        reasons.append(
            f"cp={plan.cp} needs seq_len divisible by 2*cp={2 * plan.cp}; seq_len="
            f"{training.seq_len}; "
            + (f"use cp in {_fmt(ok)}" if ok else f"use an even seq_len (a multiple of "
                                                  f"{2 * plan.cp} for cp={plan.cp})")
        )
    return reasons


def validate_plan(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: ParallelPlan
) -> None:
    """Raise SpecError listing every violated rule (no-op for a legal plan)."""
    reasons = check_plan(model, cluster, training, plan)
    if reasons:
        raise SpecError("; ".join(reasons), field="plan", value=plan.short(), allowed=reasons)
