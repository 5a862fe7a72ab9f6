"""Compose compute, communication, pipeline and memory into one StepReport.

Rank layout (Megatron-LM default order tp-cp-dp-pp, tp fastest):
``rank = tp_r + tp*(cp_r + cp*(dp_r + dp*pp_r))``; experts use ``etp_r + etp*(ep_r + ...)``.
Step time = pipeline span (forward/backward of every micro-batch incl. exposed TP/CP/EP
communication, bubble, p2p) + exposed DP gradient synchronisation + ZeRO-3 gathers not hidden
by compute + optimizer step. All times in seconds, memory in GiB (2^30 bytes).

The StepReport type lives in ``simulator.report`` and the per-layer costs in
``simulator.layer``; both are re-exported here, where callers have always found them."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from paraplan.simulator import collectives as coll
from paraplan.simulator.compression import effective_grad_bytes, pp_ratio, savings, uses_knobs
from paraplan.simulator.compute import Device
from paraplan.simulator.copies import ddp_autocast_bytes_per_param, fsdp_copy_bytes_per_param
from paraplan.simulator.dp_sync import (
    bucketed_grad_sync,
    exposed_grad_sync,
    grad_sync_parts,
    overlapped_grad_sync,
    tied_embedding_sync,
)
from paraplan.simulator.flops import hardware_flops_per_step, model_flops_per_step
from paraplan.simulator.grads import optimizer_step_time
from paraplan.simulator.layer import (
    CE_VALUES_PER_TOKEN,
    FP32_BYTES,
    HeadTimes,
    LayerCost,
    LayerParts,
    compose_layer_cost,
    head_times,
    layer_cost,
    layer_parts,
    placed_group,
    unpartnered_share,
)
from paraplan.simulator.memory import (
    GiB,
    StageMemory,
    dp_bucket_elements,
    moe_layers_in,
    params_per_stage,
    pipeline_memory,
)
from paraplan.simulator.moe import a2a_overlap_warmup
from paraplan.simulator.pipeline import (
    inflight_microbatches,
    overlapped_p2p,
    pipeline_time,
    simulate_pipeline,
)
from paraplan.simulator.report import (
    MEMORY_KEYS,
    STEP_PARTS,
    TIME_KEYS,
    StepReport,
    gib,
    infeasible,
)
from paraplan.simulator.selective_ac import rerun_skips_down_projection
from paraplan.simulator.stages import even_split, plan_chunks, stage_gpu_types
from paraplan.simulator.variability import slowest_part_pace
from paraplan.specs.checks import check_plan
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.loaders import load_trainer
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec, apply_trainer, trainer_reasons
from paraplan.specs.training import TrainingSpec

__all__ = [
    "CE_VALUES_PER_TOKEN", "FP32_BYTES", "HeadTimes", "LayerCost", "LayerParts", "MEMORY_KEYS",
    "STEP_PARTS", "StepReport", "TIME_KEYS", "bucketed_grad_sync", "compose_layer_cost",
    "even_split", "gib", "head_times", "infeasible", "layer_cost", "layer_parts",
    "placed_group", "plan_chunks", "simulate", "stage_gpu_types",
]


@lru_cache(maxsize=4096)
def _pipeline_span(schedule: str, t_f: tuple[float, ...], t_b: tuple[float, ...], m: int, v: int,
                   t_w: tuple[float, ...], t_p2p: float) -> tuple[float, float]:
    """(total, critical p2p) seconds of the event simulation; memoized because searches
    re-simulate plans that differ only in fields the pipeline does not see (ZeRO stage, or
    dp/cp/micro-batch swaps that keep per-rank work), and the simulation is O(p m v)."""
    tl = simulate_pipeline(schedule, t_f, t_b, m, v=v, t_w=t_w, t_p2p=t_p2p,
                           record_events=False)
    return tl.total_s, tl.critical_p2p_s


def simulate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
             plan: ParallelPlan, *, time_if_oom: bool = False,
             trainer: TrainerSpec | str | None = None,
             job_gpus: int | None = None) -> StepReport:
    """Simulate one training step of ``plan``; infeasible plans say why in ``reasons``.

    Args:
        time_if_oom: still report times for a plan that does not fit in memory (``feasible``
            stays False and ``reasons`` says by how much); used when validating against runs
            that are known to have fit.
        trainer: price the plan as this trainer runs it (a profile name, YAML path or
            TrainerSpec: its TP/DP overlap, gradient-reduction dtype, dropout and kernels,
            except fields the plan or training set explicitly); a plan the trainer cannot
            express is infeasible and the reasons say why. None prices the plan as written.
        job_gpus: the GPUs the whole job synchronises every step, where this call prices one
            part of a larger job (the data ILP's per-type replica groups); their slowest sets
            the compute pace (``variability``). None: the plan's world size on ``cluster``.
    """
    if trainer is None:
        return _simulate(model, cluster, training, plan, time_if_oom, job_gpus)
    spec = trainer if isinstance(trainer, TrainerSpec) else load_trainer(trainer)
    training, plan = apply_trainer(spec, training, plan)
    dp = plan.resolved_dp(cluster.num_gpus)
    per_step = dp * plan.micro_batch_size
    m = training.global_batch_size // per_step if training.global_batch_size % per_step == 0 \
        else None
    cannot = trainer_reasons(spec, model, training, plan, m, dp=dp)
    if cannot:
        report = infeasible(plan, check_plan(model, cluster, training, plan) + cannot)
    else:
        report = _simulate(model, cluster, training, plan, time_if_oom, job_gpus)
    report.extra["trainer"] = spec.name
    if training.moments_dtype != "fp32":  # a run setting its plan JSON and exports carry
        report.extra["moments_dtype"] = training.moments_dtype
    if model.is_moe:  # likewise the MoE knobs a user sets, where not the defaults
        if training.moe_dispatcher_sms is not None:
            report.extra["moe_dispatcher_sms"] = training.moe_dispatcher_sms
        if "moe_load_imbalance" in training.model_fields_set:
            report.extra["moe_load_imbalance"] = training.moe_load_imbalance
    return report


def _simulate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
              plan: ParallelPlan, time_if_oom: bool, job_gpus: int | None = None
              ) -> StepReport:
    """``simulate`` of the plan as written."""
    reasons = check_plan(model, cluster, training, plan)
    if reasons:
        return infeasible(plan, reasons)
    topo = cluster.topology
    n_gpus = cluster.num_gpus
    dp = plan.resolved_dp(n_gpus)
    p, v, t, cp = plan.pp, plan.virtual_stages, plan.tp, plan.cp
    m = training.global_batch_size // (dp * plan.micro_batch_size)
    chunks, layers = plan_chunks(model, plan)  # per model chunk, per pipeline rank
    mb_tokens = plan.micro_batch_size * training.seq_len / cp
    # Pipeline sends: AQ-SGD's activation compression shrinks them (simulator.compression).
    act_bytes = mb_tokens * model.hidden_size * training.compute_bytes * pp_ratio(training, plan)

    span_ranks = dp * t * cp  # GPUs per pipeline stage (a block of consecutive ranks)
    world = job_gpus or plan.world_size(n_gpus)  # the parts a step waits for (variability)

    # Each stage is a block of dp*tp*cp consecutive ranks; on a mixed cluster its ranks may sit
    # on different GPU types, and the slowest one paces the whole stage (they synchronize).
    place = None if plan.placement is None else np.asarray(plan.placement, dtype=np.int64)
    stage_gpus, stage_base = stage_gpu_types(cluster, plan, p, span_ranks)
    per_gpu: dict[tuple[str, int], tuple[Device, LayerCost, LayerCost, HeadTimes]] = {}
    for gpus, bases in zip(stage_gpus, stage_base, strict=True):
        for name, gpu in gpus.items():
            key = (name, bases[name])
            if key not in per_gpu:
                dev = Device.of_training(gpu, training, synced_gpus=world)
                dense = layer_cost(model, topo, training, plan, dev, moe=False,
                                   base_rank=key[1])
                moe = (layer_cost(model, topo, training, plan, dev, moe=True,
                                  base_rank=key[1]) if model.is_moe else dense)
                per_gpu[key] = (dev, dense, moe, head_times(model, topo, training, plan, dev,
                                                            base_rank=key[1]))

    t_f, t_b, t_w = [], [], []
    comp, tp_sum, cp_sum, ep_sum = [], [], [], []
    stage_device: list[Device] = []
    starts = [0] * len(chunks)
    for i in range(1, len(chunks)):
        starts[i] = starts[i - 1] + chunks[i - 1]
    moe_per_rank: list[int] = []
    # Under the MoE all-to-all overlap the warm-up forwards and cool-down backwards have no
    # partner and expose their all-to-alls (``LayerCost.ep_lone_fwd``); a share of each pass.
    warm = a2a_overlap_warmup(model, training, plan)  # > 0 exactly when the overlap runs
    lone = [unpartnered_share(plan.schedule, p, m, r, v) if warm else 0.0 for r in range(p)]
    for r in range(p):
        n_moe = sum(moe_layers_in(model, starts[c * p + r], chunks[c * p + r])
                    for c in range(v)) if model.is_moe else 0
        moe_per_rank.append(n_moe)
        n_dense = layers[r] - n_moe
        best = None
        for name in stage_gpus[r]:
            dev, dense, moe, head = per_gpu[(name, stage_base[r][name])]
            f = n_dense * dense.fwd + n_moe * (moe.fwd + lone[r] * moe.ep_lone_fwd)
            b = n_dense * dense.bwd + n_moe * (moe.bwd + lone[r] * moe.ep_lone_bwd)
            c = n_dense * dense.compute + n_moe * moe.compute
            head_tp = 0.0
            if r == p - 1:
                f, b, c = f + head.fwd, b + head.bwd, c + head.fwd + head.bwd - head.tp
                head_tp = head.tp
            if best is None or f + b > best[0] + best[1]:
                best = (f, b, c, dev, dense, moe, head_tp)
        f, b, c, dev, dense, moe, head_tp = best
        t_f.append(f)
        t_b.append(b)
        t_w.append(n_dense * dense.wgrad + n_moe * moe.wgrad)
        comp.append(c)
        tp_sum.append(n_dense * dense.tp + n_moe * moe.tp + head_tp)
        cp_sum.append(n_dense * dense.cp + n_moe * moe.cp)
        ep_sum.append(n_dense * dense.ep + n_moe * (moe.ep + lone[r] * (
            moe.ep_lone_fwd + moe.ep_lone_bwd)))
        stage_device.append(dev)

    # ---- pipeline ------------------------------------------------------------------------
    t_p2p = 0.0
    if p > 1:
        # Megatron scatter-gather: each TP rank sends 1/t of the b*s*h activation; every
        # replica's every boundary sends at once and the slowest pair paces the pipeline, on
        # the GPUs the ranks are placed on.
        t_p2p = coll.pipeline_p2p(topo, span_ranks, p, t, act_bytes / t, placement=place)
        if v > 1 and plan.overlap_p2p_comm:
            t_p2p = overlapped_p2p(t_p2p, min(t_f) / v,
                                   max(d.nccl_slowdown for d in stage_device))
    if len(set(chunks)) == 1:
        # Even split (given or implied: the same split always gets the same time); stages
        # differ only by the embedding / LM head. Closed form on the mean
        # stage plus the slowest stage's excess in every steady-state slot (exact when equal).
        mean_f, mean_b, mean_w = sum(t_f) / p, sum(t_b) / p, sum(t_w) / p
        pt = pipeline_time(plan.schedule, p, m, mean_f, mean_b, v=v, t_w=mean_w, t_p2p=t_p2p)
        excess = m * (max(f + b for f, b in zip(t_f, t_b, strict=True)) - mean_f - mean_b)
        span, pp_comm = pt.total_s + excess, pt.p2p_s
    else:
        span, pp_comm = _pipeline_span(plan.schedule, tuple(t_f), tuple(t_b), m, v,
                                       tuple(t_w), t_p2p)
    crit = max(range(p), key=lambda r: t_f[r] + t_b[r])
    device = stage_device[crit]
    bubble = max(0.0, span - m * (t_f[crit] + t_b[crit]) - pp_comm)

    # ---- data-parallel synchronisation ---------------------------------------------------
    grad_bytes, cbytes = effective_grad_bytes(model, training, plan), training.compute_bytes
    gather_bytes = training.param_gather_bytes(dp)  # dense weights; experts gather in cbytes
    edp = max(1, dp * cp * t // (plan.ep * plan.expert_tp))
    dense0, experts0 = params_per_stage(model, plan, layers, crit, moe_per_rank)
    units = max(1, layers[crit])

    def dp_sync(dp_group: tuple[int, ...], edp_group: tuple[int, ...], dense: float,
                experts: float) -> tuple[float, float]:
        """(exposed DP time, exposed ZeRO-3 gathers) of one stage's groups, seconds."""
        if len(dp_group) <= 1 and edp <= 1:
            return 0.0, 0.0

        # Collectives run at their real granularity: DDP/Megatron buckets (max(40M, 1M x dp)),
        # FSDP one unit per transformer layer; each pays the ring's per-step latency.
        def chunked(kind: str, group: tuple[int, ...], nbytes: float, chunks: float) -> float:
            if nbytes <= 0:
                return 0.0
            chunks = max(1.0, chunks)
            return chunks * coll.group_collective(topo, group, kind, nbytes / chunks)

        if plan.zero_stage == 3 or (plan.zero_stage == 2 and training.zero2_regather):
            # FSDP: per layer and micro-batch, all-gather the weights for forward and backward,
            # reduce-scatter the gradients; prefetching hides it behind that compute. Recompute
            # runs inside the backward while its weights are gathered: no extra gather. FSDP's
            # ZeRO-2 (SHARD_GRAD_OP, reshard_after_forward=False; ``zero2_regather``: resharded
            # after every backward) gathers once per layer and micro-batch, for the forward.
            gather = chunked("all_gather", dp_group, dense * gather_bytes, units)
            scatter = chunked("reduce_scatter", dp_group, dense * grad_bytes, units)
            if experts:
                gather += chunked("all_gather", edp_group, experts * cbytes, units)
                scatter += chunked("reduce_scatter", edp_group, experts * grad_bytes, units)
            per_mb = (2 if plan.zero_stage == 3 else 1) * gather + scatter
            compute_mb = t_f[crit] + t_b[crit]
            # Exposed: what compute cannot hide, the first gather, NCCL's SMs while overlapped.
            z3 = m * coll.overlapped(per_mb, compute_mb, device.nccl_slowdown)
            return 0.0, z3 + gather / units
        grads, params = grad_sync_parts(topo, dp_group, model, plan, training, dense,
                                        gather_bytes=gather_bytes)
        if experts:
            eg, ep_ = grad_sync_parts(topo, edp_group, model, plan, training, experts,
                                      gather_bytes=cbytes)
            grads, params = grads + eg, params + ep_
        bucket = float(dp_bucket_elements(dp, training.ddp_bucket_size))
        buckets = max(1.0, (dense + experts) / bucket)
        window = t_b[0] if plan.overlap_grad_reduce else 0.0

        def exposed(sync: float) -> float:
            return float(overlapped_grad_sync(sync, window, buckets, device.nccl_slowdown)) \
                if plan.overlap_grad_reduce else sync

        # Chains under pipelined FSDP, ZeRO-2's reduce-scatter per micro-batch, DDP without
        # no_sync (``dp_sync.exposed_grad_sync``; FSDP's ZeRO-2 is priced per layer above).
        return exposed_grad_sync(training, plan, m, grads, params, exposed), 0.0

    dp_ranks = tuple(t * i for i in range(cp * dp))
    edp_ranks = tuple(plan.expert_tp * plan.ep * i for i in range(edp))
    if place is None:
        dp_time, zero3_exposed = dp_sync(dp_ranks, edp_ranks, dense0, experts0)
    else:
        # Placed: each stage reduces its own parameters over its own GPUs, all at once; the
        # slowest stage's reduction is the one the step waits for. The reduction order is
        # free (the communicator may list its ranks in any order), so its ring runs in GPU
        # index order: node by node and region by region, as rank order does.
        dp_time, zero3_exposed = max(
            (dp_sync(tuple(sorted(int(place[r * span_ranks + x]) for x in dp_ranks)),
                     tuple(sorted(int(place[r * span_ranks + x]) for x in edp_ranks)),
                     *params_per_stage(model, plan, layers, r, moe_per_rank))
             for r in range(p)), key=sum)

    # ---- optimizer -----------------------------------------------------------------------
    shard = dp * cp if plan.zero_stage >= 1 else 1
    eshard = edp if plan.zero_stage >= 1 else 1
    opt = optimizer_step_time(dense0 / shard + experts0 / eshard, training, device)

    copies = m * (dense0 + experts0) * fsdp_copy_bytes_per_param(  # FSDP's copies (ZeRO-2/3)
        training, plan.zero_stage) / device.memory_Bps if (cp * dp > 1 or edp > 1) else 0.0
    if plan.zero_stage == 0:  # DDP under autocast: weight casts, fp32 accumulation, buckets
        copies += (dense0 + experts0) * ddp_autocast_bytes_per_param(
            training, m, cp * dp > 1) / device.memory_Bps

    # A word embedding tied to the output layer: the two ends of the pipeline sum their
    # copies' gradients before the optimizer step (reported under pp_comm).
    tied = tied_embedding_sync(topo, model, training, plan, span_ranks, plan.placement)
    step = span + dp_time + zero3_exposed + opt + copies + tied
    # ---- memory --------------------------------------------------------------------------
    # The MoE overlap's extra layer in flight (``warm``).
    inflight = [inflight_microbatches(plan.schedule, p, m, r, v=v, extra=warm) for r in range(p)]
    mems: list[StageMemory] = pipeline_memory(model, training, plan, dp=dp, layers=layers,
                                              inflight=inflight, moe_layers=moe_per_rank)
    # A stage's capacity is its smallest GPU; the worst is the one closest to (or past) it.
    caps = [min(g.memory_GiB for g in stage_gpus[r].values()) for r in range(p)]
    worst = max(range(p), key=lambda r: mems[r].peak / GiB - caps[r])
    memory = {**gib(mems[worst]), "peak": mems[worst].peak / GiB}
    per_stage = [mm.peak / GiB for mm in mems]
    capacity = caps[worst]

    tp_c, cp_c, ep_c = m * tp_sum[crit], m * cp_sum[crit], m * ep_sum[crit]
    exposed = tp_c + cp_c + ep_c + pp_comm + tied + dp_time + zero3_exposed
    time_s = {"compute": m * comp[crit] + copies, "tp_comm": tp_c, "cp_comm": cp_c, "ep_comm": ep_c,
              "pp_comm": pp_comm + tied, "dp_comm": dp_time + zero3_exposed, "bubble": bubble,
              "optimizer": opt, "exposed_comm": exposed}
    extra = {"dp": dp, "num_microbatches": m, "layers_per_stage": layers,
             "stage_forward_s": t_f, "stage_backward_s": t_b, "stage_wgrad_s": t_w,
             "memory_per_stage_breakdown_gb": [gib(mm) for mm in mems],
             "memory_capacity_gb": capacity, "memory_headroom_gb": capacity - memory["peak"],
             "num_gpus": n_gpus, "gpus_per_stage": span_ranks, "worst_stage": worst,
             "stage_gpu_types": [sorted(g) for g in stage_gpus],
             "stage_memory_capacity_gb": caps,
             "plan_short": plan.short(), "pp_p2p_s": t_p2p, "tied_embedding_s": tied,
             # Compute speed of each GPU type's slowest part over one median part's.
             "slowest_part_pace": {g.gpu.name: slowest_part_pace(g.gpu.unit_speed_spread, world)
                                   for g in cluster.node_groups}}
    if uses_knobs(plan):
        extra["communication_savings"] = savings(model, training, plan)
    oom_reasons: list[str] = []
    if memory["peak"] > capacity:
        over = memory["peak"] - capacity
        reason = (f"out of memory by {over:.1f} GiB on stage {worst} (needs "
                  f"{memory['peak']:.1f} GiB of {capacity:g} GiB: weights "
                  f"{memory['weights']:.1f}, grads {memory['grads']:.1f}, optimizer "
                  f"{memory['optimizer']:.1f}, activations {memory['activations']:.1f}, other "
                  f"{memory['other']:.1f}); try a higher zero_stage, recompute=selective/full, "
                  "a smaller micro_batch_size or more tp/pp")
        if not time_if_oom:
            return infeasible(plan, [reason], extra, memory, per_stage)
        oom_reasons.append(reason)

    n_flops = model_flops_per_step(model, training.global_batch_size, training.seq_len)
    h_flops = hardware_flops_per_step(model, training.global_batch_size, training.seq_len,
                                      plan.recompute,
                                      skip_down_proj=rerun_skips_down_projection(training))
    # MFU over the cluster's total peak (the mean peak per GPU on a mixed cluster).
    peak = sum(g.num_gpus * g.gpu.peak_flops(training.precision)
               for g in cluster.node_groups) / n_gpus
    mtf = n_flops / step / n_gpus
    htf = h_flops / step / n_gpus
    return StepReport(
        feasible=not oom_reasons, reasons=oom_reasons, step_time_s=step,
        tokens_per_s=training.tokens_per_step / step,
        model_tflops_per_gpu=mtf / 1e12, hardware_tflops_per_gpu=htf / 1e12,
        mfu=mtf / peak, hfu=htf / peak, memory_gb=memory, memory_per_stage_gb=per_stage,
        time_s=time_s, plan=plan.model_dump(), extra=extra,
    )
