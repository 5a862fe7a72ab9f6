"""``build_space``: every homogeneous plan of a (model, cluster, training) that passes the
trainers' start-up rules, as integer columns; rejected plans counted by reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from paraplan.search.space.fix import CONSTANT_FIELDS, RECOMPUTES, check_searched_recompute
from paraplan.search.space.trainer_filter import (
    check_trainer_inputs,
    structural_reason,
    trainer_mask,
)
from paraplan.simulator.pipeline import SCHEDULES
from paraplan.simulator.stages import pipeline_chunks
from paraplan.specs.checks import divisors
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec, tp_overlap
from paraplan.specs.training import TrainingSpec

# Why build_space rejects a plan (the keys of PlanSpace.rejected), in the order they are
# tested: a plan is counted under the first it breaks.
R_WORLD = "tp*pp*cp does not divide the GPU count"
R_TP_NODE = "tp exceeds or does not divide the GPUs per node"
R_HEADS = "tp does not divide the attention/KV heads or the FFN width"
R_SEQ = "seq_len not divisible by 2*cp"
R_LAYERS = "pp exceeds the layers, or pp*vpp does not divide them (interleaving)"
R_EXPERTS = "ep*etp does not divide tp*cp*dp, ep the experts, or etp the expert width"
R_BATCH = "global batch not divisible by micro_batch_size*dp"


@dataclass(frozen=True)
class SpaceOptions:
    """Bounds of the enumerated space (a demanding user widens them with --fix)."""

    max_cp: int = 32
    """Largest context-parallel degree tried."""
    max_micro_batch: int = 128
    """Largest micro-batch size tried (divisors of the global batch up to this)."""
    max_virtual_stages: int | None = None
    """Largest number of interleaved model chunks per pipeline rank tried; None: every count
    that splits the layers evenly (down to one layer per chunk, as Nemotron-4 340B's vpp=12
    recipe runs), within what the trainer can express."""
    uneven_layers: bool = True
    """Allow pp that does not divide the layers (near-even split, non-interleaved)."""
    expert_parallel_only: bool = False
    """Only plans with expert parallelism (ep > 1): a search under a second MoE run setting
    (``search.dispatch.moe_runs``), where plans without it price as under the first (the
    dispatcher has no group to send to, the overlap needs ep > 1) and are left to it."""


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
    trainer: TrainerSpec | None = None
    """The trainer every plan must run on (None: any plan the simulator prices)."""
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    """Per-key costs the evaluator has computed for this space's model, cluster and trainer,
    shared with the spaces derived from it (``derive_space``: the same plans under another
    MoE run setting), keyed by what each cost reads (``evaluate._key_tables``)."""

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
        if self.trainer is not None and "tp_comm_overlap" not in self.constants:
            data["tp_comm_overlap"] = tp_overlap(self.trainer.runs, c["tp"], bool(c["sp"]))
        if c["uneven"]:
            data["layers_per_stage"] = pipeline_chunks(self.model.num_layers, c["pp"], c["v"])
        return ParallelPlan(**data)

    def subset(self, mask: np.ndarray) -> PlanSpace:
        """Rows where ``mask`` is true (rejection counts are kept)."""
        return PlanSpace(self.model, self.cluster, self.training,
                         {k: v[mask] for k, v in self.cols.items()}, self.constants,
                         Counter(self.rejected), self.considered, self.trainer, self.memo)


HEADER_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "etp", "sched", "v", "uneven")
GRID_COLUMNS = ("sp", "zero", "mbs", "rc")


def _columns(blocks: list[tuple[tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...]]]],
             zeros: np.ndarray, rcs: np.ndarray, batch: int) -> dict[str, np.ndarray]:
    """The space's columns from its row blocks: each block's structural fields repeated over
    its (sp, zero, mbs, recompute) grid, in that order with recompute fastest; each distinct
    grid is built once."""
    if not blocks:
        return {k: np.zeros(0, dtype=np.int64) for k in (*HEADER_COLUMNS, *GRID_COLUMNS, "m")}
    grids: dict[tuple[tuple[int, ...], tuple[int, ...]], list[np.ndarray]] = {}
    for _, key in blocks:
        if key not in grids:
            sps, mbs = key
            mesh = np.meshgrid(np.array(sps, dtype=np.int64), zeros,
                               np.array(mbs, dtype=np.int64), rcs, indexing="ij")
            grids[key] = [g.ravel() for g in mesh]
    sizes = np.array([grids[key][0].size for _, key in blocks])
    heads = np.array([h for h, _ in blocks], dtype=np.int64)
    cols = {name: np.repeat(heads[:, j], sizes) for j, name in enumerate(HEADER_COLUMNS)}
    for j, name in enumerate(GRID_COLUMNS):
        cols[name] = np.concatenate([grids[key][j] for _, key in blocks])
    cols["m"] = batch // (cols["dp"] * cols["mbs"])
    return cols


def _allowed(fix: dict[str, Any], key: str, values: list[Any]) -> list[Any]:
    if key in fix and fix[key] is not None:
        return [v for v in values if v == fix[key]] or [fix[key]]
    return values


def build_space(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                fix: dict[str, Any] | None = None,
                options: SpaceOptions | None = None,
                trainer: TrainerSpec | None = None) -> PlanSpace:
    """Enumerate the legal plans of a homogeneous search (rules as in ``check_plan``); with a
    ``trainer``, only those it can express (``trainer_filter``), run as it runs them."""
    fix = dict(fix or {})
    opt = options or SpaceOptions()
    n = cluster.num_gpus
    L = model.num_layers
    B = training.global_batch_size
    gpn = min(g.gpus_per_node for g in cluster.node_groups)
    cross = bool(fix.get("allow_cross_node_tp", False))
    constants = {k: fix[k] for k in CONSTANT_FIELDS if k in fix}
    if trainer is not None:
        check_trainer_inputs(trainer, model, training, constants)
        constants.setdefault("overlap_grad_reduce", trainer.runs.overlap_grad_reduce)
        constants.setdefault("overlap_p2p_comm", trainer.runs.overlap_p2p)
    rejected: Counter = Counter()

    tps = _allowed(fix, "tp", divisors(n) if cross else divisors(gpn))
    cps = _allowed(fix, "cp", [c for c in divisors(n) if c <= opt.max_cp])
    pps = _allowed(fix, "pp", [p for p in divisors(n) if p <= L])
    eps = _allowed(fix, "ep", divisors(model.num_experts) if model.is_moe else [1])
    mbss = np.array(_allowed(fix, "micro_batch_size",
                             [b for b in divisors(B) if b <= opt.max_micro_batch]), dtype=np.int64)
    zeros = np.array(_allowed(fix, "zero_stage", [0, 1, 2, 3]), dtype=np.int64)
    check_searched_recompute(fix.get("recompute"))
    rcs = np.array([RECOMPUTES.index(r) for r in
                    _allowed(fix, "recompute", list(RECOMPUTES))], dtype=np.int64)
    heads, kv, ffn = model.num_attention_heads, model.kv_heads, model.ffn_hidden_size
    for group in cluster.node_groups:
        if training.precision not in group.gpu.peak_tflops:
            raise SpecError(f"precision={training.precision} is not supported by "
                            f"{group.gpu.name}", field="precision", value=training.precision,
                            allowed=sorted(group.gpu.peak_tflops))

    # One row block per structural choice: its fields, and the (sp, zero, mbs, recompute)
    # grid it spans (the sp values and the micro-batches that divide the batch).
    blocks: list[tuple[tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...]]]] = []
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
                    # Interleaving: chunks that split the layers evenly, or Megatron-Core's
                    # split that counts the embedding and the loss as a layer each
                    # (stages.accounted_split; Llama 3.1 405B's and Qwen3-235B's recipes).
                    top = (L + 2) // p if opt.max_virtual_stages is None else \
                        opt.max_virtual_stages
                    for v in range(2, top + 1):
                        if pipeline_chunks(L, p, v) is not None:
                            sched_v.append((SCHEDULES.index("interleaved"), v))
                if "schedule" in fix:
                    sched_v = [(s, v) for s, v in sched_v if SCHEDULES[s] == fix["schedule"]]
                if "virtual_stages" in fix:
                    sched_v = [(s, v) for s, v in sched_v if v == fix["virtual_stages"]]
                for ep in eps:
                    for etp in etps:
                        if opt.expert_parallel_only and ep == 1:
                            continue  # outside this space (not a rejection)
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
                            # uneven: v = 1 with the remainder on the first stages, or an
                            # interleaved accounted split (stages.pipeline_chunks)
                            uneven = L % (p * v) != 0
                            if p > L or (uneven and not opt.uneven_layers):
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
                            refused = trainer and structural_reason(trainer, t, p, s_idx)
                            if refused:  # counted as trainer_mask would, rows never built
                                rejected[refused] += count // len(mbss) * len(ok_mbs)
                                continue
                            blocks.append(((t, p, dp, cp, ep, etp, s_idx, v, int(uneven)),
                                           (tuple(sps), tuple(ok_mbs.tolist()))))
    cols = _columns(blocks, zeros, rcs, B)
    if trainer is not None:
        keep, refused = trainer_mask(cols, trainer, model, training)
        cols = {k: v[keep] for k, v in cols.items()}
        rejected.update(refused)
    return PlanSpace(model, cluster, training, cols, constants, rejected, considered, trainer)


def derive_space(base: PlanSpace, training: TrainingSpec) -> PlanSpace:
    """The plans of ``base`` with expert parallelism (ep > 1), under another MoE run setting
    ``training``, with that setting's trainer rules (the all-to-all overlap's): what
    ``build_space`` with ``SpaceOptions(expert_parallel_only=True)`` gives for ``training``,
    without enumerating the grid again. ``base`` must have been built without the overlap
    (its rules are then a subset of the derived space's). ``considered`` counts the base
    plans with ep > 1; ``rejected`` only what this setting's rules refuse."""
    if base.training.moe_a2a_overlap:
        raise ValueError("derive_space needs a base space built without the all-to-all overlap")
    keep = base.cols["ep"] > 1
    cols = {k: v[keep] for k, v in base.cols.items()}
    considered = int(keep.sum())
    rejected: Counter = Counter()
    if base.trainer is not None:
        check_trainer_inputs(base.trainer, base.model, training, base.constants)
        mask, rejected = trainer_mask(cols, base.trainer, base.model, training)
        cols = {k: v[mask] for k, v in cols.items()}
    return PlanSpace(base.model, base.cluster, training, cols, dict(base.constants), rejected,
                     considered, base.trainer, base.memo)


def run_spaces(model: ModelSpec, cluster: ClusterSpec, runs: list[TrainingSpec],
               fix: dict[str, Any] | None = None, options: SpaceOptions | None = None,
               trainer: TrainerSpec | None = None) -> Iterator[PlanSpace]:
    """The plan space of each MoE run setting of ``runs`` (``search.moe_runs``), in order:
    the first built in full; the others its plans with ep > 1 under their own rules
    (``derive_space``), or, when the first has the overlap (its rules are then not a subset),
    built with ``expert_parallel_only``."""
    base: PlanSpace | None = None
    for j, run in enumerate(runs):
        if base is not None:
            yield derive_space(base, run)
            continue
        opts = options if j == 0 else replace(options or SpaceOptions(),
                                              expert_parallel_only=True)
        space = build_space(model, cluster, run, fix, opts, trainer)
        if j == 0 and not run.moe_a2a_overlap:
            base = space
        yield space
