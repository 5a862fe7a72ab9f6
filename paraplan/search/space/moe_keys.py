"""MoE layer costs of many plan keys at once, each part priced once per the plan fields it
reads.

A key is (tp, cp, sp, mbs, zs, ep, etp) (``evaluate._key_tables``). Of an MoE layer's cost
(``layer.layer_parts``), the attention, projections, router, shared experts, memory-bound
ops, TP and CP traffic (``layer.shared_parts``) read (tp, cp, sp, mbs, zs) and not the expert
parallelism; the routed experts (``layer_terms.routed_terms``) read only
``moe.expert_shape``; the all-to-alls and the dispatcher's sort only ``moe.a2a_shape``; the
overlap's share and the host stall only ep and the capacity factor. So each is priced for
its distinct inputs (hundreds, where a DeepSeek-V3 space has over ten thousand MoE keys),
and ``layer.compose_parts`` composes every key on arrays: the same code ``simulate`` runs on
numbers.

The routed part's key is built from columns, not from a plan per key: ``expert_shape`` is
(ep, etp, etp_gather, sp_split, dispatch_tokens, capacity factor, ZeRO >= 2), where
``etp_gather`` is a function of (etp, sp), the capacity factor is the space's, and
``sp_split`` and ``dispatch_tokens`` are read off each shared key's plan; keys equal on
(ep, etp, sp, sp_split, dispatch_tokens, zs) have equal shapes (distinct such keys may share
one, which the memo then prices once)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

import numpy as np

from paraplan.search.space.build import PlanSpace
from paraplan.search.space.keys import key_index
from paraplan.simulator.compute import (
    Device,
    attention_times,
    dispatch_sort_time,
    with_dispatch_sort,
)
from paraplan.simulator.layer import (
    SharedParts,
    a2a_overlap_share,
    compose_parts,
    host_stall,
    layer_a2a_time,
    shared_parts,
)
from paraplan.simulator.layer_compose import PARTS, LayerParts, op_rerun_tp, part_columns
from paraplan.simulator.layer_terms import RoutedTerms, SharedTerms, routed_terms
from paraplan.simulator.moe import a2a_shape, dispatch_tokens, expert_shape, sp_split
from paraplan.specs.plan import ParallelPlan


def moe_parts(space: PlanSpace, dev: Device, keys: np.ndarray,
              plan_of: Callable[..., ParallelPlan], run_free: tuple[str, str]) -> np.ndarray:
    """``[key, layer_compose.part_columns]`` (forward, backward, forward GEMMs, attention,
    elementwise, experts, TP, TP backward, CP, EP, CP backward, overlap share, host stall,
    the forward part a whole-layer re-run skips, the GEMMs op-level checkpointing re-runs, the
    TP collective an early-stopping re-run skips, the TP traffic an op-level re-run issues) of
    an MoE layer for each row of ``keys`` (tp, cp, sp, mbs, zs, ep, etp), as
    ``layer.layer_parts`` gives it. Shared and routed parts are kept in ``space.memo`` (they
    read neither the MoE dispatcher nor its overlap), the all-to-alls by dispatcher."""
    model, training, topo, memo = space.model, space.training, space.cluster.topology, space.memo
    if not len(keys):  # no plan of the space fits: nothing to price
        return np.zeros((0, PARTS))
    su, sinv = key_index([keys[:, j] for j in range(5)])
    shared: list[SharedParts] = []
    tokens, split = np.zeros(len(su)), np.zeros(len(su), dtype=np.int64)
    attention: dict[tuple[int, int, int], tuple[float, float, float]] = {}
    for i, key in enumerate(su.tolist()):
        hit = memo.get(("moe-shared", run_free, *key))
        if hit is None:
            plan = plan_of(*key)
            # Projections and attention read only (tp, cp, mbs).
            att = attention.get((key[0], key[1], key[3]))
            if att is None:
                att = attention[key[0], key[1], key[3]] = attention_times(model, training,
                                                                          plan, dev)
            hit = memo[("moe-shared", run_free, *key)] = (
                shared_parts(model, topo, training, plan, dev, moe=True, attention=att),
                dispatch_tokens(training, plan), sp_split(plan))
        shared.append(hit[0])
        tokens[i], split[i] = hit[1], hit[2]
    tcode = np.unique(tokens, return_inverse=True)[1].reshape(-1)
    eu, einv = key_index([keys[:, 5], keys[:, 6], keys[:, 2], split[sinv], tcode[sinv],
                          keys[:, 4]])
    rep = np.zeros(len(eu), dtype=np.int64)
    rep[einv[::-1]] = np.arange(len(keys))[::-1]  # each routed key's first plan key
    routed, per_e = _routed(space, dev, keys[rep], plan_of, run_free)
    cols = _columns(shared, sinv)
    lt, tp_c, tp_b, cp_c, cp_b = compose_parts(cols, _columns(routed, einv))
    sort_s, ep_s, overlap, stall = (col[einv] for col in per_e)
    # No down projection to skip in an MoE block (``rerun_skip_time``): no TP collective either.
    parts = LayerParts(with_dispatch_sort(lt, sort_s), tp_c, tp_b, cp_c, ep_s, cp_b, overlap,
                       stall, np.zeros(len(keys)), op_rerun_tp(tp_c, cols.tp_scatter_share))
    return np.stack(part_columns(parts), axis=1)


def _routed(space: PlanSpace, dev: Device, reps: np.ndarray,
            plan_of: Callable[..., ParallelPlan], run_free: tuple[str, str]
            ) -> tuple[list[RoutedTerms], tuple[np.ndarray, ...]]:
    """For each representative key: its ``routed_terms`` and (dispatcher's sort, all-to-alls,
    overlap share or 0, host stall) columns."""
    model, training, topo, memo = space.model, space.training, space.cluster.topology, space.memo
    routed: list[RoutedTerms] = []
    cols = np.zeros((4, len(reps)))
    for j, key in enumerate(reps.tolist()):
        plan = plan_of(*key)
        shape = expert_shape(training, plan)
        hit = memo.get(("moe-routed", run_free, *shape))
        if hit is None:
            hit = memo[("moe-routed", run_free, *shape)] = routed_terms(model, training, plan,
                                                                          dev)
        routed.append(hit)
        a2a_key = ("a2a", run_free, training.moe_dispatcher, *a2a_shape(training, plan))
        a2a = memo.get(a2a_key)
        if a2a is None:
            a2a = memo[a2a_key] = (layer_a2a_time(model, topo, training, plan, moe=True),
                                   dispatch_sort_time(model, training, plan, dev))
        share = a2a_overlap_share(training, plan, dev, moe=True)
        cols[:, j] = (a2a[1], a2a[0], share or 0.0, host_stall(dev, plan, moe=True))
    return routed, tuple(cols)


def _columns(objs: list[Any], idx: np.ndarray) -> Any:
    """A dataclass of numbers (or of nested ones) from a list of them: each field an array
    of the list's values, indexed by ``idx``."""
    first = objs[0]
    values: dict[str, Any] = {}
    for f in fields(first):
        if isinstance(getattr(first, f.name), SharedTerms):
            values[f.name] = _columns([getattr(o, f.name) for o in objs], idx)
        else:
            values[f.name] = np.array([getattr(o, f.name) for o in objs], dtype=float)[idx]
    return type(first)(**values)
