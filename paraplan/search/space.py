"""The plan space of a (model, cluster, training) and a vectorized evaluator over it.

``build_space`` enumerates every homogeneous plan: tp, pp, cp, ep, expert-tp, sequence
parallelism, ZeRO stage, micro-batch size, schedule, virtual stages and recompute (dp follows
from the GPU count). Plans that break a trainer's start-up rule (the rules of
``specs.checks.check_plan``) are counted by reason, not kept. Layers are split evenly; when
``pp`` does not divide the layer count the split is as even as possible (earlier stages get
one more layer, as torchtitan and Megatron's uneven first/last-stage options allow), which the
plan then states in ``layers_per_stage``. Interleaving needs ``pp * vpp`` to divide the layers.

``evaluate_space`` computes step time, memory and the time breakdown of every plan at once as
numpy arrays. It is ``simulate()`` restated over arrays: the per-layer costs, activation sizes,
LM-head times and collective lines are computed once per distinct combination of the plan
fields they depend on (by the simulator's own scalar functions), and the composition
(pipeline closed form, DP synchronisation, ZeRO-3 gathers, optimizer, memory per stage) is the
same arithmetic on arrays. On plans with an even split it agrees with ``simulate()`` to 1e-6
(property test); on uneven splits it uses the closed form on the mean stage plus the slowest
stage's excess (what ``simulate`` does for the embedding/LM-head asymmetry) where ``simulate``
runs the event simulation, so the searchers re-simulate their finalists exactly.
Homogeneous clusters only (one GPU type); mixed clusters are searched by ``ilp``/``evolutionary``.
Times are seconds, memory GiB (2^30 bytes).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from paraplan.simulator.collectives import collective_lines, kind_efficiency, pipeline_p2p_lines
from paraplan.simulator.compression import effective_grad_bytes, pp_ratio
from paraplan.simulator.compute import Device, optimizer_step_time
from paraplan.simulator.memory import (
    ALLOCATOR_FRAGMENTATION,
    CUDA_CONTEXT_BYTES,
    DDP_BUCKET_ELEMENTS,
    NCCL_BUFFER_BYTES,
    GiB,
    layer_activations,
    moe_layers_in,
)
from paraplan.simulator.pipeline import SCHEDULES, _group_size, pipeline_time
from paraplan.simulator.step import (
    LayerParts,
    compose_layer_cost,
    even_split,
    head_times,
    layer_parts,
)
from paraplan.specs.checks import divisors
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError, from_validation_error
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ALIASES, ParallelPlan, _coerce_inline
from paraplan.specs.training import TrainingSpec

RECOMPUTES: tuple[str, ...] = ("none", "selective", "op", "full")
# Plan fields that are the same for every plan of a search (set with --fix, else defaults).
CONSTANT_FIELDS = ("tp_comm_overlap", "overlap_grad_reduce", "dp_sync_interval",
                   "grad_compression_ratio", "allow_cross_node_tp", "grad_compression",
                   "compression_rank", "compression_bits", "compression_topk",
                   "pseudo_grad_bits", "activation_compression_bits")
# The relaxed-synchronization knobs among them (simulator.compression prices them).
COMPRESSION_FIELDS = tuple(f for f in CONSTANT_FIELDS
                           if f not in ("tp_comm_overlap", "overlap_grad_reduce",
                                        "allow_cross_node_tp"))
SEARCHED_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "sequence_parallel", "zero_stage",
                   "micro_batch_size", "schedule", "virtual_stages", "recompute")
# Rejection reasons, in the order they are tested (a plan is counted under the first it breaks).
R_WORLD = "tp*pp*cp does not divide the GPU count"
R_TP_NODE = "tp exceeds or does not divide the GPUs per node"
R_HEADS = "tp does not divide the attention/KV heads or the FFN width"
R_SEQ = "seq_len not divisible by 2*cp"
R_LAYERS = "pp exceeds the layers, or pp*vpp does not divide them (interleaving)"
R_EXPERTS = "ep*etp does not divide tp*cp*dp, ep the experts, or etp the expert width"
R_BATCH = "global batch not divisible by micro_batch_size*dp"


def parse_fix(text: str | dict[str, Any] | None) -> dict[str, Any]:
    """Parse ``--fix tp=8,pp=4,rc=full`` into plan fields (aliases as in inline plans).

    Raises:
        SpecError: unknown fields or values a plan would reject.
    """
    if not text:
        return {}
    if isinstance(text, dict):
        raw = {ALIASES.get(k, k): v for k, v in text.items()}
    else:
        raw = {}
        for item in text.replace(" ", ",").split(","):
            if not item.strip():
                continue
            if "=" not in item:
                raise SpecError(f"--fix item {item!r} is not key=value (e.g. tp=8,pp=4)",
                                field="fix", value=text)
            key, val = (x.strip() for x in item.split("=", 1))
            key = ALIASES.get(key, key)
            raw[key] = _coerce_inline(key, val)
    allowed = SEARCHED_FIELDS + CONSTANT_FIELDS
    for key in raw:
        if key not in allowed:
            raise SpecError(f"--fix cannot pin {key!r}; it can pin {', '.join(allowed)} "
                            "(or the short names tp pp dp cp ep etp sp zero mbs vpp rc)",
                            field="fix", value=key, allowed=list(allowed))
    try:
        ParallelPlan(**raw)
    except ValidationError as exc:
        raise from_validation_error(exc, "fix") from None
    return raw


@dataclass(frozen=True)
class SpaceOptions:
    """Bounds of the enumerated space (a demanding user widens them with --fix)."""

    max_cp: int = 32
    """Largest context-parallel degree tried."""
    max_micro_batch: int = 128
    """Largest micro-batch size tried (divisors of the global batch up to this)."""
    max_virtual_stages: int = 8
    """Largest number of interleaved model chunks per pipeline rank tried."""
    uneven_layers: bool = True
    """Allow pp that does not divide the layers (near-even split, non-interleaved)."""


@dataclass
class PlanSpace:
    """Legal plans as columns (one entry per plan) plus rejection counts.

    Columns: tp, pp, dp, cp, ep, etp, sp (0/1), zero, mbs, sched (index into
    ``pipeline.SCHEDULES``), v (virtual stages), rc (index into ``RECOMPUTES``), m (micro-batches
    per step), uneven (1 when the layer split is uneven).
    """

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    cols: dict[str, np.ndarray]
    constants: dict[str, Any]
    rejected: Counter = field(default_factory=Counter)
    considered: int = 0
    """Plans in the raw grid (legal + rejected by a rule)."""

    def __len__(self) -> int:
        return int(self.cols["tp"].shape[0])

    def plan(self, i: int) -> ParallelPlan:
        """The ParallelPlan of row ``i``."""
        c = {k: int(v[i]) for k, v in self.cols.items()}
        data: dict[str, Any] = {
            "tp": c["tp"], "pp": c["pp"], "dp": c["dp"], "cp": c["cp"], "ep": c["ep"],
            "etp": None if c["etp"] == c["tp"] else c["etp"],
            "sequence_parallel": bool(c["sp"]), "zero_stage": c["zero"],
            "micro_batch_size": c["mbs"], "schedule": SCHEDULES[c["sched"]],
            "virtual_stages": c["v"], "recompute": RECOMPUTES[c["rc"]], **self.constants,
        }
        if c["uneven"]:
            data["layers_per_stage"] = even_split(self.model.num_layers, c["pp"] * c["v"])
        return ParallelPlan(**data)

    def subset(self, mask: np.ndarray) -> PlanSpace:
        """Rows where ``mask`` is true (rejection counts are kept)."""
        return PlanSpace(self.model, self.cluster, self.training,
                         {k: v[mask] for k, v in self.cols.items()}, self.constants,
                         Counter(self.rejected), self.considered)


def _allowed(fix: dict[str, Any], key: str, values: list[Any]) -> list[Any]:
    if key in fix and fix[key] is not None:
        return [v for v in values if v == fix[key]] or [fix[key]]
    return values


def build_space(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                fix: dict[str, Any] | None = None,
                options: SpaceOptions | None = None) -> PlanSpace:
    """Enumerate the legal plans of a homogeneous search (rules as in ``check_plan``)."""
    fix = dict(fix or {})
    opt = options or SpaceOptions()
    n = cluster.num_gpus
    L = model.num_layers
    B = training.global_batch_size
    gpn = min(g.gpus_per_node for g in cluster.node_groups)
    cross = bool(fix.get("allow_cross_node_tp", False))
    constants = {k: fix[k] for k in CONSTANT_FIELDS if k in fix}
    rejected: Counter = Counter()

    tps = _allowed(fix, "tp", divisors(n) if cross else divisors(gpn))
    cps = _allowed(fix, "cp", [c for c in divisors(n) if c <= opt.max_cp])
    pps = _allowed(fix, "pp", [p for p in divisors(n) if p <= L])
    eps = _allowed(fix, "ep", divisors(model.num_experts) if model.is_moe else [1])
    mbss = np.array(_allowed(fix, "micro_batch_size",
                             [b for b in divisors(B) if b <= opt.max_micro_batch]), dtype=np.int64)
    zeros = np.array(_allowed(fix, "zero_stage", [0, 1, 2, 3]), dtype=np.int64)
    rcs = np.array([RECOMPUTES.index(r) for r in
                    _allowed(fix, "recompute", list(RECOMPUTES))], dtype=np.int64)
    if "recompute" in fix and fix["recompute"] not in RECOMPUTES:
        raise SpecError(f"unknown recompute {fix['recompute']!r}", field="fix",
                        value=fix["recompute"], allowed=list(RECOMPUTES))
    heads, kv, ffn = model.num_attention_heads, model.kv_heads, model.ffn_hidden_size
    for group in cluster.node_groups:
        if training.precision not in group.gpu.peak_tflops:
            raise SpecError(f"precision={training.precision} is not supported by "
                            f"{group.gpu.name}", field="precision", value=training.precision,
                            allowed=sorted(group.gpu.peak_tflops))

    blocks: list[dict[str, np.ndarray]] = []
    considered = 0
    for t in tps:
        sps = [0, 1] if t > 1 else [0]
        sps = [s for s in sps if "sequence_parallel" not in fix
               or s == int(bool(fix["sequence_parallel"]))]
        etps = sorted({t, 1}) if model.is_moe else [t]
        etps = _allowed(fix, "etp", etps) if fix.get("etp") is not None else etps
        for cp in cps:
            for p in pps:
                sched_v: list[tuple[int, int]] = []
                if p == 1:
                    sched_v = [(SCHEDULES.index("1f1b"), 1)]
                else:
                    for s in ("gpipe", "1f1b", "zb-h1"):
                        sched_v.append((SCHEDULES.index(s), 1))
                    for v in range(2, opt.max_virtual_stages + 1):
                        sched_v.append((SCHEDULES.index("interleaved"), v))
                if "schedule" in fix:
                    sched_v = [(s, v) for s, v in sched_v if SCHEDULES[s] == fix["schedule"]]
                if "virtual_stages" in fix:
                    sched_v = [(s, v) for s, v in sched_v if v == fix["virtual_stages"]]
                for ep in eps:
                    for etp in etps:
                        inner = len(sps) * len(zeros) * len(mbss) * len(rcs)
                        for s_idx, v in sched_v:
                            count = inner
                            considered += count
                            mp = t * p * cp
                            if n % mp:
                                rejected[R_WORLD] += count
                                continue
                            dp = n // mp
                            if "dp" in fix and fix["dp"] is not None and fix["dp"] != dp:
                                considered -= count
                                continue
                            if not cross and (t > gpn or gpn % t):
                                rejected[R_TP_NODE] += count
                                continue
                            if heads % t or kv % t or ffn % t:
                                rejected[R_HEADS] += count
                                continue
                            if cp > 1 and training.seq_len % (2 * cp):
                                rejected[R_SEQ] += count
                                continue
                            uneven = L % (p * v) != 0
                            if p > L or (uneven and (v > 1 or not opt.uneven_layers)):
                                rejected[R_LAYERS] += count
                                continue
                            if (not model.is_moe and (ep > 1 or etp != t)) or (model.is_moe and (
                                    (t * cp * dp) % (ep * etp) or model.num_experts % ep
                                    or model.expert_ffn % etp)):
                                rejected[R_EXPERTS] += count
                                continue
                            ok_mbs = mbss[(B % (mbss * dp)) == 0]
                            rejected[R_BATCH] += (len(mbss) - len(ok_mbs)) * (count // len(mbss))
                            if not len(ok_mbs):
                                continue
                            g_sp, g_z, g_m, g_rc = np.meshgrid(
                                np.array(sps, dtype=np.int64), zeros, ok_mbs, rcs,
                                indexing="ij")
                            k = g_sp.size
                            blocks.append({
                                "tp": np.full(k, t), "pp": np.full(k, p), "dp": np.full(k, dp),
                                "cp": np.full(k, cp), "ep": np.full(k, ep),
                                "etp": np.full(k, etp), "sp": g_sp.ravel(),
                                "zero": g_z.ravel(), "mbs": g_m.ravel(),
                                "sched": np.full(k, s_idx), "v": np.full(k, v),
                                "rc": g_rc.ravel(), "m": B // (dp * g_m.ravel()),
                                "uneven": np.full(k, int(uneven)),
                            })
    keys = ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "mbs", "sched", "v", "rc", "m",
            "uneven")
    if blocks:
        cols = {k: np.concatenate([b[k] for b in blocks]).astype(np.int64) for k in keys}
    else:
        cols = {k: np.zeros(0, dtype=np.int64) for k in keys}
    return PlanSpace(model, cluster, training, cols, constants, rejected, considered)


@dataclass
class Evaluation:
    """Per-plan results of ``evaluate_space`` (arrays aligned with the space's rows).

    ``time`` holds the StepReport ``time_s`` breakdown keys; ``peak_gib`` the worst stage's
    peak memory (GiB); ``exact`` is False where the pipeline span is the closed-form
    approximation (uneven splits) rather than what ``simulate()`` returns.
    """

    step_time_s: np.ndarray
    peak_gib: np.ndarray
    worst_stage: np.ndarray
    capacity_gib: float
    time: dict[str, np.ndarray]
    exact: np.ndarray

    @property
    def feasible(self) -> np.ndarray:
        return self.peak_gib <= self.capacity_gib


def _key_index(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows of stacked non-negative integer columns and each row's index into them."""
    code = np.zeros(cols[0].shape[0], dtype=np.int64)
    for col in cols:  # mixed-radix code of the row (fits int64 for plan-sized values)
        code = code * (int(col.max()) + 1) + col
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    return np.stack(cols, axis=1)[first], inv.reshape(-1)


def _lines(topo, group: tuple[int, ...], kind: str) -> np.ndarray:
    """(3, 2) array of (alpha, beta) lines, padded with (inf, 0); (0, 0) for a group of one."""
    out = np.zeros((3, 2))
    out[:, 0] = np.inf
    lines = collective_lines(topo, group, kind) if len(group) > 1 else [(0.0, 0.0)]
    for i, (a, b) in enumerate(lines):
        out[i] = (a, b)
    return out


def _chunked(lines: np.ndarray, nbytes: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    """``chunks`` equal collectives moving ``nbytes`` in all: min over lines (per plan)."""
    chunks = np.maximum(1.0, chunks)
    with np.errstate(invalid="ignore"):
        t = np.min(chunks[:, None] * lines[:, :, 0] + lines[:, :, 1] * nbytes[:, None], axis=1)
    return np.where(nbytes > 0, t, 0.0)


@dataclass
class _Context:
    """Per-search constants and per-key tables shared by the blocks of ``evaluate_space``."""

    dev: Device
    cb: float
    grad_bytes: np.ndarray
    """Gradient bytes per element on the wire, per plan."""
    slow: float
    opt_coef: float
    overlap: bool
    interval: float
    capacity_bytes: float
    exact_interleaved: bool
    inv: np.ndarray
    lc: np.ndarray
    acts: np.ndarray
    head: np.ndarray
    ginv: np.ndarray
    ar: np.ndarray
    ag: np.ndarray
    rs: np.ndarray
    einv: np.ndarray
    ear: np.ndarray
    eag: np.ndarray
    ers: np.ndarray
    edp: np.ndarray
    t_p2p: np.ndarray
    kind_eff: tuple[float, float] = (1.0, 1.0)
    """Library speed on reduce-scatter and all-gather (``ClusterSpec.collective_efficiency``)."""


def evaluate_space(space: PlanSpace, progress: Callable[[int, int], None] | None = None, *,
                   exact_interleaved: bool = True, times_for_oom: bool = False,
                   workers: int | None = None) -> Evaluation:
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
    topo = cluster.topology
    gpu = cluster.gpu
    dev = Device.of(gpu, training.precision, training.kernels)
    const = space.constants
    overlap = bool(const.get("overlap_grad_reduce", True))
    interval = float(const.get("dp_sync_interval", 1))
    cb = float(training.compute_bytes)
    # Gradient bytes per element on the wire (simulator.compression): PowerSGD's depends on
    # the TP/expert-TP shard shapes, so one value per (tp, etp).
    knobs = {k: const[k] for k in COMPRESSION_FIELDS if k in const}
    utp, tinv = _key_index([c["tp"], c["etp"]])
    per_tp = np.array([effective_grad_bytes(model, training, ParallelPlan(
        tp=int(t_), etp=int(e_) if int(e_) else None, **knobs)) for t_, e_ in utp])
    grad_bytes = per_tp[tinv]
    pp_fraction = pp_ratio(training, ParallelPlan(**knobs))
    slow = dev.nccl_slowdown
    opt_coef = optimizer_step_time(1.0, training, dev)
    capacity = float(gpu.memory_GiB)

    out_step = np.full(n, np.nan)
    out_peak = np.zeros(n)
    out_worst = np.zeros(n, dtype=np.int64)
    exact = np.ones(n, dtype=bool)
    tkeys = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble",
             "optimizer", "exposed_comm")
    times = {k: np.zeros(n) for k in tkeys}
    if n == 0:
        return Evaluation(out_step, out_peak, out_worst, capacity, times, exact)

    # ---- per-layer quantities, once per (tp, cp, sp, mbs, rc, ep, etp) ---------------------
    uniq, inv = _key_index([c["tp"], c["cp"], c["sp"], c["mbs"], c["rc"], c["ep"], c["etp"]])
    nk = len(uniq)
    lc = np.zeros((nk, 2, 7))  # [key, dense/moe, fwd bwd wgrad compute tp cp ep]
    acts = np.zeros((nk, 3))  # dense, moe, working bytes
    head = np.zeros((nk, 3))  # LM head (+ edge TP collectives) fwd, bwd, their TP part
    parts: dict[tuple[int, ...], tuple[LayerParts, LayerParts, tuple[float, ...]]] = {}
    for i, (t, cp, sp, mbs, rc, ep, etp) in enumerate(uniq):
        plan = ParallelPlan(tp=int(t), cp=int(cp), sequence_parallel=bool(sp),
                            micro_batch_size=int(mbs), recompute=RECOMPUTES[rc], ep=int(ep),
                            etp=int(etp), **{k: v for k, v in const.items()
                                             if k in ("tp_comm_overlap",)})
        base = (int(t), int(cp), int(sp), int(mbs), int(ep), int(etp))
        if base not in parts:  # everything but recompute
            dp_ = layer_parts(model, topo, training, plan, dev, moe=False)
            ht = head_times(model, topo, training, plan, dev)
            parts[base] = (dp_, layer_parts(model, topo, training, plan, dev, moe=True)
                           if model.is_moe else dp_, (ht.fwd, ht.bwd, ht.tp))
        pd, pm, head[i] = parts[base]
        for j, pt in enumerate((pd, pm)):
            x = compose_layer_cost(pt, RECOMPUTES[rc])
            lc[i, j] = (x.fwd, x.bwd, x.wgrad, x.compute, x.tp, x.cp, x.ep)
        la = layer_activations(model, training, plan)
        acts[i] = (la.dense, la.moe, la.working)

    # ---- collective lines per group ---------------------------------------------------------
    tp_, cp_, dp_, ep_, etp_ = c["tp"], c["cp"], c["dp"], c["ep"], c["etp"]
    edp = np.maximum(1, dp_ * cp_ * tp_ // (ep_ * etp_))
    ug, ginv = _key_index([tp_, cp_ * dp_])
    ar = np.zeros((len(ug), 3, 2))
    ag = np.zeros((len(ug), 3, 2))
    rs = np.zeros((len(ug), 3, 2))
    for i, (t, k) in enumerate(ug):
        group = tuple(int(t) * j for j in range(int(k)))
        ar[i], ag[i], rs[i] = (_lines(topo, group, kind) for kind in
                               ("all_reduce", "all_gather", "reduce_scatter"))
    ear = eag = ers = np.zeros((1, 3, 2))
    einv = np.zeros(n, dtype=np.int64)
    if model.is_moe:
        ue, einv = _key_index([etp_ * ep_, edp])
        ear = np.zeros((len(ue), 3, 2))
        eag = np.zeros((len(ue), 3, 2))
        ers = np.zeros((len(ue), 3, 2))
        for i, (stride, k) in enumerate(ue):
            group = tuple(int(stride) * j for j in range(int(k)))
            ear[i], eag[i], ers[i] = (_lines(topo, group, kind) for kind in
                                      ("all_reduce", "all_gather", "reduce_scatter"))
    # Pipeline sends in rank order: the slowest stage boundary paces (simulate's rule,
    # collectives.pipeline_p2p): the time is the max over the distinct (latency, bandwidth)
    # lines of each (span, pp, tp).
    span_ranks = dp_ * tp_ * cp_
    uk, kinv = _key_index([span_ranks, c["pp"], tp_])
    per_key = [pipeline_p2p_lines(topo, int(span), int(p_), int(t_))
               if int(p_) > 1 and int(span) * int(p_) <= cluster.num_gpus else []
               for span, p_, t_ in uk]
    p2p_lines = np.zeros((len(uk), max(1, *(len(x) for x in per_key)), 2))
    p2p_lines[:, :, 1] = np.inf  # padding lines: 0 latency, infinite bandwidth
    for i, lines in enumerate(per_key):
        for j, line in enumerate(lines):
            p2p_lines[i, j] = line
    act_bytes = c["mbs"] * training.seq_len / cp_ * model.hidden_size * cb * pp_fraction
    lines_of = p2p_lines[kinv.reshape(-1)]
    t_p2p = np.where(c["pp"] > 1, np.max(lines_of[:, :, 0] + (act_bytes / tp_)[:, None]
                                         / lines_of[:, :, 1], axis=1), 0.0)

    ctx = _Context(dev=dev, cb=cb, grad_bytes=grad_bytes, slow=slow, opt_coef=opt_coef,
                   overlap=overlap, interval=interval, capacity_bytes=capacity * GiB,
                   exact_interleaved=exact_interleaved, inv=inv, lc=lc, acts=acts, head=head,
                   ginv=ginv, ar=ar, ag=ag, rs=rs, einv=einv, ear=ear, eag=eag, ers=ers,
                   edp=edp, t_p2p=t_p2p,
                   kind_eff=(kind_efficiency(topo, "reduce_scatter"),
                             kind_efficiency(topo, "all_gather")))
    pv, pvinv = _key_index([c["pp"], c["v"]])
    order = np.argsort(pvinv, kind="stable")
    bounds = np.searchsorted(pvinv[order], np.arange(len(pv) + 1))
    blocks = [(int(p), int(v), order[bounds[g]:bounds[g + 1]]) for g, (p, v) in enumerate(pv)]
    blocks.sort(key=lambda b: -len(b[2]))  # largest first balances the workers

    def run(block: tuple[int, int, np.ndarray]) -> int:
        p, v, idx = block
        _evaluate_block(space, p, v, idx, ctx, out_step, out_peak, out_worst, times, exact,
                        times_for_oom)
        return len(idx)

    # numpy releases the GIL inside its array loops, so blocks (disjoint rows) evaluate in
    # parallel threads; results are written to disjoint slices of the output arrays.
    done = 0
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(blocks)))) as pool:
        for count in pool.map(run, blocks):
            done += count
            if progress is not None:
                progress(done, n)
    return Evaluation(out_step, out_peak, out_worst, capacity, times, exact)


def _evaluate_block(space: PlanSpace, p: int, v: int, idx: np.ndarray, ctx: _Context,
                    out_step: np.ndarray, out_peak: np.ndarray, out_worst: np.ndarray,
                    times: dict[str, np.ndarray], exact: np.ndarray, times_for_oom: bool,
                    ) -> None:
    """Evaluate the plans ``idx`` that share pp = ``p`` and vpp = ``v`` (in place)."""
    model, training, c = space.model, space.training, space.cols
    L = model.num_layers
    cb = ctx.cb
    chunks = even_split(L, p * v)
    starts = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    all_layers = [sum(chunks[ch * p + r] for ch in range(v)) for r in range(p)]
    all_moe = [sum(moe_layers_in(model, int(starts[ch * p + r]), chunks[ch * p + r])
                   for ch in range(v)) if model.is_moe else 0 for r in range(p)]
    # Stages with the same (layers, MoE layers, first, last) differ only in in-flight
    # micro-batches, which never grow with the stage index; so each class's first stage is
    # the one that can be the slowest or fullest, and sums over stages need only class counts.
    firsts: dict[tuple, int] = {}
    counts: Counter = Counter()
    for r in range(p):
        key = (all_layers[r], all_moe[r], r == 0, r == p - 1)
        firsts.setdefault(key, r)
        counts[key] += 1
    rr = np.array(sorted(firsts.values()))
    cnt = np.array([counts[(all_layers[r], all_moe[r], r == 0, r == p - 1)] for r in rr],
                   dtype=float)
    layers = np.array([all_layers[r] for r in rr], dtype=float)
    nmoe = np.array([all_moe[r] for r in rr], dtype=float)
    ndense = layers - nmoe
    first = (rr == 0).astype(float)
    last = (rr == p - 1).astype(float)
    k = len(rr)

    # ---- memory per stage (all plans of the block) ------------------------------------------
    t = c["tp"][idx].astype(float)
    ep, etp = c["ep"][idx], c["etp"][idx]
    dp, cp = c["dp"][idx], c["cp"][idx]
    z = c["zero"][idx]
    sched = c["sched"][idx]
    mi = c["m"][idx]
    m = mi.astype(float)
    e_dp = ctx.edp[idx]
    shared = model.moe_layer_shared_params if model.is_moe else 0.0
    head_params = model.lm_head_params + (model.vocab_size * model.hidden_size
                                          if model.tie_word_embeddings and p > 1 else 0)
    dense_r = (ndense * model.dense_layer_params + nmoe * shared
               + first * model.embedding_params + last * head_params)[None, :] / t[:, None]
    if model.is_moe:
        exp_r = (nmoe * model.num_experts * model.expert_params)[None, :] \
            / (ep * etp).astype(float)[:, None]
    else:
        exp_r = np.zeros((len(idx), k))
    ddp = (dp * cp).astype(float)[:, None]
    edp2 = e_dp.astype(float)[:, None]
    zz = z[:, None]
    w_d = np.where(zz >= 3, dense_r / ddp, dense_r)
    g_d = np.where(zz >= 2, dense_r / ddp, dense_r)
    o_d = np.where(zz >= 1, dense_r / ddp, dense_r)
    if model.is_moe:
        w_d = w_d + np.where(zz >= 3, exp_r / edp2, exp_r)
        g_d = g_d + np.where(zz >= 2, exp_r / edp2, exp_r)
        o_d = o_d + np.where(zz >= 1, exp_r / edp2, exp_r)
    weights, grads = w_d * cb, g_d * cb
    optim = o_d * training.optimizer_state_bytes_per_param
    mbs = c["mbs"][idx].astype(float)
    s_local = training.seq_len / cp.astype(float)
    per_logit = 14.0 if training.kernels == "eager" else 6.0
    a = ctx.acts[ctx.inv[idx]]
    act_static = np.where(layers[None, :] > 0, a[:, 2, None], 0.0) \
        + last[None, :] * (per_logit * s_local * mbs * model.vocab_size / t)[:, None] \
        + first[None, :] * (2.0 * s_local * mbs * model.hidden_size)[:, None]
    if model.is_moe:
        layer_params = np.maximum(model.dense_layer_params,
                                  model.moe_layer_params / np.maximum(1, ep))
    else:
        layer_params = float(model.dense_layer_params)
    other = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES \
        + np.where(z == 3, 2.0 * layer_params / t * cb, 0.0)[:, None] \
        + np.where((dp > 1) & (z < 3), 1.0, 0.0)[:, None] \
        * np.minimum(dense_r + exp_r, DDP_BUCKET_ELEMENTS) * 4.0
    infl = _inflight(sched, p, mi, v, rr)
    act = (ndense[None, :] * a[:, 0, None] + nmoe[None, :] * a[:, 1, None]) * infl + act_static
    tensors = weights + grads + optim + act
    peak = weights + grads + optim + act + (other + ALLOCATOR_FRAGMENTATION * tensors)
    worst = np.argmax(peak, axis=1)
    rows = np.arange(len(idx))
    peak_w = peak[rows, worst]
    out_peak[idx] = peak_w / GiB
    out_worst[idx] = rr[worst]

    # ---- time, for the plans that fit ----------------------------------------------------
    keep = np.ones(len(idx), dtype=bool) if times_for_oom else peak_w / GiB <= \
        ctx.capacity_bytes / GiB
    if not keep.any():
        return
    sel = np.nonzero(keep)[0]
    idx = idx[sel]
    rows = np.arange(len(idx))
    t, dp, cp, z, sched, mi, m, e_dp = (x[sel] for x in (t, dp, cp, z, sched, mi, m, e_dp))
    dense_r, exp_r = dense_r[sel], exp_r[sel]
    key = ctx.inv[idx]
    ld, lm, hh = ctx.lc[key, 0], ctx.lc[key, 1], ctx.head[key]

    def stage(col: int) -> np.ndarray:
        return ndense[None, :] * ld[:, col, None] + nmoe[None, :] * lm[:, col, None]

    f = stage(0) + last[None, :] * hh[:, 0, None]
    b = stage(1) + last[None, :] * hh[:, 1, None]
    w = stage(2)
    fb = f + b
    crit = np.argmax(fb, axis=1)
    mean_f, mean_b, mean_w = f @ cnt / p, b @ cnt / p, w @ cnt / p
    cc = ctx.t_p2p[idx] if p > 1 else np.zeros(len(idx))
    total, base, odd = _pipeline_span(sched, p, mi, v, mean_f, mean_b, mean_w, cc,
                                      ctx.exact_interleaved)
    fb_c = fb[rows, crit]
    span = total + m * (fb_c - mean_f - mean_b)
    pp_comm = total - base
    bubble = np.maximum(0.0, span - m * fb_c - pp_comm)

    dense0, exp0 = dense_r[rows, crit], exp_r[rows, crit]
    units = np.maximum(1.0, layers[crit])
    need = (cp * dp > 1) | (e_dp > 1)
    z3 = z == 3
    g = ctx.ginv[idx]
    gb = ctx.grad_bytes[idx]
    gather = _chunked(ctx.ag[g], dense0 * cb, units)
    scatter = _chunked(ctx.rs[g], dense0 * gb, units)
    # DDP all-reduces buckets; ZeRO-1/2 reduce-scatter grads and all-gather params, each half
    # an all-reduce on its volume over the library's speed on that kind (step.py).
    z12 = (z == 1) | (z == 2)
    eff_rs, eff_ag = ctx.kind_eff

    def _reduce(ar_l: np.ndarray, count: np.ndarray) -> np.ndarray:
        buckets = count / DDP_BUCKET_ELEMENTS
        grads = _chunked(ar_l, count * gb, buckets)
        return np.where(z12, 0.5 * grads / eff_rs
                        + 0.5 * _chunked(ar_l, count * cb, buckets) / eff_ag, grads)

    sync = _reduce(ctx.ar[g], dense0)
    if model.is_moe:
        e = ctx.einv[idx]
        has = exp0 != 0
        gather = gather + np.where(has, _chunked(ctx.eag[e], exp0 * cb, units), 0.0)
        scatter = scatter + np.where(has, _chunked(ctx.ers[e], exp0 * gb, units), 0.0)
        sync = sync + np.where(has, _reduce(ctx.ear[e], exp0), 0.0)
    per_mb = 2 * gather + scatter
    z3_exp = m * (np.maximum(0.0, per_mb - fb_c) + np.minimum(per_mb, fb_c) * ctx.slow) \
        + gather / units
    if ctx.overlap:
        window = b[:, 0]
        buckets = np.maximum(1.0, (dense0 + exp0) / DDP_BUCKET_ELEMENTS)
        dpt = np.maximum(sync - window, sync / buckets) + np.minimum(sync, window) * ctx.slow
    else:
        dpt = sync
    dp_time = np.where(need & ~z3, dpt, 0.0) / ctx.interval
    zero3 = np.where(need & z3, z3_exp, 0.0)
    shard = np.where(z >= 1, (dp * cp).astype(float), 1.0)
    eshard = np.where(z >= 1, e_dp.astype(float), 1.0)
    opt = (dense0 / shard + exp0 / eshard) * ctx.opt_coef

    out_step[idx] = span + dp_time + zero3 + opt
    comp = stage(3) + last[None, :] * (hh[:, 0] + hh[:, 1] - hh[:, 2])[:, None]
    tp_c = m * (stage(4) + last[None, :] * hh[:, 2, None])[rows, crit]
    cp_c = m * stage(5)[rows, crit]
    ep_c = m * stage(6)[rows, crit]
    times["compute"][idx] = m * comp[rows, crit]
    times["tp_comm"][idx] = tp_c
    times["cp_comm"][idx] = cp_c
    times["ep_comm"][idx] = ep_c
    times["pp_comm"][idx] = pp_comm
    times["dp_comm"][idx] = dp_time + zero3
    times["bubble"][idx] = bubble
    times["optimizer"][idx] = opt
    times["exposed_comm"][idx] = tp_c + cp_c + ep_c + pp_comm + dp_time + zero3
    exact[idx] &= (c["uneven"][idx] == 0) & ~odd


def _inflight(sched: np.ndarray, p: int, m: np.ndarray, v: int,
              stages: np.ndarray) -> np.ndarray:
    """``pipeline.inflight_microbatches`` for every plan (rows) and stage in ``stages``."""
    r = stages[None, :]
    mm = m[:, None].astype(float)
    out = np.minimum(p - r, mm)  # 1f1b
    gp = sched == SCHEDULES.index("gpipe")
    zb = sched == SCHEDULES.index("zb-h1")
    il = (sched == SCHEDULES.index("interleaved")) & (v > 1)
    out = np.where(gp[:, None], mm, out)
    out = np.where(zb[:, None], np.minimum(p, mm), out)
    if il.any():
        um, minv = np.unique(m, return_inverse=True)
        g = np.array([_group_size(p, int(x)) for x in um], dtype=float)[minv.reshape(-1), None]
        inter = np.minimum(2 * (p - r - 1) + (v - 1) * g + 1, mm * v) / v
        out = np.where(il[:, None], inter, out)
    return out


def _pipeline_span(sched: np.ndarray, p: int, m: np.ndarray, v: int, tf: np.ndarray,
                   tb: np.ndarray, tw: np.ndarray, c: np.ndarray, exact: bool,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pipeline.pipeline_time`` total with and without transfers, for every plan.

    Interleaved with m >= p and m % p != 0 has no closed form; with ``exact`` those plans run
    the scalar ``pipeline_time`` (event simulation on equal stages), cached on identical
    inputs; without, they keep the m % p == 0 form (n = m v + p - 1 chunk slots), a lower
    bound on both totals (checked against the event simulation in the tests). Returns
    (total, total without transfers, mask of plans given the bound).
    """
    mf = m.astype(float)
    if p == 1:
        c = np.zeros_like(c)

    def span(cc: np.ndarray) -> np.ndarray:
        n1 = mf + p - 1
        out = n1 * (tf + tb) + 2 * n1 * cc  # gpipe, 1f1b
        f, bb, w = tf + cc, tb - tw + cc, tw
        zb = np.maximum(np.maximum(np.maximum(mf, p) * f + n1 * bb + mf * w,
                                   n1 * f + mf * bb + mf * w),
                        n1 * (f + bb) + np.maximum(1.0, mf - p + 1) * w)
        out = np.where(sched == SCHEDULES.index("zb-h1"), zb, out)
        if v > 1:
            ni = np.where(mf >= p, mf * v + p - 1, mf + v * p - 1)
            il = ni * (tf + tb) / v + 2 * ni * cc
            out = np.where(sched == SCHEDULES.index("interleaved"), il, out)
        return out

    total = span(c)
    base = np.where(c > 0, span(np.zeros_like(c)), total)
    odd_mask = np.zeros(len(m), dtype=bool)
    if v > 1:
        odd_mask = (sched == SCHEDULES.index("interleaved")) & (m >= p) & (m % p != 0)
    if exact:
        cache: dict[tuple, tuple[float, float]] = {}
        for j in np.nonzero(odd_mask)[0]:
            key = (int(m[j]), float(tf[j]), float(tb[j]), float(c[j]))
            if key not in cache:
                pt = pipeline_time("interleaved", p, key[0], key[1], key[2], v=v, t_p2p=key[3])
                cache[key] = (pt.total_s, pt.total_s - pt.p2p_s)
            total[j], base[j] = cache[key]
        odd_mask[:] = False
    return total, base, odd_mask
