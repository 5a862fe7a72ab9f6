"""Stage classes of a (pp, vpp) block of plans: the pipeline stages that differ in layers,
MoE layers, or in holding the embedding or the LM head, and the parameters each holds
(``block``'s memory and time passes read them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.simulator.memory import moe_layers_in
from paraplan.simulator.stages import pipeline_chunks


@dataclass(frozen=True)
class Stages:
    """Stage classes of a (pp, vpp) block: stages with the same (layers, MoE layers, first,
    last) differ only in in-flight micro-batches, which never grow with the stage index; so
    each class's first stage (``rr``) is the one that can be the slowest or fullest, and sums
    over stages need only class counts."""

    rr: np.ndarray
    cls: np.ndarray
    """stage -> its class (one-hot columns of ``rr``)"""
    lasts: np.ndarray
    cnt: np.ndarray
    layers: np.ndarray
    nmoe: np.ndarray
    ndense: np.ndarray
    first: np.ndarray
    last: np.ndarray


def stage_classes(model, p: int, v: int) -> Stages:
    L = model.num_layers
    chunks = pipeline_chunks(L, p, v)
    assert chunks is not None  # the space only holds shapes that have a split
    starts = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    all_layers = [sum(chunks[ch * p + r] for ch in range(v)) for r in range(p)]
    all_moe = [sum(moe_layers_in(model, int(starts[ch * p + r]), chunks[ch * p + r])
                   for ch in range(v)) if model.is_moe else 0 for r in range(p)]
    stage_keys = [(all_layers[r], all_moe[r], r == 0, r == p - 1) for r in range(p)]
    firsts: dict[tuple, int] = {}
    for r, key in enumerate(stage_keys):
        firsts.setdefault(key, r)
    rr = np.array(sorted(firsts.values()))
    column = {int(r): j for j, r in enumerate(rr)}
    cls = np.zeros((p, len(rr)))
    for r, key in enumerate(stage_keys):
        cls[r, column[firsts[key]]] = 1.0
    layers = np.array([all_layers[r] for r in rr], dtype=float)
    nmoe = np.array([all_moe[r] for r in rr], dtype=float)
    arrays = (rr, cls, p - 1 - np.argmax(cls[::-1], axis=0), cls.sum(axis=0), layers, nmoe,
              layers - nmoe, (rr == 0).astype(float), (rr == p - 1).astype(float))
    for a in arrays:  # shared by every piece and thread of a search (block.Context.stages)
        a.setflags(write=False)
    return Stages(*arrays)


def stage_params(model, st: Stages, p: int, t: np.ndarray, ep: np.ndarray,
                  etp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense (TP-split) and expert parameters on each plan's rank of each stage class."""
    dense, experts = stage_param_rows(model, st, p)
    dense_r = dense[None, :] / t[:, None]
    if model.is_moe:
        return dense_r, experts[None, :] / (ep * etp).astype(float)[:, None]
    return dense_r, np.zeros((len(t), len(st.rr)))


def stage_param_rows(model, st: Stages, p: int) -> tuple[np.ndarray, np.ndarray]:
    """``stage_params`` before the per-plan division: each stage class's dense parameters
    (to divide by tp) and expert parameters (to divide by ep * etp)."""
    shared = model.moe_layer_shared_params if model.is_moe else 0.0
    head_params = model.lm_head_params + (model.vocab_size * model.hidden_size
                                          if model.embedding_on_last_stage and p > 1 else 0) \
        + model.mtp_dense_params
    dense = (st.ndense * model.dense_layer_params + st.nmoe * shared
             + st.first * model.embedding_params + st.last * head_params)
    experts = (st.nmoe * model.num_experts * model.expert_params
               + st.last * model.mtp_expert_params) if model.is_moe else np.zeros(len(st.rr))
    return np.asarray(dense, dtype=float), np.asarray(experts, dtype=float)
