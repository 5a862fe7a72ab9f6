"""One block of plans (same pp and virtual stages) evaluated as arrays: per-layer costs,
collectives, pipeline span, DP sync, memory per stage."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paraplan.search.space.build import PlanSpace
from paraplan.search.space.comm_tables import CommTables
from paraplan.search.space.span import inflight, pipeline_span
from paraplan.search.space.stage_classes import (
    Stages,
    stage_classes,
    stage_param_rows,
    stage_params,
)
from paraplan.simulator.collectives import overlapped
from paraplan.simulator.compute import Device
from paraplan.simulator.copies import ddp_autocast_bytes_per_param
from paraplan.simulator.dp_sync import chains_per_step, overlapped_grad_sync
from paraplan.simulator.memory import (
    ALLOCATOR_FRAGMENTATION,
    CUDA_CONTEXT_BYTES,
    DDP_BUCKET_ELEMENTS,
    NCCL_BUFFER_BYTES,
    GiB,
    dp_bucket_elements,
    loss_bytes_per_logit,
)
from paraplan.simulator.moe import overlap_extra
from paraplan.simulator.pipeline import SCHEDULES


def _chunked(lines: np.ndarray, nbytes: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    """``chunks`` equal collectives moving ``nbytes`` in all: min over lines (per plan)."""
    chunks = np.maximum(1.0, chunks)
    with np.errstate(invalid="ignore"):
        t = np.min(chunks[:, None] * lines[:, :, 0] + lines[:, :, 1] * nbytes[:, None], axis=1)
    return np.where(nbytes > 0, t, 0.0)


@dataclass
class Context:
    """Per-search constants and per-key tables shared by the blocks of ``evaluate_space``."""

    dev: Device
    cb: float
    gather_bytes: float
    """Bytes per dense parameter of ZeRO/FSDP parameter all-gathers with dp > 1
    (``TrainingSpec.param_gather_bytes``; ``cb`` with dp = 1 and for experts)."""
    slow: float
    opt_coef: float
    fsdp_coef: np.ndarray
    """Seconds per parameter per micro-batch of FSDP's copies, by ZeRO stage 0..3."""
    zero_bytes: np.ndarray
    """Bytes per parameter of weights, gradients and optimizer state by ZeRO stage 0..3:
    row 0 sharded over the data-parallel degree, row 1 kept whole."""
    overlap: bool
    interval: float
    capacity_bytes: float
    exact_interleaved: bool
    inv: np.ndarray
    lc: np.ndarray
    acts: np.ndarray
    """Activation bytes by kind (dense, MoE, working set) and key (``inv``)."""
    head: np.ndarray
    edp: np.ndarray
    comm: CommTables | None = None
    """What ``block_time`` reads of the collectives (built for the plans it times)."""
    overlap_p2p: bool = False
    """Interleaved pipeline sends overlap a chunk's compute (plan.overlap_p2p_comm)."""
    _stage_cache: dict[tuple[int, int], Stages] = field(init=False, default_factory=dict)

    def stages(self, model, p: int, v: int) -> Stages:
        """``stage_classes`` of a (pp, vpp) block, built once per search (the blocks' pieces and
        both passes share it; dict assignment is atomic, so threads may race harmlessly)."""
        hit = self._stage_cache.get((p, v))
        if hit is None:
            hit = self._stage_cache[(p, v)] = stage_classes(model, p, v)
        return hit


def block_memory(space: PlanSpace, p: int, v: int, idx: np.ndarray, ctx: Context,
                 out_peak: np.ndarray, out_worst: np.ndarray) -> np.ndarray:
    """Peak memory (GiB) and worst stage of the plans ``idx`` of a (pp, vpp) block, written
    to ``out_peak`` and ``out_worst``; returns which of them fit. Reads ``ctx.acts``, not the
    time tables.

    Every term but the in-flight activations is a sum of (per plan) x (per stage class)
    products, so each group of them is one small matrix product ``[plans, k] @ [k, stages]``
    (``memory.pipeline_memory``'s terms, per plan and stage class)."""
    model, training, c = space.model, space.training, space.cols
    cb = ctx.cb
    st = ctx.stages(model, p, v)
    rr, layers, first, last = st.rr, st.layers, st.first, st.last

    def col(name: str) -> np.ndarray:
        return np.take(c[name], idx)  # np.take: several times faster than a[idx] here

    t = col("tp").astype(float)
    ep, etp = col("ep"), col("etp")
    dp, cp = col("dp"), col("cp")
    z = col("zero")
    sched = col("sched")
    mi = col("m")
    e_dp = np.take(ctx.edp, idx)
    nmoe_mem = st.nmoe + last * model.num_mtp_layers  # MTP blocks sit on the last stage
    # Dense (TP-split) and expert parameters of each stage class, per 1/tp and 1/(ep etp).
    dense_s, exp_s = stage_param_rows(model, st, p)
    inv_t = 1.0 / t
    inv_e = 1.0 / (ep * etp).astype(float)  # (a dense model's expert rows are 0)
    # Weights, gradients and optimizer state per stage: each plan's bytes per dense and per
    # expert parameter (sharded over dp*cp / expert-DP from ZeRO stage 3, 2, 1 on) times
    # the stage's parameters, ``sharded[z] / degree + whole[z]`` by ZeRO stage z.
    sh, wh = np.take(ctx.zero_bytes[0], z), np.take(ctx.zero_bytes[1], z)
    mbs = col("mbs").astype(float)
    s_local = training.seq_len / cp.astype(float)
    per_logit = loss_bytes_per_logit(training)
    key = np.take(ctx.inv, idx)
    a_dense, a_moe, a_work = (np.take(ctx.acts[j], key) for j in range(3))
    if model.is_moe:
        layer_params = np.maximum(model.dense_layer_params,
                                  model.moe_layer_params / np.maximum(1, ep))
    else:
        layer_params = float(model.dense_layer_params)
    # Per stage class x per plan (stage-major: the max over stages runs along contiguous
    # rows): weights, gradients, optimizer state, the working set of a layer, the logits and
    # the embedding output (all times the allocator's fragmentation), and the per-plan
    # constant: CUDA context, NCCL buffers, ZeRO-3's gathered layer.
    frag = 1.0 + ALLOCATOR_FRAGMENTATION
    plan_terms = np.stack([
        (sh / (dp * cp) + wh) * inv_t, (sh / e_dp + wh) * inv_e, a_work,
        per_logit * s_local * mbs * model.vocab_size * inv_t * (1 + model.num_mtp_layers),
        2.0 * s_local * mbs * model.hidden_size,
        CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES
        + np.where(z == 3, 2.0 * layer_params / t * cb, 0.0)])
    stage_terms = np.stack([dense_s * frag, exp_s * frag, (layers > 0) * frag, last * frag,
                            first * frag, np.ones(len(rr))], axis=1)
    peak = stage_terms @ plan_terms
    ddp = (dp > 1) & (z < 3)  # DDP's fp32 bucket of gradients
    if ddp.any():
        buckets = np.minimum(np.stack([dense_s, exp_s], axis=1) @ np.stack([inv_t, inv_e]),
                             DDP_BUCKET_ELEMENTS)
        buckets *= np.where(ddp, 4.0, 0.0)
        peak += buckets
    if model.is_moe and training.moe_a2a_overlap:  # moe.a2a_overlap_warmup
        chunks = np.where(sched == SCHEDULES.index("interleaved"), v, 1)
        warm = np.where(ep > 1, overlap_extra(model.num_layers, p, chunks), 0.0)
    else:
        warm = np.zeros(len(sched))
    infl = inflight(sched, p, mi, v, rr, warm)
    infl *= (np.stack([st.ndense, nmoe_mem], axis=1) * frag) @ np.stack([a_dense, a_moe])
    peak += infl
    peak_w = peak.max(axis=0)
    worst = np.full(len(peak_w), len(rr) - 1)  # the first stage class at the max (argmax's)
    for j in range(len(rr) - 2, -1, -1):
        worst = np.where(peak[j] == peak_w, j, worst)
    peak_w /= GiB
    out_peak[idx] = peak_w
    out_worst[idx] = np.take(rr, worst)
    return peak_w <= ctx.capacity_bytes / GiB


def block_time(space: PlanSpace, p: int, v: int, idx: np.ndarray, ctx: Context,
               out_step: np.ndarray, times: dict[str, np.ndarray], exact: np.ndarray,
               out_lower: np.ndarray) -> None:
    """Step time, its breakdown and a lower bound on it (``Evaluation.lower_s``) of the plans
    ``idx`` of a (pp, vpp) block (in place), from the per-key time tables ``ctx.lc`` and
    ``ctx.head``."""
    model, training, c = space.model, space.training, space.cols
    cb = ctx.cb
    st = ctx.stages(model, p, v)
    rr, cls, lasts, cnt = st.rr, st.cls, st.lasts, st.cnt
    layers, nmoe, ndense, last = st.layers, st.nmoe, st.ndense, st.last
    t = c["tp"][idx].astype(float)
    dp, cp = c["dp"][idx], c["cp"][idx]
    z = c["zero"][idx]
    sched = c["sched"][idx]
    mi = c["m"][idx]
    m = mi.astype(float)
    e_dp = ctx.edp[idx]
    dense_r, exp_r = stage_params(model, st, p, t, c["ep"][idx], c["etp"][idx])
    rows = np.arange(len(idx))
    key = ctx.inv[idx]
    ld, lm, hh = ctx.lc[key, 0], ctx.lc[key, 1], ctx.head[key]

    def stage(col: int) -> np.ndarray:
        return ndense[None, :] * ld[:, col, None] + nmoe[None, :] * lm[:, col, None]

    f0 = stage(0) + last[None, :] * hh[:, 0, None]
    b0 = stage(1) + last[None, :] * hh[:, 1, None]
    w = stage(2)
    # The MoE overlap's unpartnered warm-up / cool-down passes (layer.unpartnered_share): a
    # share that falls with the stage index, so a class's first stage has the most, its last
    # the least, and the means need the share summed over each class's stages.
    f, b, sum_f, sum_b, f_min, ep_lone = f0, b0, f0 @ cnt, b0 @ cnt, f0.min(axis=1), 0.0
    fb_last = f0 + b0  # each class's last stage's work (the lower bound's per-rank form)
    if model.is_moe and training.moe_a2a_overlap:
        lone = inflight(sched, p, mi, v, np.arange(p), np.zeros(len(idx))).T / m[:, None]
        lone_f, lone_b = stage(7), stage(8)
        f, b = f0 + lone[:, rr] * lone_f, b0 + lone[:, rr] * lone_b
        lone_sum = lone @ cls
        sum_f = sum_f + (lone_sum * lone_f).sum(axis=1)
        sum_b = sum_b + (lone_sum * lone_b).sum(axis=1)
        f_min = (f0 + lone[:, lasts] * lone_f).min(axis=1)
        fb_last = fb_last + lone[:, lasts] * (lone_f + lone_b)
        ep_lone = lone[:, rr] * (lone_f + lone_b)
    fb = f + b
    crit = np.argmax(fb, axis=1)
    mean_f, mean_b, mean_w = sum_f / p, sum_b / p, w @ cnt / p
    at = ctx.comm.pos(idx)  # the plans' entries in the communication tables
    cc = ctx.comm.t_p2p[at] if p > 1 else np.zeros(len(idx))
    if p > 1 and v > 1 and ctx.overlap_p2p:  # simulator.pipeline.overlapped_p2p
        win = f_min / v
        cc = overlapped(cc, win, ctx.slow)
    total, base, odd = pipeline_span(sched, p, mi, v, mean_f, mean_b, mean_w, cc,
                                      ctx.exact_interleaved)
    fb_c = fb[rows, crit]
    span = total + m * (fb_c - mean_f - mean_b)
    pp_comm = total - base
    bubble = np.maximum(0.0, span - m * fb_c - pp_comm)

    need = (cp * dp > 1) | (e_dp > 1)
    # FSDP's units: ZeRO-3, and ZeRO-2 where it is FSDP's (it re-gathers every micro-batch:
    # zero2_regather), gather and reduce-scatter per layer (simulator.step).
    z3 = (z == 3) | ((z == 2) & training.zero2_regather)
    g = ctx.comm.ginv[at]
    e = ctx.comm.einv[at]
    gb = ctx.comm.grad_bytes[at]
    gbytes = np.where(dp > 1, ctx.gather_bytes, cb)  # fp8 gathers need dp > 1
    # DDP all-reduces buckets; ZeRO-1/2 reduce-scatter grads and all-gather params in rings
    # (dp_sync.grad_sync_parts), DeepSpeed's bf16 ZeRO-1 all-reduces the grads in full.
    z12 = (z == 1) | (z == 2)
    bucket = dp_bucket_elements(dp, training.ddp_bucket_size)  # parameters per bucket
    rs_grads = z12 & ~((z == 1) & training.zero1_grad_all_reduce)
    shard = np.where(z >= 1, (dp * cp).astype(float), 1.0)
    eshard = np.where(z >= 1, e_dp.astype(float), 1.0)

    def _reduce(ar_l: np.ndarray, rs_l: np.ndarray, ag_l: np.ndarray, count: np.ndarray,
                pbytes: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """(gradient part, parameter part) as dp_sync.grad_sync_parts."""
        buckets = count / bucket if ctx.overlap else np.ones_like(count)
        lines = np.where(rs_grads[:, None, None], rs_l, ar_l)  # one line set per plan
        grads = _chunked(lines, count * gb, buckets)
        return grads, np.where(z12, _chunked(ag_l, count * pbytes, buckets), 0.0)

    def tail(col: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What simulate charges after the span on the stage class ``col`` of each row:
        (DP time, ZeRO-3 exposure, optimizer, FSDP copies)."""
        dense0, exp0 = dense_r[rows, col], exp_r[rows, col]
        units = np.maximum(1.0, layers[col])
        gather = _chunked(ctx.comm.ag[g], dense0 * gbytes, units)
        scatter = _chunked(ctx.comm.rs[g], dense0 * gb, units)
        g_part, p_part = _reduce(ctx.comm.ar[g], ctx.comm.rs[g], ctx.comm.ag[g], dense0, gbytes)
        if model.is_moe:
            has = exp0 != 0
            gather = gather + np.where(has, _chunked(ctx.comm.eag[e], exp0 * cb, units), 0.0)
            scatter = scatter + np.where(has, _chunked(ctx.comm.ers[e], exp0 * gb, units), 0.0)
            eg, ep_ = _reduce(ctx.comm.ear[e], ctx.comm.ers[e], ctx.comm.eag[e], exp0, cb)
            g_part = g_part + np.where(has, eg, 0.0)
            p_part = p_part + np.where(has, ep_, 0.0)
        sync = g_part + p_part
        per_mb = np.where(z == 3, 2.0, 1.0) * gather + scatter
        z3_exp = m * overlapped(per_mb, fb_c, ctx.slow) + gather / units
        if ctx.overlap:
            window = b[:, 0]
            buckets = np.maximum(1.0, (dense0 + exp0) / bucket)

            def exposed(x: np.ndarray) -> np.ndarray:
                return overlapped_grad_sync(x, window, buckets, ctx.slow)
        else:
            def exposed(x: np.ndarray) -> np.ndarray:
                return x
        # ZeRO-2 with m > 1: a reduce-scatter every micro-batch (simulator.step).
        z2m = (z == 2) & (m > 1)
        dpt = np.where(z2m, (m - 1) * exposed(g_part) + exposed(sync), exposed(sync))
        if training.ddp_sync_every_microbatch:  # DDP without no_sync (simulator.step)
            dpt = np.where(z == 0, m * exposed(sync), dpt)
        chains = chains_per_step(training, p)  # dp_sync.pp_grad_chains (ZeRO-3 masked below)
        if chains:
            dpt = np.where(z >= 1, chains * g_part + exposed(p_part), dpt)
        dp_time = np.where(need & ~z3, dpt, 0.0) / ctx.interval
        zero3 = np.where(need & z3, z3_exp, 0.0)
        opt = (dense0 / shard + exp0 / eshard) * ctx.opt_coef
        # FSDP copies every micro-batch (simulator.copies.fsdp_copy_bytes_per_param).
        copies = np.where(need, m * (dense0 + exp0) * ctx.fsdp_coef[z], 0.0)
        if training.ddp_autocast:  # copies.ddp_autocast_bytes_per_param, zero 0 only
            copies = copies + np.where(z == 0, (dense0 + exp0) * ddp_autocast_bytes_per_param(
                training, m, cp * dp > 1) / ctx.dev.memory_Bps, 0.0)
        return dp_time, zero3, opt, copies

    dp_time, zero3, opt, copies = tail(crit)
    tied = ctx.comm.t_tied[at]  # dp_sync.tied_embedding_sync, reported under pp_comm

    out_step[idx] = span + dp_time + zero3 + opt + copies + tied
    if times:  # the breakdown (empty where evaluate_space was not asked for it)
        comp = stage(3) + last[None, :] * (hh[:, 0] + hh[:, 1] - hh[:, 2])[:, None]
        tp_c = m * (stage(4) + last[None, :] * hh[:, 2, None])[rows, crit]
        cp_c = m * stage(5)[rows, crit]
        ep_c = m * (stage(6) + ep_lone)[rows, crit]
        times["compute"][idx] = m * comp[rows, crit] + copies
        times["tp_comm"][idx] = tp_c
        times["cp_comm"][idx] = cp_c
        times["ep_comm"][idx] = ep_c
        times["pp_comm"][idx] = pp_comm + tied
        times["dp_comm"][idx] = dp_time + zero3
        times["bubble"][idx] = bubble
        times["optimizer"][idx] = opt
        times["exposed_comm"][idx] = tp_c + cp_c + ep_c + pp_comm + tied + dp_time + zero3
    exact[idx] &= (c["uneven"][idx] == 0) & ~odd
    # Uneven splits: the closed form above estimates their span, so they get a bound the
    # event simulation cannot beat, whatever the schedule. The critical rank does its own
    # work, m (f_c + b_c); it starts only after the ranks before it have run the first
    # micro-batch's first chunk forward, and the last micro-batch's first chunk backward
    # still has to pass them after it ends (weight gradients may wait: b - w; chunks take
    # 1/v of a rank's time). Transfers and the MoE overlap's unpartnered passes on the ranks
    # before it only add time, so they are left out. What follows the span (DP sync, ZeRO-3
    # exposure, optimizer, FSDP copies) is what simulate charges on the critical stage, or
    # on any stage that ties it (the least of those).
    prefix = np.cumsum(cls, axis=0) - cls  # stages before each stage, by class
    before = prefix[rr]  # ... before each class's first stage
    fill = np.einsum("ij,ij->i", f0 + b0 - w, before[crit]) / v
    # And whatever the schedule, the first micro-batch's forward runs through every chunk of
    # every stage and its input-gradient backward back through them all: a dependency chain
    # of sum_k (f_k + b_k - w_k), which bounds the span when micro-batches are few.
    chain = (f0 + b0 - w) @ cnt
    # Every rank, not only the critical one: the last stage of each class starts after the
    # first chunk forward has passed the ranks before it and runs all its own work; its last
    # input-gradient pass (all its work but deferrable weight gradients) still has to pass
    # them back. This counts the pipeline's fill and drain where the critical class comes
    # first (the embedding's stage).
    upto = prefix[lasts]  # stages before each class's last, by class
    f_before, b_before = f0 @ upto.T / v, (b0 - w) @ upto.T / v  # (rows, classes)
    per_rank = f_before + np.maximum(m[:, None] * fb_last,
                                     m[:, None] * (fb_last - w) + b_before)
    zb = sched == SCHEDULES.index("zb-h1")
    # (The critical class's own-work-plus-both-chains form below holds where weight
    # gradients run inside each backward; zero-bubble schedules keep only the forms above.)
    after = out_step[idx] - span
    if fb.shape[1] > 1:
        # Where other stages tie the critical one, simulate may charge any of them: the
        # least of their after-span times.
        ties = (fb >= fb_c[:, None] * (1 - 1e-9)) & (c["uneven"][idx] == 1)[:, None]
        for j in range(fb.shape[1]):
            alt = ties[:, j] & (crit != j)
            if alt.any():
                after = np.where(alt, np.minimum(after, sum(tail(np.full(len(idx), j)))
                                                 + tied), after)
    span_low = np.maximum(np.where(zb, 0.0, m * fb_c + fill),
                          np.maximum(chain, per_rank.max(axis=1)))
    out_lower[idx] = np.where(c["uneven"][idx] == 1, span_low + after, out_step[idx])
