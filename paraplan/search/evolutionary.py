"""DT-FM-style placement of pipeline x data-parallel tasklets on a heterogeneous network.

Yuan et al. 2022, "Decentralized Training of Foundation Models in Heterogeneous
Environments" (NeurIPS 2022; "DT-FM" below). Training with ``pp`` pipeline stages and ``dp``
data-parallel replicas (tp = cp = 1) splits one step into ``pp * dp`` *tasklets*
``(stage k, replica i)``, one per GPU. On a slow, heterogeneous network (GPUs in several
regions) *which* GPU runs which tasklet decides the communication time. DT-FM sec 3.1 reduces
a placement to

1. a **partition** of the GPUs into ``pp`` groups of ``dp`` (group ``k`` runs stage ``k`` for
   every replica and all-reduces that stage's gradients inside itself, DT-FM sec 3.2 "data
   parallel cost": a balanced graph partition);
2. an **order** of the groups along the pipeline (DT-FM sec 3.2 "pipeline parallel cost":
   an open-loop travelling-salesman path over the coarsened graph of groups); and
3. between consecutive groups a **matching** of replicas (replica ``i``'s stage-``k`` GPU sends
   its activations to replica ``i``'s stage-``k+1`` GPU; DT-FM sec 3.2: a bipartite matching
   whose slowest pair sets the boundary's cost).

Cost model (every time in seconds, every size in bytes, bandwidths in bytes/s):

* **DP cost** (DT-FM sec 3.2 eq. "DataP-cost", max over stages because the stages synchronise
  concurrently). Stage ``k`` all-reduces ``dp_bytes[k]`` bytes (per GPU) over its group of
  ``n = dp`` GPUs with a ring (Patarasuk & Yuan 2009; the convention of
  ``paraplan.specs.topology.Topology.ring`` and ``simulator.collectives.ring_all_reduce``)::

      ring_k = 2(n-1) * L_max + 2(n-1)/n * dp_bytes[k] / B_min

  where ``B_min`` and ``L_max`` are the smallest bandwidth and largest latency over the ring's
  edges. The ring order inside the group is chosen to minimise ``ring_k``: exactly (all
  ``(n-1)!/2`` rings) for ``n <= 8``, by nearest-neighbour + 2-opt above. DT-FM's own
  estimate (a scatter-gather all-reduce where every GPU exchanges ``1/n`` of the gradients with
  every other: ``max_d sum_{d' != d} 2(alpha_dd' + S/(n beta_dd'))``) is available with
  ``dp_algorithm="scatter_gather"``. ``dp_cost = max_k ring_k``.
* **PP cost** (DT-FM sec 3.2 "PipelineP-cost"). One message of ``pp_bytes`` between GPUs ``a``
  and ``b`` costs ``alpha_ab + pp_bytes / beta_ab``; the cost of the boundary between the
  groups at positions ``k`` and ``k+1`` is the slowest matched pair,
  ``c_k = max_i (alpha + pp_bytes/beta)(g_k[i], g_{k+1}[i])``, minimised by a *bottleneck*
  bipartite matching. Every micro-batch crosses every boundary once forward (activations) and
  once backward (activation gradients), so ``pp_cost = 2 * m * sum_k c_k``. DT-FM's reference
  scheduler scores ``DataP-cost + 2 * PipelineP-cost`` with one message carrying the whole
  batch's activations; we charge the latency once per micro-batch (``m`` messages of
  ``pp_bytes`` each way), which equals DT-FM's bandwidth term and is more conservative on
  latency. Summing over boundaries is DT-FM's open-loop TSP objective (the pipeline's critical
  path crosses every boundary).
* **Total** ``cost_s = dp_cost + pp_cost`` (DT-FM sec 3.2, "comm-cost").

For a partition, the best order is solved exactly (Held-Karp dynamic programming over
subsets, jointly with the position-dependent DP cost by enumerating DP-cost thresholds) for
``pp <= 10`` and by nearest-neighbour + 2-opt above; the matchings exactly
(``scipy.optimize.linear_sum_assignment`` on thresholded costs, binary search on the
threshold). The search over partitions is DT-FM sec 4's hybrid genetic algorithm (a memetic
algorithm): group-preserving crossover, mutation by swapping GPUs across groups, and a
Kernighan-Lin-style local search of improving swaps, ranked by a vectorised swap-gain
surrogate and verified with the exact cost.

Entry points: :func:`evolutionary_placement` (the search), :func:`rank_order_placement`
(Megatron's naive order: stage ``k`` = GPUs ``[k*dp, (k+1)*dp)``), :func:`random_placement`,
:func:`exhaustive_placement` (ground truth for tiny instances), :func:`placement_cost` (a
given placement) and :func:`comm_volumes` (``dp_bytes``, ``pp_bytes``, ``m`` from a model,
training spec and plan with the simulator's conventions). All functions are pure: the caches
live inside one call.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy.optimize import linear_sum_assignment

from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec

DpAlgorithm = Literal["ring", "scatter_gather"]

RING_EXACT_MAX = 8
"""Groups of up to this many GPUs get the exact best ring ((n-1)!/2 rings enumerated)."""
ORDER_EXACT_MAX = 10
"""Up to this many stages the pipeline order is solved exactly (Held-Karp, O(2^pp pp^2))."""


# ---- inputs ----------------------------------------------------------------------------------


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
                 num_gpus: int | None = None) -> CommVolumes:
    """``dp_bytes``, ``pp_bytes`` and ``m`` for ``plan`` with the simulator's conventions.

    * ``dp_bytes[k]`` = parameters held by a stage-``k`` GPU
      (``simulator.memory.params_per_stage``, dense + expert, layers as in ``simulate``: the
      plan's ``layers_per_stage`` or an even split) x ``training.grad_reduce_bytes`` (2 for
      bf16/fp16, 4 with fp32 reduction) / ``plan.grad_compression_ratio``;
    * ``pp_bytes`` = ``micro_batch_size * seq_len * hidden * compute_bytes`` (Megatron's
      ``b*s*h`` activation per boundary per micro-batch);
    * ``m`` = ``global_batch_size // (dp * micro_batch_size)``.

    ``plan.dp`` may be None when ``num_gpus`` is given (dp = num_gpus // pp). DT-FM tasklets are
    one GPU each, so tp, cp and ep must be 1.
    """
    from paraplan.simulator.memory import params_per_stage
    from paraplan.simulator.step import even_split

    for name in ("tp", "cp", "ep"):
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
    pp, v = plan.pp, plan.virtual_stages
    chunks = plan.layers_per_stage or even_split(model.num_layers, pp * v)
    layers = [sum(chunks[c * pp + r] for c in range(v)) for r in range(pp)]
    grad_bytes = training.grad_reduce_bytes / plan.grad_compression_ratio
    dp_bytes = tuple(float(sum(params_per_stage(model, plan, layers, k)) * grad_bytes)
                     for k in range(pp))
    pp_bytes = float(plan.micro_batch_size * training.seq_len * model.hidden_size
                     * training.compute_bytes)
    m = training.global_batch_size // (dp * plan.micro_batch_size)
    if m < 1:
        raise SpecError(
            f"global_batch_size={training.global_batch_size} is smaller than dp x "
            f"micro_batch_size = {dp} x {plan.micro_batch_size}: no micro-batch per replica",
            field="training.global_batch_size", value=training.global_batch_size,
            allowed=f">= {dp * plan.micro_batch_size}",
        )
    return CommVolumes(dp_bytes, pp_bytes, int(m))


# ---- result ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementResult:
    """A placement and its communication cost per step (DT-FM sec 3.2).

    ``groups[k][i]`` is the GPU running stage ``k`` (pipeline order) of replica ``i``: row
    ``k`` is stage ``k``'s data-parallel group, column ``i`` is replica ``i``'s pipeline.
    ``cost_s = dp_cost_s + pp_cost_s`` (seconds per step). ``stage_dp_cost_s[k]`` is stage
    ``k``'s ring all-reduce (``dp_cost_s`` is their max) and ``boundary_cost_s[k]`` the
    per-message cost of boundary ``k -> k+1`` (``pp_cost_s = 2 m sum``). ``history`` holds
    ``(best cost, mean cost)`` of the population, seconds, for the initial population and
    after each of the ``generations_run`` generations (empty for non-evolutionary results).
    ``seed`` is the integer seed the search ran with (None for a Generator or no search).
    """

    groups: list[list[int]]
    cost_s: float
    dp_cost_s: float
    pp_cost_s: float
    history: list[tuple[float, float]] = field(default_factory=list)
    generations_run: int = 0
    seed: int | None = None
    stage_dp_cost_s: tuple[float, ...] = ()
    boundary_cost_s: tuple[float, ...] = ()
    evaluations: int = 0
    """Distinct partitions whose cost was computed."""
    search_time_s: float = 0.0

    @property
    def pp(self) -> int:
        return len(self.groups)

    @property
    def dp(self) -> int:
        return len(self.groups[0]) if self.groups else 0


# ---- validation ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Problem:
    pairs: PairMatrices
    pp: int
    dp: int
    dp_bytes: np.ndarray  # (pp,) bytes
    pp_bytes: float
    m: int
    dp_algorithm: str


def _int_at_least(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise SpecError(f"{name}={value!r} must be an integer >= {low}", field=name,
                        value=value, allowed=f"integer >= {low}")
    return int(value)


def _nonneg_bytes(name: str, value: object) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SpecError(f"{name}={value!r} must be a number of bytes >= 0", field=name,
                        value=value, allowed="finite number >= 0") from None
    if not math.isfinite(x) or x < 0:
        raise SpecError(f"{name}={value!r} must be a finite number of bytes >= 0", field=name,
                        value=value, allowed="finite number >= 0")
    return x


def _problem(network: Network, pp: int, dp: int, dp_bytes: float | Sequence[float],
             pp_bytes: float, num_microbatches: int, num_gpus: int | None,
             dp_algorithm: str) -> _Problem:
    pp = _int_at_least("pp", pp, 1)
    dp = _int_at_least("dp", dp, 1)
    m = _int_at_least("num_microbatches", num_microbatches, 1)
    if dp_algorithm not in ("ring", "scatter_gather"):
        raise SpecError(f"dp_algorithm={dp_algorithm!r} is not one of 'ring', 'scatter_gather'",
                        field="dp_algorithm", value=dp_algorithm,
                        allowed=["ring", "scatter_gather"])
    if isinstance(network, ClusterSpec):
        total, name = network.num_gpus, f"cluster {network.name!r}"
    elif isinstance(network, PairMatrices):
        total, name = network.num_gpus, "the pair matrices"
    else:
        raise SpecError(f"network must be a ClusterSpec or PairMatrices, not "
                        f"{type(network).__name__}", field="network")
    used = total if num_gpus is None else _int_at_least("num_gpus", num_gpus, 1)
    if used > total:
        raise SpecError(f"num_gpus={used} exceeds the {total} GPUs of {name}",
                        field="num_gpus", value=used, allowed=f"1..{total}")
    if pp * dp != used:
        hint = "" if num_gpus is not None or pp * dp > total else (
            f"; pass num_gpus={pp * dp} to place on GPUs 0..{pp * dp - 1} only")
        raise SpecError(
            f"pp*dp = {pp}*{dp} = {pp * dp} must equal the number of GPUs placed ({used} of "
            f"{name}){hint}", field="pp*dp", value=pp * dp, allowed=used,
        )
    if np.ndim(dp_bytes) == 0:
        per_stage = [_nonneg_bytes("dp_bytes", dp_bytes)] * pp
    else:
        seq = list(dp_bytes)  # type: ignore[arg-type]
        if len(seq) != pp:
            raise SpecError(f"dp_bytes has {len(seq)} entries; it needs one per stage (pp={pp})",
                            field="dp_bytes", value=len(seq), allowed=pp)
        per_stage = [_nonneg_bytes(f"dp_bytes[{k}]", x) for k, x in enumerate(seq)]
    ppb = _nonneg_bytes("pp_bytes", pp_bytes)
    pairs = (PairMatrices.from_cluster(network, used) if isinstance(network, ClusterSpec)
             else network)
    if pairs.num_gpus != used:
        pairs = PairMatrices(pairs.bandwidth_Bps[:used, :used], pairs.latency_s[:used, :used])
    return _Problem(pairs, pp, dp, np.array(per_stage, float), ppb, m, dp_algorithm)


def _generator(seed: int | np.random.Generator | None) -> tuple[np.random.Generator, int | None]:
    if isinstance(seed, np.random.Generator):
        return seed, None
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
        raise SpecError(f"seed={seed!r} must be an integer, a numpy Generator or None",
                        field="seed", value=seed)
    return np.random.default_rng(seed), None if seed is None else int(seed)


# ---- pieces of the cost model ----------------------------------------------------------------


def _ring_table(n: int) -> np.ndarray:
    """All rings over ``n`` members up to rotation and direction: ((n-1)!/2, n) indices."""
    if n <= 3:
        return np.arange(n)[None, :]
    rows = [(0, *p) for p in itertools.permutations(range(1, n)) if p[0] < p[-1]]
    return np.array(rows, dtype=np.intp)


def _heuristic_rings(bw: np.ndarray, lat: np.ndarray, s_ref: float, starts: int = 4,
                     ) -> np.ndarray:
    """Candidate rings for a large group: nearest neighbour from a few starts on the ring-step
    time ``lat + s_ref/(n bw)`` (seconds), then 2-opt on its 4th power (an additive stand-in
    for the bottleneck objective)."""
    n = bw.shape[0]
    w = lat + s_ref / (n * bw)
    np.fill_diagonal(w, np.inf)
    scale = np.min(w) if np.isfinite(np.min(w)) and np.min(w) > 0 else 1.0
    w4 = (w / scale) ** 4
    np.fill_diagonal(w4, 0.0)
    rings = []
    for start in np.linspace(0, n - 1, min(starts, n)).astype(int):
        tour = [int(start)]
        free = np.ones(n, bool)
        free[start] = False
        for _ in range(n - 1):
            cand = np.where(free, w[tour[-1]], np.inf)
            nxt = int(np.argmin(cand))
            tour.append(nxt)
            free[nxt] = False
        t = np.array(tour)
        for _ in range(4 * n):  # 2-opt: reverse t[i+1..j]
            a, b = t, np.roll(t, -1)
            old = w4[a, b]
            delta = (w4[a[:, None], a[None, :]] + w4[b[:, None], b[None, :]]
                     - old[:, None] - old[None, :])
            delta = np.triu(delta, 2)
            i, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
            if delta[i, j] >= -1e-12 * max(1.0, old.sum()):
                break
            t = np.concatenate([t[:i + 1], t[i + 1:j + 1][::-1], t[j + 1:]])
        rings.append(t)
    return np.unique(np.array(rings), axis=0)


class _Evaluator:
    """The cost model of one problem with memo tables (local to one search call)."""

    def __init__(self, prob: _Problem) -> None:
        self.p = prob
        bw, lat = prob.pairs.bandwidth_Bps, prob.pairs.latency_s
        self.bw, self.lat = bw, lat
        # Seconds per pipeline message between two GPUs (DT-FM sec 3.2: alpha + c/beta).
        self.msg = lat + prob.pp_bytes / bw
        self.has_pp = prob.pp > 1 and prob.pp_bytes > 0
        self._rings: dict[int, np.ndarray] = {}
        self._group: dict[tuple[int, ...], np.ndarray] = {}
        self._pair: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, np.ndarray]] = {}
        self._cost: dict[bytes, tuple[float, float, float]] = {}
        self._layers: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.evaluations = 0

    # -- DP: ring all-reduce per stage (DT-FM sec 3.2, DataP-cost) --------------------------
    def group_costs(self, g: tuple[int, ...]) -> np.ndarray:
        """Seconds for group ``g`` to all-reduce ``dp_bytes[k]``, for each stage ``k``."""
        hit = self._group.get(g)
        if hit is not None:
            return hit
        s = self.p.dp_bytes
        n = len(g)
        if n == 1:
            out = np.zeros_like(s)
        else:
            idx = np.array(g)
            sub = idx[:, None] * self.bw.shape[0] + idx[None, :]
            bw = self.bw.ravel()[sub]
            lat = self.lat.ravel()[sub]
            if self.p.dp_algorithm == "scatter_gather":
                # DT-FM sec 3.2: every GPU exchanges 1/n of the gradients with every other.
                inv = 1.0 / bw
                np.fill_diagonal(inv, 0.0)
                a = 2.0 * lat.sum(axis=1)
                b = 2.0 / n * inv.sum(axis=1)
                out = np.max(a[:, None] + b[:, None] * s[None, :], axis=0)
            else:
                if n <= RING_EXACT_MAX:
                    edges = self._rings.get(n)
                    if edges is None:  # flat (a*n + b) index of every ring's edges
                        rings = _ring_table(n)
                        edges = self._rings[n] = rings * n + np.roll(rings, -1, axis=1)
                else:
                    rings = _heuristic_rings(bw, lat, float(s.mean()))
                    edges = rings * n + np.roll(rings, -1, axis=1)
                b_min = bw.ravel()[edges].min(axis=1)
                l_max = lat.ravel()[edges].max(axis=1)
                # 2(n-1) alpha + 2(n-1)/n S/B for the best ring at each stage's volume.
                out = np.min(2 * (n - 1) * l_max[:, None]
                             + 2 * (n - 1) / n * s[None, :] / b_min[:, None], axis=0)
            out = np.where(s > 0, out, 0.0)
        out.setflags(write=False)
        self._group[g] = out
        return out

    # -- PP: bottleneck matching between two groups (DT-FM sec 3.2) -------------------------
    def boundary(self, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[float, np.ndarray]:
        """(seconds per message of the slowest matched pair, ``match``) where replica on
        ``a[i]`` sends to ``b[match[i]]``; the bottleneck-optimal matching with the least
        total time among those."""
        if not self.has_pp:
            return 0.0, np.arange(len(a))
        if a > b:
            c, match = self.boundary(b, a)
            inv = np.empty_like(match)
            inv[match] = np.arange(match.size)
            return c, inv
        key = (a, b)
        hit = self._pair.get(key)
        if hit is not None:
            return hit
        cost = self.msg[np.array(a)[:, None], np.array(b)[None, :]]
        hit = self._pair[key] = _bottleneck_matching(cost)
        return hit

    # -- order along the pipeline (DT-FM sec 3.2, open-loop TSP) ----------------------------
    def layers(self, p: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        hit = self._layers.get(p)
        if hit is None:
            hit = self._layers[p] = _subset_layers(p)
        return hit

    def best_order(self, w: np.ndarray, c: np.ndarray) -> tuple[list[int], float, float]:
        """Order of groups minimising ``max_k c[g_k, k] + sum_k w[g_k, g_k+1]`` (seconds):
        (order, dp cost, pp cost)."""
        p = w.shape[0]
        if p == 1:
            return [0], float(c[0, 0]), 0.0
        if p <= ORDER_EXACT_MAX:
            return _exact_order(w, c, self.layers(p))
        return _heuristic_order(w, c)

    # -- a whole partition ------------------------------------------------------------------
    def _parts(self, labels: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
        p, d = self.p.pp, self.p.dp
        members = np.argsort(labels, kind="stable").reshape(p, d)
        keys = [tuple(row) for row in members.tolist()]
        keys.sort()
        c = np.stack([self.group_costs(g) for g in keys])
        b = np.zeros((p, p))
        if self.has_pp:
            for i in range(p):
                for j in range(i + 1, p):
                    b[i, j] = b[j, i] = self.boundary(keys[i], keys[j])[0]
        return keys, c, b

    def cost(self, labels: np.ndarray) -> tuple[float, float, float]:
        """(total, dp, pp) seconds of the best order and matchings for partition ``labels``."""
        key = _canonical(labels)
        hit = self._cost.get(key)
        if hit is not None:
            return hit
        _, c, b = self._parts(labels)
        _, dp_c, pp_c = self.best_order(2.0 * self.p.m * b, c)
        hit = self._cost[key] = (dp_c + pp_c, dp_c, pp_c)
        self.evaluations += 1
        return hit

    def placement(self, labels: np.ndarray) -> tuple[list[list[int]], tuple[float, ...],
                                                      tuple[float, ...], float, float]:
        """Groups in pipeline and replica order for partition ``labels``, with per-stage DP
        seconds, per-boundary seconds per message, dp cost and pp cost."""
        keys, c, b = self._parts(labels)
        order, dp_c, pp_c = self.best_order(2.0 * self.p.m * b, c)
        return self.ordered(keys, order, c, b) + (dp_c, pp_c)

    def ordered(self, keys: list[tuple[int, ...]], order: Sequence[int], c: np.ndarray,
                b: np.ndarray) -> tuple[list[list[int]], tuple[float, ...], tuple[float, ...]]:
        seq = [keys[i] for i in order]
        groups = [list(seq[0])]
        for k in range(len(seq) - 1):
            _, match = self.boundary(seq[k], seq[k + 1])
            pos = {gpu: i for i, gpu in enumerate(seq[k])}
            groups.append([seq[k + 1][match[pos[gpu]]] for gpu in groups[k]])
        stage = tuple(float(c[order[k], k]) for k in range(len(seq)))
        bound = tuple(float(b[order[k], order[k + 1]]) for k in range(len(seq) - 1))
        return groups, stage, bound


def _canonical(labels: np.ndarray) -> bytes:
    """Partition key independent of group labels (relabel by first appearance)."""
    _, first = np.unique(labels, return_index=True)
    relabel = np.empty(first.size, dtype=np.int32)
    relabel[np.argsort(first)] = np.arange(first.size, dtype=np.int32)
    return relabel[labels].tobytes()


def _bottleneck_matching(cost: np.ndarray) -> tuple[float, np.ndarray]:
    """Perfect matching of rows to columns minimising the largest matched entry, then the sum.

    ``linear_sum_assignment`` on ``cost`` with the entries above a threshold ``t`` priced out
    finds the cheapest matching inside ``t`` if one exists. ``t`` starts at the lower bound
    every row and column imposes (usually optimal); otherwise a guess from one assignment on
    rank-exponential weights (the minimum-sum matching under weights ``(n+1)^rank`` has the
    smallest possible largest rank) is verified by showing the next smaller value infeasible,
    with a binary search over the distinct values as the fallback.
    """
    n = cost.shape[0]
    if n == 1:
        return float(cost[0, 0]), np.zeros(1, dtype=np.intp)
    rows = np.arange(n)
    big = float(cost.max()) * (n + 1) + 1.0

    def attempt(t: float) -> np.ndarray | None:
        _, col = linear_sum_assignment(np.where(cost <= t, cost, big))
        return col if cost[rows, col].max() <= t else None

    low = float(max(cost.min(axis=1).max(), cost.min(axis=0).max()))
    col = attempt(low)
    if col is not None:
        return low, col.astype(np.intp)
    vals = np.unique(cost)
    vals = vals[vals > low]
    lo, hi = 0, vals.size - 1  # the largest entry is always feasible
    if vals.size * math.log(n + 1) < 600:  # guess from rank-exponential weights
        rank = np.searchsorted(vals, cost) + 1.0
        weights = np.where(cost > low, np.exp(rank * math.log(n + 1)), 0.0)
        _, guess = linear_sum_assignment(weights)
        g = int(np.searchsorted(vals, cost[rows, guess].max()))
        if g == 0 or attempt(float(vals[g - 1])) is None:
            lo = hi = g
        else:
            hi = g - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if attempt(float(vals[mid])) is not None:
            hi = mid
        else:
            lo = mid + 1
    col = attempt(float(vals[lo]))
    assert col is not None
    return float(vals[lo]), col.astype(np.intp)


def _subset_layers(p: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per path length s: (masks of s nodes, mask before appending each node j, 0/inf
    penalty where j is not in the mask), the constant part of Held-Karp for ``p`` nodes."""
    allm = np.arange(1 << p)
    bits = 1 << np.arange(p)
    count = np.zeros(allm.size, dtype=np.intp)
    for k in range(p):
        count += (allm >> k) & 1
    layers = []
    for size in range(p + 1):
        ms = allm[count == size]
        inside = (ms[:, None] & bits[None, :]) != 0
        layers.append((ms, ms[:, None] ^ bits[None, :], np.where(inside, 0.0, np.inf)))
    return layers


def _held_karp(w: np.ndarray, allowed: np.ndarray,
               layers: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
               ) -> tuple[float, list[int] | None]:
    """Cheapest open path visiting every node once with node ``j`` allowed at position ``k``
    only where ``allowed[j, k]``; Held-Karp DP over subsets (one numpy pass per path length),
    the path recovered by walking the table backwards."""
    p = w.shape[0]
    full = 1 << p
    table = np.full((full, p), np.inf)
    ban = np.where(allowed, 0.0, np.inf)
    first = np.flatnonzero(allowed[:, 0])
    table[1 << first, first] = 0.0
    wt = w.T[None, :, :]  # [_, j, i] = w[i, j]
    for size in range(2, p + 1):
        ms, prev, outside = layers[size]
        table[ms] = (table[prev] + wt).min(axis=2) + outside + ban[:, size - 1]
    last = table[full - 1]
    j = int(np.argmin(last))
    total = float(last[j])
    if not math.isfinite(total):
        return math.inf, None
    path, mask = [j], full - 1
    while len(path) < p:
        here = table[mask, j]
        mask ^= 1 << j
        j = int(np.argmin(np.abs(table[mask] + w[:, j] - here)))
        path.append(j)
    return total, path[::-1]


def _order_cost(order: Sequence[int], w: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    o = np.asarray(order)
    dp_c = float(c[o, np.arange(o.size)].max())
    pp_c = float(w[o[:-1], o[1:]].sum())
    return dp_c, pp_c


def _exact_order(w: np.ndarray, c: np.ndarray,
                 layers: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                 ) -> tuple[list[int], float, float]:
    """Exact min over orders of ``max_k c[g_k, k] + path(w)``: the unconstrained Held-Karp
    path, then for each DP threshold T below its DP cost (ascending, stopping once
    ``T + path_0`` cannot win) the cheapest path with every group's DP cost <= T."""
    p = w.shape[0]
    everywhere = np.ones((p, p), dtype=bool)
    path0_cost, order = _held_karp(w, everywhere, layers)
    assert order is not None
    best_dp, best_pp = _order_cost(order, w, c)
    best = (best_dp + best_pp, order, best_dp, best_pp)
    for t in np.unique(c):
        if t >= best_dp or t + path0_cost >= best[0] * (1 - 1e-12):
            break
        allowed = c <= t
        # Cheap infeasibility check: every position and group needs an allowed slot.
        if not (allowed.any(axis=0).all() and allowed.any(axis=1).all()):
            continue
        _, path = _held_karp(w, allowed, layers)
        if path is None:
            continue
        d, q = _order_cost(path, w, c)
        if d + q < best[0]:
            best = (d + q, path, d, q)
    return list(best[1]), best[2], best[3]


def _heuristic_order(w: np.ndarray, c: np.ndarray) -> tuple[list[int], float, float]:
    """Nearest-neighbour paths from every start, improved by 2-opt segment reversals on the
    true (position-dependent) objective; for pp above ORDER_EXACT_MAX."""
    p = w.shape[0]

    def total(o: list[int]) -> float:
        d, q = _order_cost(o, w, c)
        return d + q

    best: tuple[float, list[int]] | None = None
    for start in range(p):
        o, free = [start], set(range(p)) - {start}
        while free:
            nxt = min(free, key=lambda j: (w[o[-1], j], j))
            o.append(nxt)
            free.remove(nxt)
        cur = total(o)
        improved = True
        while improved:
            improved = False
            for i in range(p - 1):
                for j in range(i + 1, p):
                    cand = o[:i] + o[i:j + 1][::-1] + o[j + 1:]
                    val = total(cand)
                    if val < cur * (1 - 1e-12):
                        o, cur, improved = cand, val, True
        if best is None or cur < best[0]:
            best = (cur, o)
    assert best is not None
    d, q = _order_cost(best[1], w, c)
    return best[1], d, q


# ---- fixed placements ------------------------------------------------------------------------


def _fixed_result(ev: _Evaluator, groups: list[list[int]], seed: int | None = None,
                  ) -> PlacementResult:
    """Cost of ``groups`` exactly as given (order and replica matching fixed; each group's
    ring order is still chosen by the cost model)."""
    prob = ev.p
    stage = tuple(float(ev.group_costs(tuple(sorted(g)))[k]) for k, g in enumerate(groups))
    bound = tuple(
        float(ev.msg[groups[k], groups[k + 1]].max()) if ev.has_pp else 0.0
        for k in range(prob.pp - 1)
    )
    dp_c = max(stage)
    pp_c = 2.0 * prob.m * sum(bound)
    return PlacementResult([list(map(int, g)) for g in groups], dp_c + pp_c, dp_c, pp_c,
                           seed=seed, stage_dp_cost_s=stage, boundary_cost_s=bound)


def placement_cost(network: Network, groups: Sequence[Sequence[int]],
                   dp_bytes: float | Sequence[float], pp_bytes: float,
                   num_microbatches: int = 1, *, num_gpus: int | None = None,
                   dp_algorithm: DpAlgorithm = "ring") -> PlacementResult:
    """Communication cost (seconds per step) of a given placement: ``groups[k][i]`` = the GPU
    of stage ``k`` of replica ``i`` (DT-FM sec 3.2). ``groups`` must use every GPU of
    ``0..pp*dp-1`` exactly once."""
    rows = [list(map(int, g)) for g in groups]
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        raise SpecError("groups must be pp lists of dp GPU indices each", field="groups")
    pp, dp = len(rows), len(rows[0])
    prob = _problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches,
                    pp * dp if num_gpus is None else num_gpus, dp_algorithm)
    flat = sorted(x for r in rows for x in r)
    if flat != list(range(pp * dp)):
        raise SpecError(f"groups must use each of the GPUs 0..{pp * dp - 1} exactly once",
                        field="groups", value=rows)
    return _fixed_result(_Evaluator(prob), rows)


def rank_order_placement(network: Network, pp: int, dp: int,
                         dp_bytes: float | Sequence[float], pp_bytes: float,
                         num_microbatches: int = 1, *, num_gpus: int | None = None,
                         dp_algorithm: DpAlgorithm = "ring") -> PlacementResult:
    """Megatron's naive placement: stage ``k`` runs on GPUs ``[k*dp, (k+1)*dp)`` in index
    order, replica ``i`` on the ``i``-th GPU of each stage (the baseline DT-FM sec 5 compares
    against)."""
    prob = _problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches, num_gpus,
                    dp_algorithm)
    groups = [list(range(k * dp, (k + 1) * dp)) for k in range(pp)]
    return _fixed_result(_Evaluator(prob), groups)


def random_placement(network: Network, pp: int, dp: int, dp_bytes: float | Sequence[float],
                     pp_bytes: float, num_microbatches: int = 1, *,
                     seed: int | np.random.Generator | None = 0, num_gpus: int | None = None,
                     dp_algorithm: DpAlgorithm = "ring") -> PlacementResult:
    """A uniformly random assignment of tasklets to GPUs (DT-FM's random-scheduler
    baseline), costed as given."""
    prob = _problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches, num_gpus,
                    dp_algorithm)
    rng, seed_int = _generator(seed)
    perm = rng.permutation(pp * dp).reshape(pp, dp)
    return _fixed_result(_Evaluator(prob), perm.tolist(), seed_int)


def _set_partitions(items: tuple[int, ...], size: int):
    """All partitions of ``items`` into unordered blocks of ``size`` (the smallest item
    anchors each block, so each partition appears once)."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for others in itertools.combinations(rest, size - 1):
        remaining = tuple(x for x in rest if x not in others)
        for tail in _set_partitions(remaining, size):
            yield [(head, *others), *tail]


def exhaustive_placement(network: Network, pp: int, dp: int,
                         dp_bytes: float | Sequence[float], pp_bytes: float,
                         num_microbatches: int = 1, *, num_gpus: int | None = None,
                         dp_algorithm: DpAlgorithm = "ring",
                         max_placements: int = 5_000_000) -> PlacementResult:
    """Ground truth by brute force: every partition, every order of its groups (all pp!
    permutations) and every replica matching of each boundary (all dp! permutations).

    Rings use the same exact enumeration as the search (dp <= 8). Raises ValueError when
    partitions x orders exceeds ``max_placements`` (8 GPUs: 35 partitions for pp=2, 105 for
    pp=4).
    """
    prob = _problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches, num_gpus,
                    dp_algorithm)
    n = pp * dp
    count = math.factorial(n) // (math.factorial(dp) ** pp * math.factorial(pp))
    if count * math.factorial(pp) > max_placements:
        raise SpecError(
            f"exhaustive search over {count} partitions x {math.factorial(pp)} orders exceeds "
            f"max_placements={max_placements}; use evolutionary_placement",
            field="max_placements", value=count * math.factorial(pp))
    start = time.perf_counter()
    ev = _Evaluator(prob)
    orders = np.array(list(itertools.permutations(range(pp))), dtype=np.intp)
    matchings = np.array(list(itertools.permutations(range(dp))), dtype=np.intp)
    rows = np.arange(dp)
    best: tuple[float, list[tuple[int, ...]], np.ndarray] | None = None
    for part in _set_partitions(tuple(range(n)), dp):
        c = np.stack([ev.group_costs(g) for g in part])
        b = np.zeros((pp, pp))
        if ev.has_pp:
            for i in range(pp):
                for j in range(i + 1, pp):
                    cost = ev.msg[np.ix_(part[i], part[j])]
                    b[i, j] = b[j, i] = cost[rows, matchings].max(axis=1).min()
        dp_c = c[orders, np.arange(pp)].max(axis=1)
        pp_c = 2.0 * prob.m * b[orders[:, :-1], orders[:, 1:]].sum(axis=1)
        tot = dp_c + pp_c
        k = int(np.argmin(tot))
        if best is None or tot[k] < best[0]:
            best = (float(tot[k]), part, orders[k])
    assert best is not None
    _, part, order = best
    c = np.stack([ev.group_costs(g) for g in part])
    b = np.zeros((pp, pp))
    for i in range(pp):
        for j in range(i + 1, pp):
            b[i, j] = b[j, i] = ev.boundary(part[i], part[j])[0]
    groups, stage, bound = ev.ordered(part, order.tolist(), c, b)
    res = _fixed_result(ev, groups)
    return PlacementResult(res.groups, res.cost_s, res.dp_cost_s, res.pp_cost_s,
                           stage_dp_cost_s=stage, boundary_cost_s=bound, evaluations=count,
                           search_time_s=time.perf_counter() - start)


# ---- the hybrid genetic algorithm (DT-FM sec 4) ----------------------------------------------


class _Search:
    """Operators of the memetic search; all randomness from one numpy Generator."""

    def __init__(self, ev: _Evaluator, rng: np.random.Generator) -> None:
        self.ev, self.rng = ev, rng
        prob = ev.p
        self.n, self.pp, self.dp = prob.pp * prob.dp, prob.pp, prob.dp
        # Pairwise surrogate weights (seconds): the ring step if the two GPUs were ring
        # neighbours (DP wants tight groups) and the pipeline cost if they were matched across
        # a boundary (PP wants such pairs split across consecutive groups).
        n_dp = max(prob.dp, 2)
        s_ref = float(prob.dp_bytes.mean())
        t_dp = 2 * (n_dp - 1) * (ev.lat + s_ref / (n_dp * ev.bw))
        t_pp = 2.0 * prob.m * ev.msg if ev.has_pp else np.zeros_like(ev.lat)
        off = ~np.eye(self.n, dtype=bool)
        self.t_dp = t_dp / max(float(t_dp[off].mean()) if off.any() else 1.0, 1e-300)
        mean_pp = float(t_pp[off].mean()) if off.any() else 0.0
        self.t_pp = t_pp / mean_pp if mean_pp > 0 else t_pp
        np.fill_diagonal(self.t_dp, 0.0)
        np.fill_diagonal(self.t_pp, 0.0)

    def random_labels(self) -> np.ndarray:
        labels = np.empty(self.n, dtype=np.intp)
        labels[self.rng.permutation(self.n)] = np.repeat(np.arange(self.pp), self.dp)
        return labels

    def crossover(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Group-preserving crossover: a random half of ``a``'s groups, then every group of
        ``b`` disjoint from them, then the leftover GPUs shuffled into the remaining groups."""
        pp = self.pp
        ga = np.argsort(a, kind="stable").reshape(pp, self.dp)
        gb = np.argsort(b, kind="stable").reshape(pp, self.dp)
        used = np.zeros(self.n, dtype=bool)
        chosen = []
        for k in np.flatnonzero(self.rng.random(pp) < 0.5):
            chosen.append(ga[k])
            used[ga[k]] = True
        for k in self.rng.permutation(pp):
            if not used[gb[k]].any():
                chosen.append(gb[k])
                used[gb[k]] = True
        rest = np.flatnonzero(~used)
        self.rng.shuffle(rest)
        chosen.extend(rest.reshape(-1, self.dp))
        child = np.empty(self.n, dtype=np.intp)
        for k, g in enumerate(chosen):
            child[g] = k
        return child

    def mutate(self, labels: np.ndarray) -> np.ndarray:
        """Swap ``1 + Geometric`` random pairs of GPUs in different groups."""
        out = labels.copy()
        for _ in range(int(self.rng.geometric(0.5))):
            u = int(self.rng.integers(self.n))
            others = np.flatnonzero(out != out[u])
            v = int(others[self.rng.integers(others.size)])
            out[u], out[v] = out[v], out[u]
        return out

    def swap_gains(self, labels: np.ndarray, dp_share: float) -> np.ndarray:
        """Kernighan-Lin gain of swapping each pair (u, v) under the surrogate objective
        ``sum over same-group pairs of (dp_share*t_dp - (1-dp_share)*t_pp)``: vectorised,
        ``gain[u, v] = S[u,A] + S[v,B] - S[u,B] - S[v,A] + 2 w(u,v)``; -inf for pairs already
        in one group."""
        w = dp_share * self.t_dp - (1.0 - dp_share) * self.t_pp
        onehot = np.zeros((self.n, self.pp))
        onehot[np.arange(self.n), labels] = 1.0
        s = w @ onehot
        own = s[np.arange(self.n), labels]
        cross = s[:, labels]  # [u, v] = S[u, group of v]
        gain = own[:, None] + own[None, :] - cross - cross.T + 2.0 * w
        gain[labels[:, None] == labels[None, :]] = -np.inf
        return gain

    def local_search(self, labels: np.ndarray, budget: int) -> tuple[np.ndarray, float]:
        """First-improvement swaps, tried in surrogate-gain order (random tie-breaks) and
        accepted on the exact cost; at most ``budget`` swaps are costed."""
        total, dp_c, _ = self.ev.cost(labels)
        if self.pp == 1 or budget <= 0:
            return labels, total
        tried = 0
        while tried < budget:
            share = dp_c / total if total > 0 else 0.5
            gain = self.swap_gains(labels, share)
            gain = np.triu(gain, 1) + np.tril(np.full_like(gain, -np.inf))
            flat = gain.ravel()
            ok = np.flatnonzero(np.isfinite(flat))
            noise = self.rng.random(ok.size) * 1e-9 * (np.abs(flat[ok]).max() + 1.0)
            take = ok[np.argsort(-(flat[ok] + noise), kind="stable")][: budget - tried]
            improved = False
            for idx in take:
                u, v = divmod(int(idx), self.n)
                cand = labels.copy()
                cand[u], cand[v] = labels[v], labels[u]
                tried += 1
                c_total, c_dp, _ = self.ev.cost(cand)
                if c_total < total * (1 - 1e-12):
                    labels, total, dp_c, improved = cand, c_total, c_dp, True
                    break
            if not improved:
                break
        return labels, total


def evolutionary_placement(network: Network, pp: int, dp: int,
                           dp_bytes: float | Sequence[float], pp_bytes: float,
                           num_microbatches: int = 1, *,
                           seed: int | np.random.Generator | None = 0,
                           population_size: int = 24, generations: int = 30,
                           crossover_rate: float = 0.9, mutation_rate: float = 0.5,
                           local_search_evals: int = 12, elite: int = 2,
                           patience: int | None = None, num_gpus: int | None = None,
                           dp_algorithm: DpAlgorithm = "ring") -> PlacementResult:
    """Place ``pp x dp`` tasklets on GPUs ``0..pp*dp-1`` of ``network`` with DT-FM's hybrid
    genetic algorithm (Yuan et al. 2022 sec 4; a memetic algorithm in the style of GCMA,
    Kim & Moon's genetic cyclic-partitioning algorithm for balanced graph partitioning).

    Each individual is a balanced partition of the GPUs into ``pp`` groups; its fitness is the
    exact cost of its best pipeline order and replica matchings (module docstring, DT-FM
    sec 3.2). A generation breeds ``population_size`` children: binary-tournament parents,
    group-preserving crossover (probability ``crossover_rate``, else a copy of one parent),
    swap mutation (probability ``mutation_rate``) and a local search of up to
    ``local_search_evals`` improving swaps; parents and children then compete (the best
    ``population_size`` distinct partitions survive, so the best cost never rises, and the
    ``elite`` best parents are always kept). Stops after ``generations`` or ``patience``
    generations without improvement.

    Args:
        network: a ClusterSpec (its ``topology`` gives the pair costs) or PairMatrices.
        dp_bytes: per-GPU gradient bytes all-reduced per step, one per stage or one for all.
        pp_bytes: activation bytes per micro-batch per boundary, each direction.
        num_microbatches: micro-batches per step per replica (``m``).
        seed: int seed or numpy Generator; the same int gives the same result.
        num_gpus: place on the first ``num_gpus`` GPUs (default: all of the network's).
        dp_algorithm: "ring" (default) or DT-FM's "scatter_gather" estimate.

    Returns:
        PlacementResult with ``history`` = (best, mean) cost per generation, seconds.
    """
    prob = _problem(network, pp, dp, dp_bytes, pp_bytes, num_microbatches, num_gpus,
                    dp_algorithm)
    pop_size = _int_at_least("population_size", population_size, 2)
    gens = _int_at_least("generations", generations, 0)
    ls_evals = _int_at_least("local_search_evals", local_search_evals, 0)
    elite = _int_at_least("elite", elite, 0)
    if elite >= pop_size:
        raise SpecError(f"elite={elite} must be smaller than population_size={pop_size}",
                        field="elite", value=elite, allowed=f"0..{pop_size - 1}")
    for name, rate in (("crossover_rate", crossover_rate), ("mutation_rate", mutation_rate)):
        if not 0.0 <= float(rate) <= 1.0:
            raise SpecError(f"{name}={rate!r} must be in [0, 1]", field=name, value=rate,
                            allowed="0..1")
    if patience is not None:
        patience = _int_at_least("patience", patience, 1)
    rng, seed_int = _generator(seed)
    start = time.perf_counter()
    ev = _Evaluator(prob)
    ops = _Search(ev, rng)

    def individual(labels: np.ndarray) -> tuple[float, bytes, np.ndarray]:
        labels, total = ops.local_search(labels, ls_evals)
        return total, _canonical(labels), labels

    def survivors(cands: list[tuple[float, bytes, np.ndarray]],
                  ) -> list[tuple[float, bytes, np.ndarray]]:
        seen: dict[bytes, tuple[float, bytes, np.ndarray]] = {}
        for ind in cands:
            seen.setdefault(ind[1], ind)
        return sorted(seen.values(), key=lambda ind: (ind[0], ind[1]))[:pop_size]

    pop = survivors([individual(ops.random_labels()) for _ in range(pop_size)])
    while len(pop) < pop_size:
        pop = survivors(pop + [individual(ops.random_labels())])
    history = [(pop[0][0], float(np.mean([ind[0] for ind in pop])))]
    gens_run, stale = 0, 0
    for _ in range(gens):
        children = []
        for _ in range(pop_size):
            i, j = rng.integers(len(pop), size=2)
            p1 = pop[min(i, j)]  # binary tournament: pop is sorted best first
            if ops.pp > 1 and rng.random() < crossover_rate:
                k, q = rng.integers(len(pop), size=2)
                child = ops.crossover(p1[2], pop[min(k, q)][2])
            else:
                child = p1[2].copy()
            if ops.pp > 1 and rng.random() < mutation_rate:
                child = ops.mutate(child)
            children.append(individual(child))
        prev_best = pop[0][0]
        pop = survivors(pop[:elite] + children + pop[elite:])
        gens_run += 1
        history.append((pop[0][0], float(np.mean([ind[0] for ind in pop]))))
        stale = 0 if pop[0][0] < prev_best * (1 - 1e-12) else stale + 1
        if patience is not None and stale >= patience:
            break
    groups, stage, bound, dp_c, pp_c = ev.placement(pop[0][2])
    return PlacementResult(groups, dp_c + pp_c, dp_c, pp_c, history, gens_run, seed_int,
                           stage, bound, ev.evaluations, time.perf_counter() - start)
