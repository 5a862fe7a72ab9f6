"""The communication inputs of ``block.block_time``, built only for the plans that will be
timed: each plan's DP and expert-DP group lines (an index into per-group tables), its
pipeline send time and its gradient bytes on the wire. The memory pass reads none of them,
so plans that do not fit, or that the top-K pruning leaves untimed (``prune``), never pay
for them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.search.space.build import PlanSpace
from paraplan.search.space.fix import COMPRESSION_FIELDS
from paraplan.search.space.keys import group_lines, key_index
from paraplan.simulator.collectives import pipeline_p2p_lines, tied_embedding_lines
from paraplan.simulator.compression import effective_grad_bytes, pp_ratio
from paraplan.simulator.dp_sync import tied_embedding_bytes
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.topology import Topology


@dataclass(frozen=True)
class CommTables:
    """Per-plan arrays over the plans asked for (``rows``, in increasing order; ``pos`` maps
    plans to their entries) and the per-group (alpha, beta) line tables they index. Nothing
    is the size of the whole space: a search times a small part of it."""

    rows: np.ndarray
    """The plans (indices into the space, increasing) the arrays below describe."""

    ginv: np.ndarray
    """Row of ``ar``/``ag``/``rs``: the plan's (tp, cp x dp) data-parallel group."""
    ar: np.ndarray
    ag: np.ndarray
    rs: np.ndarray
    einv: np.ndarray
    """Row of ``ear``/``eag``/``ers``: the plan's (etp x ep, expert-DP) group (MoE)."""
    ear: np.ndarray
    eag: np.ndarray
    ers: np.ndarray
    t_p2p: np.ndarray
    """Seconds of one pipeline send of a micro-batch's activations (0 without PP)."""
    grad_bytes: np.ndarray
    """Gradient bytes per element on the wire (``simulator.compression``)."""
    t_tied: np.ndarray
    """Seconds of the word-embedding gradient all-reduce between the pipeline's ends
    (``dp_sync.tied_embedding_sync``; 0 without a last-stage copy or without PP)."""

    def pos(self, idx: np.ndarray) -> np.ndarray:
        """Entries of the plans ``idx`` (each one of ``rows``) in the arrays above."""
        at = np.searchsorted(self.rows, idx)
        if len(idx) and (at.max() >= len(self.rows) or (self.rows[at] != idx).any()):
            raise ValueError("communication tables were built for other plans")
        return at


def comm_tables(space: PlanSpace, edp: np.ndarray, rows: np.ndarray) -> CommTables:
    """``CommTables`` of the plans ``rows`` (increasing indices into the space); ``edp`` each
    plan's expert-data-parallel size (over the whole space)."""
    model, cluster, training = space.model, space.cluster, space.training
    topo = cluster.topology
    c = space.cols
    tp_, cp_, dp_, ep_, etp_ = (c[k][rows] for k in ("tp", "cp", "dp", "ep", "etp"))
    pp_, mbs = c["pp"][rows], c["mbs"][rows]
    # Gradient bytes per element on the wire: PowerSGD's depends on the TP/expert-TP shard
    # shapes, so one value per (tp, etp).
    knobs = {k: space.constants[k] for k in COMPRESSION_FIELDS if k in space.constants}
    utp, tinv = key_index([tp_, etp_])
    per_tp = np.array([effective_grad_bytes(model, training, ParallelPlan(
        tp=int(t_), etp=int(e_) if int(e_) else None, **knobs)) for t_, e_ in utp])
    einv = np.zeros(len(rows), dtype=np.int64)
    ug, ginv = key_index([tp_, cp_ * dp_])
    ar, ag, rs = strided_group_lines(topo, ug)
    ear = eag = ers = np.zeros((1, 3, 2))
    if model.is_moe:
        ue, einv = key_index([etp_ * ep_, edp[rows]])
        ear, eag, ers = strided_group_lines(topo, ue)
    # Pipeline sends in rank order: the slowest stage boundary paces (simulate's rule,
    # collectives.pipeline_p2p): the time is the max over the distinct (latency, bandwidth)
    # lines of each (span, pp, tp).
    uk, kinv = key_index([dp_ * tp_ * cp_, pp_, tp_])
    per_key = [pipeline_p2p_lines(topo, int(span), int(p_), int(t_))
               if int(p_) > 1 and int(span) * int(p_) <= cluster.num_gpus else []
               for span, p_, t_ in uk]
    p2p_lines = _line_table(per_key)
    act_bytes = mbs * training.seq_len / cp_ * model.hidden_size \
        * float(training.compute_bytes) * pp_ratio(training, ParallelPlan(**knobs))
    lines_of = p2p_lines[kinv.reshape(-1)]
    t_p2p = np.where(pp_ > 1, np.max(lines_of[:, :, 0] + (act_bytes / tp_)[:, None]
                                     / lines_of[:, :, 1], axis=1), 0.0)
    t_tied = np.zeros(len(rows))
    if model.embedding_on_last_stage:  # the slowest first-to-last pair of each (span, pp)
        tk, tinv2 = key_index([dp_ * tp_ * cp_, pp_])
        tied_lines = _line_table([tied_embedding_lines(topo, int(span), int(p_))
                                  if int(p_) > 1 and int(span) * int(p_) <= cluster.num_gpus
                                  else [] for span, p_ in tk])[tinv2.reshape(-1)]
        nbytes = tied_embedding_bytes(model, training, tp_.astype(float))
        t_tied = np.where(pp_ > 1, np.max(2 * tied_lines[:, :, 0] + nbytes[:, None]
                                          / tied_lines[:, :, 1], axis=1), 0.0)
    return CommTables(rows, ginv, ar, ag, rs, einv, ear, eag, ers, t_p2p, per_tp[tinv],
                      t_tied)


def strided_group_lines(topo: Topology, keys: np.ndarray) -> tuple[np.ndarray, ...]:
    """All-reduce, all-gather and reduce-scatter lines (``group_lines``) of the group of
    ``k`` ranks ``stride`` apart, for each (stride, k) row of ``keys``."""
    out = tuple(np.zeros((len(keys), 3, 2)) for _ in range(3))
    for i, (stride, k) in enumerate(keys):
        group = tuple(int(stride) * j for j in range(int(k)))
        for arr, kind in zip(out, ("all_reduce", "all_gather", "reduce_scatter"), strict=True):
            arr[i] = group_lines(topo, group, kind)
    return out


def _line_table(per_key: list[list[tuple[float, float]]]) -> np.ndarray:
    """(keys, lines, 2) array of each key's (latency s, bandwidth bytes/s) lines, padded with
    lines of 0 latency and infinite bandwidth (they cost 0 for any size)."""
    table = np.zeros((len(per_key), max([1, *(len(x) for x in per_key)]), 2))
    table[:, :, 1] = np.inf
    for i, lines in enumerate(per_key):
        for j, line in enumerate(lines):
            table[i, j] = line
    return table
