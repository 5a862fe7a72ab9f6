"""``evaluate_space``: step time, memory and time breakdown of every plan of a space at once
(``simulate()`` restated over numpy arrays), block by block."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from paraplan.search.space.block import Context, block_memory, block_time
from paraplan.search.space.build import PlanSpace
from paraplan.search.space.comm_tables import comm_tables
from paraplan.search.space.fix import RECOMPUTES
from paraplan.search.space.keys import group_rows, key_index
from paraplan.search.space.moe_keys import moe_parts
from paraplan.search.space.prune import first_pass, kth_exact, work_bound
from paraplan.simulator.compute import Device
from paraplan.simulator.copies import fsdp_copy_bytes_per_param
from paraplan.simulator.grads import accumulation_bytes_per_param, optimizer_step_time
from paraplan.simulator.layer import (
    compose_columns,
    lm_head_cost,
    mtp_columns,
    mtp_projection_time,
)
from paraplan.simulator.layer_compose import PARTS, part_columns
from paraplan.simulator.memory import WORKING_SET_RECOMPUTES, GiB, layer_activation_bytes
from paraplan.simulator.step import layer_parts
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import tp_overlap
from paraplan.specs.training import TrainingSpec

BLOCK_ROWS = 1 << 16
"""Rows a worker evaluates at a time: a (pp, vpp) block is cut into pieces of this many plans,
so each piece's temporaries (a few dozen arrays of rows x stage classes) stay small enough to
be reused from cache rather than faulted in afresh. Measured on DeepSeek-V3 / 2,048 H800
(3.07M plans, 2 threads, median of 4): whole blocks 2.11 s of array work, pieces of 8,192
rows 2.13 s, of 32,768-131,072 rows 1.41-1.44 s."""


@dataclass
class Evaluation:
    """Per-plan results of ``evaluate_space`` (arrays aligned with the space's rows).

    ``time`` holds the StepReport ``time_s`` breakdown keys (empty without ``breakdown``);
    ``peak_gib`` the worst stage's peak memory (GiB); ``exact`` is False where the pipeline
    span is the closed-form approximation (uneven splits) rather than what ``simulate()``
    returns; ``lower_s`` a lower bound on the step time ``simulate()`` returns (the step time
    itself where that is exact or already a bound; for uneven splits ``block.block_time``'s
    span bound). Plans a ``top`` evaluation leaves untimed (``prune``) have a NaN step,
    ``exact`` False and ``prune.work_bound`` as ``lower_s``.
    """

    step_time_s: np.ndarray
    peak_gib: np.ndarray
    worst_stage: np.ndarray
    capacity_gib: float
    time: dict[str, np.ndarray]
    exact: np.ndarray
    lower_s: np.ndarray

    @property
    def feasible(self) -> np.ndarray:
        return self.peak_gib <= self.capacity_gib


def evaluate_space(space: PlanSpace, progress: Callable[[int, int], None] | None = None, *,
                   exact_interleaved: bool = True, times_for_oom: bool = False,
                   workers: int | None = None, top: int | None = None,
                   cutoff: float | None = None, breakdown: bool = True) -> Evaluation:
    """Step time, peak memory and time breakdown of every plan (see module docstring).

    Args:
        progress: called with (plans done, plans in all) after each (pp, vpp) block.
        exact_interleaved: interleaved plans with m % pp != 0 need the event simulation
            (milliseconds each). False gives them the closed form of m % pp == 0, a lower
            bound on their step time (marked ``exact=False``); searchers then simulate only
            those whose bound could still reach the top.
        times_for_oom: also time plans that do not fit in memory (else their step time is
            NaN, as ``simulate`` returns no time for them).
        workers: threads for the array work (default: the CPUs this process may use).
        top: time only the plans that can be among the ``top`` fastest that fit (``prune``):
            the others that fit keep a NaN step time, ``exact=False`` and their bound as
            ``lower_s``. ``cutoff`` (with ``top``): a ``top``-th best step time already known
            (another MoE run setting's search).
        breakdown: fill ``Evaluation.time`` (else it is empty: a search that ranks by step
            time and simulates its finalists saves nine arrays over the whole space).
    """
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
    model, cluster, training = space.model, space.cluster, space.training
    if not cluster.is_homogeneous:
        raise SpecError("the vectorized evaluator needs one GPU type; use --searcher ilp or "
                        "evolutionary for a mixed cluster", field="cluster", value=cluster.name)
    c = space.cols
    n = len(space)
    gpu = cluster.gpu
    dev = Device.of_training(gpu, training, synced_gpus=cluster.num_gpus)
    const = space.constants
    overlap = bool(const.get("overlap_grad_reduce", True))
    interval = float(const.get("dp_sync_interval", 1))
    cb = float(training.compute_bytes)
    slow = dev.nccl_slowdown
    opt_coef = optimizer_step_time(1.0, training, dev)
    fsdp_coef = np.array([fsdp_copy_bytes_per_param(training, z_) / dev.memory_Bps
                          for z_ in range(4)])
    # Weights, gradients and optimizer state per parameter by ZeRO stage 0..3, the part
    # sharded over the data-parallel degree and the part kept whole (memory._static_stage's
    # ``shard`` rule; FSDP's zero-3 shard is the fp32 master itself: no 16-bit weight there).
    stage = np.arange(4)
    grad_b, state_b = training.grad_buffer_bytes, training.optimizer_state_bytes_per_param
    zero_bytes = np.stack([
        np.where(stage >= 3, 0.0 if training.fsdp_copies is not None else cb, 0.0)
        + np.where(stage >= 2, training.sharded_grad_bytes, 0.0)
        + np.where(stage >= 1, state_b, 0.0),
        np.where(stage >= 3, 0.0, cb) + np.where(stage >= 2, 0.0, grad_b)
        + np.where(stage >= 1, 0.0, state_b)])
    capacity = float(gpu.memory_GiB)

    out_step = np.full(n, np.nan)
    out_peak = np.zeros(n)
    out_worst = np.zeros(n, dtype=np.int64)
    exact = np.ones(n, dtype=bool)
    out_lower = np.full(n, np.nan)
    tkeys = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble",
             "optimizer", "exposed_comm")
    times = {k: np.zeros(n) for k in tkeys} if breakdown else {}
    if n == 0:
        return Evaluation(out_step, out_peak, out_worst, capacity, times, exact, out_lower)

    # ---- per-layer quantities, once per (tp, cp, sp, mbs, rc, ep, etp, zs) -----------------
    # zs: gradients sharded per micro-batch (ZeRO >= 2), which drops the accumulation pass
    # (grads.accumulation_time); a constant 0 where the trainer has none (fused kernels).
    zs = (c["zero"] >= 2).astype(np.int64) if accumulation_bytes_per_param(training) else \
        np.zeros(n, dtype=np.int64)
    uniq, inv = key_index([c["tp"], c["cp"], c["sp"], c["mbs"], c["rc"], c["ep"], c["etp"],
                           zs])
    plan_of = _plan_maker(space)
    rc = np.array(RECOMPUTES)[uniq[:, 4]]
    acts = _activation_table(model, training, uniq, rc, plan_of,
                             space.memo.setdefault(("act", _run_free(space)), {}))

    tp_, cp_, dp_, ep_, etp_ = c["tp"], c["cp"], c["dp"], c["ep"], c["etp"]
    edp = np.maximum(1, dp_ * cp_ * tp_ // (ep_ * etp_))
    ctx = Context(dev=dev, cb=cb, gather_bytes=float(training.param_gather_bytes(2)),
                  slow=slow, opt_coef=opt_coef,
                  fsdp_coef=fsdp_coef, zero_bytes=zero_bytes, overlap=overlap,
                  interval=interval, capacity_bytes=capacity * GiB,
                  exact_interleaved=exact_interleaved, inv=inv, lc=np.zeros((0, 2, 9)),
                  acts=acts, head=np.zeros((0, 3)),
                  edp=edp, overlap_p2p=bool(const.get("overlap_p2p_comm", False)))
    pv, order, bounds = group_rows([c["pp"], c["v"]])
    blocks = [(int(p), int(v), order[a:min(a + BLOCK_ROWS, bounds[g + 1])])
              for g, (p, v) in enumerate(pv) for a in range(bounds[g], bounds[g + 1], BLOCK_ROWS)]
    blocks.sort(key=lambda b: -len(b[2]))  # largest first balances the workers

    # Memory first (it reads only the activation table), then the time tables for the keys
    # of the plans that fit, then their times: keys whose every plan is out of memory are
    # never priced.
    fits = np.zeros(n, dtype=bool)

    def memory(block: tuple[int, int, np.ndarray]) -> None:
        p, v, idx = block
        fits[idx] = block_memory(space, p, v, idx, ctx, out_peak, out_worst)

    def timing(block: tuple[int, int, np.ndarray], want: np.ndarray) -> int:
        p, v, idx = block
        rows = idx[want[idx]]
        if len(rows):
            block_time(space, p, v, rows, ctx, out_step, times, exact, out_lower)
        return len(idx)

    # numpy releases the GIL inside its array loops, so blocks (disjoint rows) evaluate in
    # parallel threads; results are written to disjoint slices of the output arrays.
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(blocks)))) as pool:
        list(pool.map(memory, blocks))
        want = np.ones(n, dtype=bool) if times_for_oom else fits
        needed = np.zeros(len(uniq), dtype=bool)
        needed[inv[want]] = True
        ctx.lc, ctx.head = _key_tables(space, dev, uniq, rc, needed, plan_of)

        def time_rows(mask: np.ndarray) -> Iterator[int]:
            """Time the plans of ``mask`` (their communication tables first)."""
            ctx.comm = comm_tables(space, edp, np.nonzero(mask)[0])
            return pool.map(lambda b: timing(b, mask), blocks)

        if top is not None:  # a first pass finds the top-th best time; the rest must beat it
            # Only plans that fit set the K-th time or can be pruned: bound those alone.
            rows = np.flatnonzero(fits)
            bound = work_bound(np.take(c["m"], rows), np.take(c["pp"], rows),
                               np.take(inv, rows), ctx.lc, model.num_dense_layers,
                               model.num_moe_layers)
            first = np.zeros(n, dtype=bool)
            first[rows[first_pass(bound, top)]] = True
            list(time_rows(first))
            kth = kth_exact(out_step, exact, first, top, cutoff)
            cut = (bound >= kth) & ~first[rows]
            pruned = rows[cut]
            want = want & ~first
            want[pruned] = False
            out_lower[pruned], exact[pruned] = bound[cut], False
        done = 0
        for count in time_rows(want):
            done += count
            if progress is not None:
                progress(done, n)
    return Evaluation(out_step, out_peak, out_worst, capacity, times, exact, out_lower)


def _run_free(space: PlanSpace) -> tuple[str, str]:
    """What the per-key costs read of the run (all but the MoE dispatcher and its overlap):
    the memo key shared by the spaces of the other MoE run settings (``derive_space``)."""
    return (space.training.model_dump_json(exclude={"moe_dispatcher", "moe_a2a_overlap"}),
            repr(sorted(space.constants.items())))


def _plan_maker(space: PlanSpace) -> Callable[..., ParallelPlan]:
    """``plan_of(tp, cp, sp, mbs, z2, ep, etp, rc)``: a plan with a key's fields (and the
    trainer's TP overlap) for the simulator's per-layer functions."""
    tco_const = space.constants.get("tp_comm_overlap")
    templates: dict[bool | None, ParallelPlan] = {}

    def plan_of(t: int, cp: int, sp: int, mbs: int, z2: int, ep: int = 1, etp: int = 1,
                rc: str = "none") -> ParallelPlan:
        # Plans come from the validated space, so they are copies of a validated template.
        tco = tco_const
        if space.trainer is not None and tco is None:
            tco = tp_overlap(space.trainer.runs, int(t), bool(sp))
        if tco not in templates:
            templates[tco] = ParallelPlan() if tco is None else ParallelPlan(tp_comm_overlap=tco)
        return templates[tco].model_copy(update={
            "tp": int(t), "cp": int(cp), "sequence_parallel": bool(sp),
            "micro_batch_size": int(mbs), "recompute": rc, "ep": int(ep), "etp": int(etp),
            "zero_stage": 2 if z2 else 0})

    return plan_of


def _key_tables(space: PlanSpace, dev: Device, uniq: np.ndarray, rc: np.ndarray,
                needed: np.ndarray, plan_of: Callable[..., ParallelPlan]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per key (rows of ``uniq``: tp, cp, sp, mbs, recompute, ep, etp, zero >= 2 where
    gradients have an accumulation pass; ``rc`` its recompute by name): composed layer costs
    ``[key, dense/moe, LayerCost fields]`` and the LM head's (fwd, bwd, tp) with the MTP
    modules, for the ``needed`` keys (the rows of the others stay 0: no plan reads them).

    Each part is computed once per the plan fields it reads (``layer_parts``' docstring lists
    them): dense layers and the head per (tp, cp, sp, mbs, zs), MoE layers in parts
    (``moe_keys.moe_parts``: the shared part per those, the routed experts per
    ``moe.expert_shape``, the all-to-alls per ``moe.a2a_shape``); composing under recompute
    runs on arrays.
    All but the expert all-to-alls read neither the MoE dispatcher nor its overlap, so the
    spaces of the other MoE run settings (``derive_space``) take them from ``space.memo``."""
    model, training, topo = space.model, space.training, space.cluster.topology
    memo = space.memo
    run_free = _run_free(space)

    keys, krc = uniq[needed], rc[needed]
    du, dinv = key_index([keys[:, j] for j in (0, 1, 2, 3, 7)])
    dparts, dhead = np.zeros((len(du), PARTS)), np.zeros((len(du), 4))
    for i, key in enumerate(du.tolist()):
        row = memo.get(("dense", run_free, *key))
        if row is None:
            plan = plan_of(*key)
            h = lm_head_cost(model, topo, training, plan, dev)
            proj = mtp_projection_time(model, training, plan, dev) if model.num_mtp_layers \
                else 0.0
            row = memo[("dense", run_free, *key)] = (
                part_columns(layer_parts(model, topo, training, plan, dev, moe=False)),
                (h.fwd, h.bwd, h.tp, proj))
        dparts[i], dhead[i] = row
    sub = np.zeros((len(keys), 2, 9))  # [needed key, dense/moe, LayerCost fields]
    sub[:, 0] = np.stack(compose_columns(*dparts[dinv].T, krc), axis=1)
    sub[:, 1] = sub[:, 0]
    if model.is_moe:
        mu, minv = key_index([keys[:, j] for j in (0, 1, 2, 3, 7, 5, 6)])
        mparts = moe_parts(space, dev, mu, plan_of, run_free)
        sub[:, 1] = np.stack(compose_columns(*mparts[minv].T, krc), axis=1)
    h = dhead[dinv]
    head = h[:, :3]
    if model.num_mtp_layers:  # the MTP modules' MoE block runs under the key's recompute
        head = np.stack(mtp_columns(model.num_mtp_layers, h[:, 3], tuple(h[:, :3].T),
                                    tuple(sub[:, 1, [0, 1, 4]].T)), axis=1)
    lc, head_all = np.zeros((len(uniq), 2, 9)), np.zeros((len(uniq), 3))
    lc[needed], head_all[needed] = sub, head
    return lc, head_all


def _activation_table(model: ModelSpec, training: TrainingSpec, uniq: np.ndarray,
                      rc: np.ndarray, plan_of: Callable[..., ParallelPlan],
                      memo: dict[tuple, float]) -> np.ndarray:
    """``memory.layer_activations`` of each key as rows (dense, moe, working) of bytes by key
    (kind-major: the memory pass gathers each kind as one contiguous row), each part
    computed once per the plan fields it reads: the dense layer's not per ep/etp, the
    recompute working set (the layer without recompute) not per recompute kind, and none per
    micro-batch size: a layer's activation bytes are linear in the micro-batch (every term of
    ``memory.layer_activation_bytes`` is ``s b h`` times a per-token count that does not read
    it), so each is priced at one sequence and scaled. Values kept in ``memo`` by (shape, moe,
    recompute) for the other MoE run settings."""
    out = np.zeros((3, len(uniq)))
    plans: dict[tuple[int, ...], ParallelPlan] = {}  # recompute passed apart

    def fill(col: int, cols: tuple[int, ...], moe: bool, rows: np.ndarray,
             recompute: str | None) -> None:
        if not rows.any():
            return
        sub = uniq[rows]
        cols = tuple(j for j in cols if j != 3)  # not the micro-batch size (linear in it)
        u, uinv = key_index([sub[:, j] for j in cols])
        vals = np.empty(len(u))
        full = np.ones((len(u), 7), dtype=np.int64)  # ep, etp 1 where not keyed
        full[:, list(cols)] = u
        for i, (t, cp, sp, _, rci, ep, etp) in enumerate(full.tolist()):
            shape = (t, cp, sp, ep, etp)
            kind = recompute or RECOMPUTES[rci]
            value = memo.get((*shape, moe, kind))
            if value is None:
                if shape not in plans:
                    plans[shape] = plan_of(t, cp, sp, 1, 0, ep, etp)
                value = memo[(*shape, moe, kind)] = layer_activation_bytes(
                    model, training, plans[shape], 1, moe=moe, recompute=kind)
            vals[i] = value
        out[col, rows] = vals[uinv] * sub[:, 3]

    every = np.ones(len(uniq), dtype=bool)
    fill(0, (0, 1, 2, 3, 4), False, every, None)
    if model.is_moe:
        fill(1, (0, 1, 2, 3, 4, 5, 6), True, every, None)
    else:
        out[1] = out[0]
    working = np.isin(rc, WORKING_SET_RECOMPUTES)
    fill(2, (0, 1, 2, 3, 5, 6) if model.is_moe else (0, 1, 2, 3), model.is_moe, working, "none")
    return out
