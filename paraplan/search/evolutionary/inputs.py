"""Inputs of a placement: the network as pair matrices (bandwidth, latency) and a plan's
communication volumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from paraplan.simulator.compression import effective_grad_bytes, pp_ratio
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

DpAlgorithm = Literal["ring", "scatter_gather"]

RING_EXACT_MAX = 8
"""Groups of up to this many GPUs get the exact best ring ((n-1)!/2 rings enumerated)."""




@dataclass(frozen=True, eq=False)
class PairMatrices:
    """Point-to-point cost between every two GPUs: ``bandwidth_Bps[a, b]`` (one direction,
    bytes/s) and ``latency_s[a, b]`` (seconds).

    The matrices are symmetrised conservatively (the smaller bandwidth and the larger latency
    of the two directions), since a pipeline boundary carries traffic both ways. The diagonal
    is ignored. Build from a cluster with :meth:`from_cluster` or directly from arrays (custom
    or synthetic networks).
    """

    bandwidth_Bps: np.ndarray
    latency_s: np.ndarray

    def __post_init__(self) -> None:
        bw = np.array(self.bandwidth_Bps, dtype=float)
        lat = np.array(self.latency_s, dtype=float)
        if bw.ndim != 2 or bw.shape[0] != bw.shape[1] or lat.shape != bw.shape:
            raise SpecError(
                f"bandwidth_Bps {bw.shape} and latency_s {lat.shape} must be square matrices "
                "of the same shape (one row and column per GPU)",
                field="bandwidth_Bps", value=bw.shape, allowed="N x N",
            )
        off = ~np.eye(bw.shape[0], dtype=bool)
        if np.isnan(bw).any() or (bw[off] <= 0).any():
            raise SpecError("bandwidth_Bps must be > 0 bytes/s between every two GPUs",
                            field="bandwidth_Bps", allowed="> 0")
        if not np.isfinite(lat[off]).all() or (lat[off] < 0).any():
            raise SpecError("latency_s must be finite and >= 0 seconds between every two GPUs",
                            field="latency_s", allowed=">= 0")
        bw = np.minimum(bw, bw.T)
        lat = np.maximum(lat, lat.T)
        np.fill_diagonal(bw, np.inf)
        np.fill_diagonal(lat, 0.0)
        bw.setflags(write=False)
        lat.setflags(write=False)
        object.__setattr__(self, "bandwidth_Bps", bw)
        object.__setattr__(self, "latency_s", lat)

    @property
    def num_gpus(self) -> int:
        return int(self.bandwidth_Bps.shape[0])

    @classmethod
    def from_cluster(cls, cluster: ClusterSpec, num_gpus: int | None = None) -> PairMatrices:
        """Matrices for GPUs ``0..num_gpus-1`` of ``cluster`` (all GPUs when None), from
        ``cluster.topology`` with every GPU's fair share of its node's NICs (all GPUs
        communicate at once during a pipelined step), built once with numpy."""
        topo = cluster.topology
        n = topo.num_gpus if num_gpus is None else int(num_gpus)
        if not 1 <= n <= topo.num_gpus:
            raise SpecError(
                f"num_gpus={num_gpus} is outside 1..{topo.num_gpus} (cluster {cluster.name!r})",
                field="num_gpus", value=num_gpus, allowed=f"1..{topo.num_gpus}",
            )
        a, b = (x.ravel() for x in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
        pairs = getattr(topo, "_pairs", None)
        if pairs is not None:  # vectorised lookup (one numpy pass over all N^2 pairs)
            bw, lat, _ = pairs(a, b, shared=True)
        else:  # pragma: no cover - public, per-pair fallback
            costs = [topo.pair(int(x), int(y)) for x, y in zip(a, b, strict=True)]
            bw = np.array([c.bandwidth_GBps for c in costs])
            lat = np.array([c.latency_s for c in costs])
        return cls(np.asarray(bw, float).reshape(n, n) * 1e9,
                   np.asarray(lat, float).reshape(n, n))


Network = ClusterSpec | PairMatrices


@dataclass(frozen=True)
class CommVolumes:
    """Communication volumes of one training step, the inputs of the placement search.

    ``dp_bytes[k]``: gradient bytes each GPU of stage ``k`` all-reduces with the other ``dp``
    GPUs of its stage per step. ``pp_bytes``: activation bytes one micro-batch sends across a
    stage boundary, each direction. ``num_microbatches``: micro-batches per step per replica.
    """

    dp_bytes: tuple[float, ...]
    pp_bytes: float
    num_microbatches: int


def comm_volumes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                 num_gpus: int | None = None, *, model_parallel: bool = False) -> CommVolumes:
    """``dp_bytes``, ``pp_bytes`` and ``m`` for ``plan`` with the simulator's conventions.

    * ``dp_bytes[k]`` = parameters held by a stage-``k`` GPU
      (``simulator.memory.params_per_stage``, dense + expert, layers as in ``simulate``: the
      plan's ``layers_per_stage`` or an even split) x ``training.grad_reduce_bytes`` (2 for
      bf16/fp16, 4 with fp32 reduction) / ``plan.grad_compression_ratio``;
    * ``pp_bytes`` = ``micro_batch_size * seq_len * hidden * compute_bytes`` (Megatron's
      ``b*s*h`` activation per boundary per micro-batch);
    * ``m`` = ``global_batch_size // (dp * micro_batch_size)``.

    ``plan.dp`` may be None when ``num_gpus`` is given (dp = num_gpus // pp). DT-FM tasklets are
    one GPU each, so tp, cp and ep must be 1 - unless ``model_parallel``: then a tasklet is a
    block of tp*cp GPUs and the volumes are one rank's (``params_per_stage`` is per TP rank;
    Megatron's scatter-gather sends b*s*h/(cp*tp) per rank per boundary).
    """
    from paraplan.simulator.memory import params_per_stage
    from paraplan.simulator.step import plan_chunks

    for name in () if model_parallel else ("tp", "cp", "ep"):
        if getattr(plan, name) != 1:
            raise SpecError(
                f"plan.{name}={getattr(plan, name)}: DT-FM placement handles one GPU per "
                f"(stage, replica) tasklet, so {name} must be 1",
                field=f"plan.{name}", value=getattr(plan, name), allowed=1,
            )
    if plan.dp is None and num_gpus is None:
        raise SpecError("plan.dp is not set; give plan.dp or num_gpus", field="plan.dp",
                        allowed="integer >= 1")
    dp = plan.resolved_dp(num_gpus) if plan.dp is None else plan.dp
    pp = plan.pp
    _, layers = plan_chunks(model, plan)
    grad_bytes = effective_grad_bytes(model, training, plan)
    dp_bytes = tuple(float(sum(params_per_stage(model, plan, layers, k)) * grad_bytes)
                     for k in range(pp))
    pp_bytes = float(plan.micro_batch_size * training.seq_len * model.hidden_size
                     * training.compute_bytes / (plan.cp * plan.tp) * pp_ratio(training, plan))
    m = training.global_batch_size // (dp * plan.micro_batch_size)
    if m < 1:
        raise SpecError(
            f"global_batch_size={training.global_batch_size} is smaller than dp x "
            f"micro_batch_size = {dp} x {plan.micro_batch_size}: no micro-batch per replica",
            field="training.global_batch_size", value=training.global_batch_size,
            allowed=f">= {dp * plan.micro_batch_size}",
        )
    return CommVolumes(dp_bytes, pp_bytes, int(m))
