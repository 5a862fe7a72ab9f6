"""The structural choices of the outer loop (tp, pp, dp, cp, micro-batch, recompute, ZeRO),
filtered by ``fix``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from paraplan.search.ilp.context import Choice, Ctx, activations, layer_costs
from paraplan.search.space import CONSTANT_FIELDS, RECOMPUTES, parse_fix
from paraplan.search.space.fix import check_searched_recompute
from paraplan.specs.checks import divisors
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ALIASES, ParallelPlan

CP_DEGREES = (1, 2, 4, 8)
"""Context-parallel degrees enumerated (pin another with ``fix``)."""
MAX_MICRO_BATCH = 16
"""Largest micro-batch size enumerated (pin a larger one with ``fix``)."""
_FIXABLE = ("tp", "pp", "dp", "cp", "ep", "etp", "sequence_parallel", "zero_stage",
            "micro_batch_size", "schedule", "virtual_stages", "recompute", *CONSTANT_FIELDS)




def normalise_fix(fix: dict[str, Any] | None) -> dict[str, Any]:
    """``fix`` with short names (mbs, rc, zero, sp, ...) expanded and values validated."""
    raw = parse_fix({ALIASES.get(str(k), str(k)): v for k, v in fix.items()}) if fix else {}
    for key in raw:
        if key not in _FIXABLE:
            raise SpecError(f"fix cannot pin {key!r} in the ILP search", field="fix",
                            value=key, allowed=list(_FIXABLE))
    if raw.get("schedule", "1f1b") != "1f1b":
        raise SpecError(f"fix schedule={raw['schedule']!r}: the ILP search models 1F1B "
                        "(its in-flight memory min(p-k, m)); pin schedule=1f1b or leave it out",
                        field="fix.schedule", value=raw["schedule"], allowed=["1f1b"])
    if raw.get("virtual_stages", 1) != 1:
        raise SpecError("fix virtual_stages must be 1: the ILP places whole stages",
                        field="fix.virtual_stages", value=raw["virtual_stages"], allowed=[1])
    if raw.get("allow_cross_node_tp"):
        raise SpecError("fix allow_cross_node_tp=true is not supported by the ILP search "
                        "(stages are laid out node by node)", field="fix.allow_cross_node_tp",
                        value=True, allowed=[False])
    check_searched_recompute(raw.get("recompute"))
    return raw


def pick(fix: dict[str, Any], key: str, values: Sequence[Any]) -> list[Any]:
    if fix.get(key) is not None:
        return [fix[key]]
    return list(values)


def tp_ok(model: ModelSpec, tp: int) -> bool:
    return not (model.num_attention_heads % tp or model.kv_heads % tp
                or model.ffn_hidden_size % tp)


def zero_stages(fix: dict[str, Any], dp: int) -> list[int]:
    """ZeRO stages worth solving for ``dp`` replicas.

    ZeRO-1 moves the same bytes as an all-reduce (reduce-scatter + all-gather; Rajbhandari
    et al. 2020, "ZeRO", communication analysis) and ``simulate`` prices them alike, while it
    shards more memory and shortens the optimizer step: ZeRO-1 dominates 0. ZeRO-2 shards
    the gradients too but, with several micro-batches, reduce-scatters them every micro-batch
    (``simulator.step``), so it dominates nothing: 1, 2 and 3 are all solved. With dp = 1
    nothing is sharded, so only ZeRO-0 is kept. ``fix`` overrides.
    """
    if fix.get("zero_stage") is not None:
        return [int(fix["zero_stage"])]
    return [1, 2, 3] if dp > 1 else [0]


def recomputes(ctx: Ctx, fix: dict[str, Any], base: ParallelPlan) -> list[str]:
    """Recompute modes not dominated by another (no more activation bytes per layer and no
    more seconds per layer on any GPU type); e.g. ``selective`` with flash attention keeps
    what ``none`` keeps and re-runs attention."""
    if fix.get("recompute") is not None:
        return [fix["recompute"]]
    stats = {}
    for rc in RECOMPUTES:
        plan = base.model_copy(update={"recompute": rc})
        la = activations(ctx, plan)
        times = tuple(sum(layer_costs(ctx, plan, h, g)[:2]) for h in ctx.types
                      for g in ctx.types)
        stats[rc] = ((la.dense, la.moe, la.working), times)
    keep = []
    for rc in RECOMPUTES:
        mem, times = stats[rc]
        dominated = False
        for other in RECOMPUTES:
            if other == rc:
                continue
            m2, t2 = stats[other]
            no_worse = all(a <= b for a, b in zip(m2, mem, strict=True)) and all(
                a <= b for a, b in zip(t2, times, strict=True))
            # Equal modes: keep the first (RECOMPUTES order).
            if no_worse and ((m2, t2) != (mem, times)
                             or RECOMPUTES.index(other) < RECOMPUTES.index(rc)):
                dominated = True
                break
        if not dominated:
            keep.append(rc)
    return keep


def enumerate_choices(ctx: Ctx, fix: dict[str, Any]) -> list[Choice]:
    """Every structural choice of both formulations that passes the cheap legality rules."""
    model, training = ctx.model, ctx.training
    L, B = model.num_layers, training.global_batch_size
    n_total = ctx.cluster.num_gpus
    gpn_all = [t.gpn_gcd for t in ctx.types.values()]
    tps = [t for t in pick(fix, "tp", divisors(max(gpn_all))) if tp_ok(model, t)]
    mixed = len(ctx.types) > 1
    # Context parallelism is enumerated on one GPU type (the homogeneous cross-check); on a
    # mixed cluster only when pinned (the per-type verification clusters can be smaller than
    # a CP ring).
    cps = [c for c in pick(fix, "cp", (1,) if mixed else CP_DEGREES)
           if c == 1 or (training.seq_len % (2 * c) == 0 and c * max(gpn_all) <= n_total)]
    extra = tuple((k, fix[k]) for k in ("ep", "etp") if fix.get(k) is not None)
    out: list[Choice] = []
    for tp in tps:
        sps = pick(fix, "sequence_parallel", [tp > 1])
        if tp == 1 and any(sps):
            continue
        for cp in cps:
            for sp in sps:
                base = ParallelPlan(tp=tp, cp=cp, sequence_parallel=sp,
                                    **dict(extra), **ctx.constants)
                for mbs in pick(fix, "micro_batch_size",
                                [b for b in divisors(B) if b <= MAX_MICRO_BATCH]):
                    if B % mbs:
                        continue
                    rcs = recomputes(ctx, fix, base.model_copy(update={"micro_batch_size": mbs}))
                    # Pipeline-heterogeneous: dp*tp*cp GPUs of one type per stage.
                    for dp in pick(fix, "dp", divisors(B // mbs)):
                        if B % (dp * mbs):
                            continue
                        span = dp * tp * cp
                        stages = sum(t.num_gpus // span for t in ctx.types.values()
                                     if t.gpn_gcd % tp == 0)
                        for pp in pick(fix, "pp", range(1, min(L, stages) + 1)):
                            if pp > L or pp > stages or span * pp > n_total:
                                continue
                            for rc in rcs:
                                for z in zero_stages(fix, dp):
                                    out.append(Choice("pipeline", tp, dp, pp, cp, mbs, rc, z,
                                                      sp, extra))
                    if not mixed:
                        continue
                    # Data-heterogeneous: replicas of tp*pp*cp GPUs of one type.
                    for pp in pick(fix, "pp", range(1, L + 1)):
                        width = tp * pp * cp
                        replicas = sum(t.num_gpus // width for t in ctx.types.values()
                                       if t.gpn_gcd % tp == 0)
                        if replicas < 1 or pp > L:
                            continue
                        if fix.get("dp") is not None and fix["dp"] > replicas:
                            continue
                        for rc in rcs:
                            # FSDP's per-layer, per-micro-batch gathers (ZeRO-3; ZeRO-2
                            # where it re-gathers every micro-batch) are not re-priced
                            # across types (see _union_dp_time): replicas use the others.
                            fsdp = 2 if ctx.training.zero2_regather else 3
                            for z in [z for z in zero_stages(fix, 2) if z < fsdp]:
                                out.append(Choice("data", tp, 0, pp, cp, mbs, rc, z, sp,
                                                  extra))
    return out
