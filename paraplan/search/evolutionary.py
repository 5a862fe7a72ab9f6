"""DT-FM-style placement of pipeline x data-parallel tasklets on a heterogeneous network.

Yuan et al. 2022, "Decentralized Training of Foundation Models in Heterogeneous
Environments" (NeurIPS 2022; "DT-FM" below), sec 3 (scheduling: cost model and search), and
its reference scheduler (DS3Lab/Decentralized_FM_alpha,
``scheduler/heuristic_evolutionary_solver/scheduler.py``). Training with ``pp`` pipeline
stages and ``dp`` data-parallel replicas (tp = cp = 1) splits a step into ``pp * dp``
*tasklets* ``(stage k, replica i)``, one per GPU. On a slow, heterogeneous network (GPUs in
several regions) *which* GPU runs which tasklet decides the communication time. DT-FM's cost
model (sec 3) reduces a placement to

1. a **partition** of the GPUs into ``pp`` groups of ``dp`` (group ``k`` runs stage ``k`` for
   every replica and all-reduces that stage's gradients inside itself: a balanced graph
   partition);
2. an **order** of the groups along the pipeline (an open-loop travelling-salesman path over
   the "coarsened" graph whose nodes are the groups); and
3. between consecutive groups a **matching** of replicas (replica ``i``'s stage-``k`` GPU sends
   its activations to replica ``i``'s stage-``k+1`` GPU; the slowest matched pair sets the
   boundary's cost, a bottleneck bipartite matching).

Cost model (times in seconds, sizes in bytes, bandwidths in bytes/s; ``alpha``/``beta`` are a
GPU pair's latency/bandwidth):

* **DP cost** (DT-FM sec 3, data-parallel cost; the max over stages because the stages
  synchronise concurrently). Stage ``k`` all-reduces ``dp_bytes[k]`` bytes (per GPU) over its
  group of ``n = dp`` GPUs with a ring (Patarasuk & Yuan 2009; the convention of
  ``paraplan.specs.topology.Topology.ring`` and ``simulator.collectives.ring_all_reduce``)::

      ring_k = 2(n-1) * L_max + 2(n-1)/n * dp_bytes[k] / B_min

  where ``B_min`` and ``L_max`` are the smallest bandwidth and largest latency on the ring's
  edges. The ring order inside the group is the one minimising ``ring_k``: exact (all
  ``(n-1)!/2`` rings) for ``n <= 8``, nearest neighbour + 2-opt above. DT-FM's own estimate
  (scatter-gather: every GPU exchanges ``1/n`` of the gradients with every other,
  ``max_d sum_{d' != d} 2 (alpha_dd' + S / (n beta_dd'))``) is available with
  ``dp_algorithm="scatter_gather"``. ``dp_cost = max_k ring_k``.
* **PP cost** (DT-FM sec 3, pipeline-parallel cost). One message of ``pp_bytes`` between GPUs
  ``a`` and ``b`` takes ``alpha_ab + pp_bytes / beta_ab``; the boundary between the groups at
  positions ``k`` and ``k+1`` costs its slowest matched pair,
  ``c_k = max_i (alpha + pp_bytes/beta)(g_k[i], g_k+1[i])``, minimised by a bottleneck
  bipartite matching. Every micro-batch crosses every boundary forward (activations) and
  backward (their gradients): ``pp_cost = 2 * m * sum_k c_k``. DT-FM's reference scheduler
  scores ``DataP + 2 * PipelineP`` with one message carrying all the micro-batches'
  activations; we charge one latency per micro-batch (``m`` messages of ``pp_bytes`` each
  way): the same bandwidth term, a more conservative latency term. Summing the boundaries is
  DT-FM's open-loop TSP objective.
* **Total** ``cost_s = dp_cost + pp_cost`` (DT-FM sec 3's communication cost).

For a partition, the order is solved exactly for ``pp <= 10`` (Held-Karp dynamic programming
over subsets, jointly with the position-dependent DP cost by enumerating DP-cost thresholds),
by nearest neighbour + 2-opt above; matchings exactly (``scipy.optimize.linear_sum_assignment``
on thresholded costs). The search over partitions is DT-FM's hybrid genetic algorithm (sec 3;
GCMA-style in the reference scheduler): group-preserving crossover, mutation by swapping GPUs
across groups, and a Kernighan-Lin-style local search of improving swaps, ranked by a
vectorised swap-gain surrogate, screened by a lower bound and verified with the exact cost.
GPUs that are interchangeable (same links to everyone, e.g. one DT-FM region) are grouped
into classes so that isomorphic partitions are costed once.

Entry points: :func:`evolutionary_placement` (the search), :func:`rank_order_placement`
(Megatron's order: stage ``k`` = GPUs ``[k*dp, (k+1)*dp)``), :func:`random_placement`,
:func:`exhaustive_placement` (ground truth on tiny instances), :func:`placement_cost` (a given
placement) and :func:`comm_volumes` (``dp_bytes``, ``pp_bytes``, ``m`` from a model,
training spec and plan with the simulator's conventions). All functions are pure; memo
tables live inside one call.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy.optimize import linear_sum_assignment

from paraplan.simulator.compression import effective_grad_bytes, pp_ratio
from paraplan.simulator.step import StepReport
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


# ---- result ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementResult:
    """A placement and its communication cost per step (DT-FM sec 3).

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
    search_time_s: float = field(default=0.0, compare=False)
    """Wall-clock seconds of the search (not compared: equal seeds give equal results)."""

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
            delta = np.triu(delta, 2)  # edges i and j must not share a node ...
            delta[0, n - 1] = 0.0  # ... including the closing edge of the ring
            i, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
            if delta[i, j] >= -1e-12 * max(1.0, old.sum()):
                break
            t = np.concatenate([t[:i + 1], t[i + 1:j + 1][::-1], t[j + 1:]])
        rings.append(t)
    return np.unique(np.array(rings), axis=0)


def _interchangeable(bw: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Class id per GPU: GPUs ``u`` and ``v`` share a class when they see every other GPU
    with the same bandwidth and latency (e.g. the GPUs of one DT-FM region). Swapping them
    changes no cost, so partitions are compared by the classes in each group (an exact
    symmetry reduction). GPUs are bucketed by the sorted multiset of their links (a
    necessary condition), then compared exactly against each class's first member (the
    relation is transitive)."""
    n = bw.shape[0]
    cls = np.full(n, -1, dtype=np.intp)
    buckets: dict[bytes, list[int]] = {}
    reps: list[int] = []
    for u in range(n):
        row = np.delete(np.stack([bw[u], lat[u]], axis=1), u, axis=0)
        sig = row[np.lexsort(row.T[::-1])].tobytes()
        for r in buckets.setdefault(sig, []):
            diff = (bw[r] != bw[u]) | (lat[r] != lat[u])
            diff[[u, r]] = False
            if not diff.any():
                cls[u] = cls[r]
                break
        else:
            cls[u] = len(reps)
            reps.append(u)
            buckets[sig].append(u)
    return cls


class _Evaluator:
    """The cost model of one problem with memo tables (local to one search call).

    Groups, boundaries and partitions are memoised by their GPU *classes*
    (:func:`_interchangeable`), so isomorphic partitions are costed once.
    """

    def __init__(self, prob: _Problem) -> None:
        self.p = prob
        bw, lat = prob.pairs.bandwidth_Bps, prob.pairs.latency_s
        self.bw, self.lat = bw, lat
        # Seconds per pipeline message between two GPUs (DT-FM sec 3: alpha + c/beta).
        self.msg = lat + prob.pp_bytes / bw
        self.has_pp = prob.pp > 1 and prob.pp_bytes > 0
        self.cls = _interchangeable(bw, lat)
        self._rings: dict[int, np.ndarray] = {}
        self._group: dict[bytes, np.ndarray] = {}
        self._pair: dict[tuple[bytes, bytes], float] = {}
        self._cost: dict[bytes, tuple[float, float, float]] = {}
        self._above: dict[bytes, float] = {}  # partitions known to cost more than this
        self._bound: dict[bytes, float] = {}  # lower bounds of partitions not yet costed
        self._layers: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.evaluations = 0

    # -- keys -------------------------------------------------------------------------------
    def members(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(members, classes): the GPUs of each group (rows, ascending) and their sorted
        class ids, rows in a canonical order (lexicographic by classes)."""
        p, d = self.p.pp, self.p.dp
        members = np.argsort(labels, kind="stable").reshape(p, d)
        classes = np.sort(self.cls[members], axis=1)
        order = np.lexsort(classes.T[::-1])
        return members[order], classes[order]

    def key(self, labels: np.ndarray) -> bytes:
        """Partition key, equal for partitions equal up to group labels and interchangeable
        GPUs."""
        return self.members(labels)[1].tobytes()

    # -- DP: ring all-reduce per stage (DT-FM sec 3, data-parallel cost) --------------------------
    def group_costs(self, g: Sequence[int] | np.ndarray, key: bytes | None = None,
                    ) -> np.ndarray:
        """Seconds for group ``g`` to all-reduce ``dp_bytes[k]``, for each stage ``k``."""
        idx = np.asarray(g, dtype=np.intp)
        if key is None:
            key = np.sort(self.cls[idx]).tobytes()
        hit = self._group.get(key)
        if hit is not None:
            return hit
        s = self.p.dp_bytes
        n = idx.size
        if n == 1:
            out = np.zeros_like(s)
        else:
            sub = idx[:, None] * self.bw.shape[0] + idx[None, :]
            bw = self.bw.ravel()[sub]
            lat = self.lat.ravel()[sub]
            if self.p.dp_algorithm == "scatter_gather":
                # DT-FM sec 3: every GPU exchanges 1/n of the gradients with every other.
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
                vols, inverse = np.unique(s, return_inverse=True)
                best = np.min(2 * (n - 1) * l_max[:, None]
                              + 2 * (n - 1) / n * vols[None, :] / b_min[:, None], axis=0)
                out = best[inverse]
            out = np.where(s > 0, out, 0.0)
        out.setflags(write=False)
        self._group[key] = out
        return out

    def ring_lower_bound(self, members: np.ndarray) -> np.ndarray:
        """(groups, stages) lower bound on :meth:`group_costs` without enumerating rings: in a
        ring every GPU has two neighbours, so the ring's slowest edge is no faster than any
        GPU's second-fastest link and its largest latency no smaller than any GPU's
        second-smallest (seconds)."""
        n = members.shape[1]
        s = self.p.dp_bytes
        if n == 1 or self.p.dp_algorithm != "ring":
            return np.stack([self.group_costs(row) for row in members])
        bw = np.sort(self.bw[members[:, :, None], members[:, None, :]], axis=2)
        lat = np.sort(self.lat[members[:, :, None], members[:, None, :]], axis=2)
        k = 1 if n == 2 else 2  # entry 0 of each row is the GPU itself (inf bw, 0 latency)
        b_ub = bw[:, :, n - 1 - k].min(axis=1)
        l_lb = lat[:, :, k].max(axis=1)
        out = 2 * (n - 1) * (l_lb[:, None] + s[None, :] / (n * b_ub[:, None]))
        return np.where(s[None, :] > 0, out, 0.0)

    # -- PP: bottleneck matching between two groups (DT-FM sec 3) ---------------------------
    def matching(self, a: Sequence[int], b: Sequence[int]) -> tuple[float, np.ndarray]:
        """(seconds per message of the slowest matched pair, ``match``): the replica on
        ``a[i]`` sends to ``b[match[i]]``; the bottleneck-optimal matching with the least
        total time among those."""
        if not self.has_pp:
            return 0.0, np.arange(len(a))
        return _bottleneck_matching(self.msg[np.asarray(a)[:, None], np.asarray(b)[None, :]])

    def boundary(self, a: np.ndarray, b: np.ndarray, ka: bytes, kb: bytes) -> float:
        """Seconds per message across the boundary between groups ``a`` and ``b``, memoised
        by their classes ``ka`` and ``kb``."""
        if not self.has_pp:
            return 0.0
        key = (ka, kb) if ka <= kb else (kb, ka)
        hit = self._pair.get(key)
        if hit is None:
            hit = self._pair[key] = self.matching(a, b)[0]
        return hit

    # -- order along the pipeline (DT-FM sec 3, open-loop TSP) ------------------------------
    def layers(self, p: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        hit = self._layers.get(p)
        if hit is None:
            hit = self._layers[p] = _subset_layers(p)
        return hit

    def best_order(self, w: np.ndarray, c: np.ndarray, cutoff: float = math.inf,
                   ) -> tuple[list[int], float, float] | None:
        """Order of groups minimising ``max_k c[g_k, k] + sum_k w[g_k, g_k+1]`` (seconds):
        (order, dp cost, pp cost); None if that exceeds ``cutoff``."""
        p = w.shape[0]
        if p == 1:
            found = [0], float(c[0, 0]), 0.0
        elif p <= ORDER_EXACT_MAX:
            return _exact_order(w, c, self.layers(p), cutoff)
        else:
            found = _heuristic_order(w, c)
        return None if found[1] + found[2] > cutoff else found

    # -- a whole partition ------------------------------------------------------------------
    def parts(self, members: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(c, b): DP seconds of each group at each stage, seconds per message of each
        boundary between two groups."""
        p = members.shape[0]
        keys = [row.tobytes() for row in classes]
        c = np.stack([self.group_costs(members[i], keys[i]) for i in range(p)])
        b = np.zeros((p, p))
        if self.has_pp:
            for i in range(p):
                for j in range(i + 1, p):
                    b[i, j] = b[j, i] = self.boundary(members[i], members[j], keys[i], keys[j])
        return c, b

    def lower_bound(self, labels: np.ndarray) -> float:
        """A cheap lower bound on :meth:`cost` (seconds), to skip hopeless swaps.

        DP: every group sits at some position and every position holds some group, so the
        DP cost is at least ``max(max_g min_k c[g,k], max_k min_g c[g,k])`` with ``c`` from
        :meth:`ring_lower_bound`. PP: a boundary's bottleneck matching is at least the
        largest row minimum and column minimum of its pair-cost matrix (every GPU needs a
        partner), and a pipeline path is a spanning tree of the groups, so ``2 m`` x the
        minimum spanning tree of those bounds (Prim) is at most the pipeline cost.
        """
        members, classes = self.members(labels)
        key = classes.tobytes()
        hit = self._cost.get(key)
        if hit is not None:
            return hit[0]
        known = self._bound.get(key)
        if known is not None:
            return known
        c = self.ring_lower_bound(members)
        bound = float(max(c.min(axis=1).max(), c.min(axis=0).max()))
        if self.has_pp:
            cost = self.msg[members[:, None, :, None], members[None, :, None, :]]
            w = np.maximum(cost.min(axis=3).max(axis=2), cost.min(axis=2).max(axis=2))
            bound += 2.0 * self.p.m * _spanning_tree(w.tolist())
        self._bound[key] = bound
        return bound

    def cost(self, labels: np.ndarray, cutoff: float = math.inf,
             ) -> tuple[float, float, float] | None:
        """(total, dp, pp) seconds of the best order and matchings for partition ``labels``,
        or None when the total exceeds ``cutoff`` (known without finishing the search)."""
        members, classes = self.members(labels)
        key = classes.tobytes()
        hit = self._cost.get(key)
        if hit is not None:
            return hit if hit[0] <= cutoff else None
        if self._above.get(key, -math.inf) >= cutoff:
            return None
        c, b = self.parts(members, classes)
        found = self.best_order(2.0 * self.p.m * b, c, cutoff)
        if found is None:
            self._above[key] = max(cutoff, self._above.get(key, -math.inf))
            return None
        _, dp_c, pp_c = found
        hit = self._cost[key] = (dp_c + pp_c, dp_c, pp_c)
        self.evaluations += 1
        return hit

    def total(self, labels: np.ndarray) -> tuple[float, float, float]:
        """:meth:`cost` without a cutoff."""
        found = self.cost(labels)
        assert found is not None
        return found

    def placement(self, labels: np.ndarray) -> tuple[list[list[int]], tuple[float, ...],
                                                      tuple[float, ...], float, float]:
        """Groups in pipeline and replica order for partition ``labels``, with per-stage DP
        seconds, per-boundary seconds per message, dp cost and pp cost."""
        members, classes = self.members(labels)
        c, b = self.parts(members, classes)
        found = self.best_order(2.0 * self.p.m * b, c)
        assert found is not None
        order, dp_c, pp_c = found
        return self.ordered(members, order, c, b) + (dp_c, pp_c)

    def ordered(self, members: np.ndarray | Sequence[Sequence[int]], order: Sequence[int],
                c: np.ndarray, b: np.ndarray,
                ) -> tuple[list[list[int]], tuple[float, ...], tuple[float, ...]]:
        """Groups ``members`` laid out along ``order``, each boundary's bottleneck matching
        chaining the replicas; with per-stage DP seconds and per-boundary seconds."""
        seq = [list(map(int, members[i])) for i in order]
        groups = [seq[0]]
        for k in range(len(seq) - 1):
            _, match = self.matching(seq[k], seq[k + 1])
            partner = dict(zip(seq[k], (seq[k + 1][j] for j in match), strict=True))
            groups.append([partner[gpu] for gpu in groups[k]])
        stage = tuple(float(c[order[k], k]) for k in range(len(seq)))
        bound = tuple(float(b[order[k], order[k + 1]]) for k in range(len(seq) - 1))
        return groups, stage, bound


def _spanning_tree(w: list[list[float]]) -> float:
    """Weight of a minimum spanning tree of the complete graph ``w`` (Prim, O(p^2))."""
    p = len(w)
    dist = list(w[0])
    done = [False] * p
    done[0] = True
    total = 0.0
    for _ in range(p - 1):
        j = min((d, k) for k, d in enumerate(dist) if not done[k])[1]
        total += dist[j]
        done[j] = True
        row = w[j]
        dist = [min(a, b) for a, b in zip(dist, row, strict=True)]
    return total


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
    """The constant part of Held-Karp for ``p`` nodes, per path length s: (flat table index
    of every (mask of s nodes, end j), flat index ``prev * p + i`` of the entry (mask
    without j, ending at i) laid out (i, mask, j), 0/inf penalty where j is not in the
    mask)."""
    allm = np.arange(1 << p)
    bits = 1 << np.arange(p)
    count = np.zeros(allm.size, dtype=np.intp)
    for k in range(p):
        count += (allm >> k) & 1
    nodes = np.arange(p)
    layers = []
    for size in range(p + 1):
        ms = allm[count == size]
        inside = (ms[:, None] & bits[None, :]) != 0
        prev = ms[:, None] ^ bits[None, :]
        src = prev[None, :, :] * p + nodes[:, None, None]
        dst = ms[:, None] * p + nodes[None, :]
        layers.append((dst, src, np.where(inside, 0.0, np.inf)))
    return layers


def _held_karp(w: np.ndarray, allowed: np.ndarray,
               layers: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
               ) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest open paths visiting every node once, for a batch of position constraints:
    node ``j`` may sit at position ``k`` only where ``allowed[t, j, k]``. Held-Karp DP over
    subsets (``table[mask, j]`` = cheapest path through ``mask`` ending at ``j``), one numpy
    pass per path length for the whole batch. Returns (cost per batch entry, inf where
    infeasible; the tables, shape (2^p, p, batch), for :func:`_hk_path`)."""
    nt, p = allowed.shape[0], w.shape[0]
    full = 1 << p
    table = np.full((full * p, nt), np.inf)
    ban = np.where(allowed, 0.0, np.inf).transpose(2, 1, 0)  # (position, node j, batch)
    nodes = np.arange(p)
    table[(1 << nodes) * p + nodes] = ban[0]
    wt = w[:, None, :, None]  # [i, _, j, _] = w[i, j]
    for size in range(2, p + 1):
        dst, src, outside = layers[size]
        step = (table[src] + wt).min(axis=0)  # (masks, j, batch)
        table[dst] = step + outside[:, :, None] + ban[size - 1][None, :, :]
    tables = table.reshape(full, p, nt)
    return tables[full - 1].min(axis=0), tables


def _hk_path(w: np.ndarray, table: np.ndarray) -> list[int]:
    """Walk one Held-Karp table (2^p, p) back from its best end to recover the path."""
    p = w.shape[0]
    mask = (1 << p) - 1
    j = int(np.argmin(table[mask]))
    path = [j]
    while len(path) < p:
        here = table[mask, j]
        mask ^= 1 << j
        j = int(np.argmin(np.abs(table[mask] + w[:, j] - here)))
        path.append(j)
    return path[::-1]


def _order_cost(order: Sequence[int], w: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    o = np.asarray(order)
    dp_c = float(c[o, np.arange(o.size)].max())
    pp_c = float(w[o[:-1], o[1:]].sum())
    return dp_c, pp_c


def _exact_order(w: np.ndarray, c: np.ndarray,
                 layers: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                 cutoff: float = math.inf) -> tuple[list[int], float, float] | None:
    """Exact min over orders of ``max_k c[g_k, k] + path(w)``: (order, dp, pp), or None when
    the optimum exceeds ``cutoff`` (then it is not computed to the end).

    The optimum is ``min_T T + P(T)`` over the distinct values ``T`` of ``c``, where
    ``P(T)`` is the cheapest path with every group's DP cost at its position <= T (the
    optimal order is feasible at its own DP cost; any path feasible at T costs at most
    ``T + P(T)``). First the unconstrained path (cost ``P0``, DP cost ``d0``); then, for
    ascending thresholds ``T < d0`` while ``T + P0`` can still beat the best so far (and the
    cutoff) and groups can be assigned to positions within ``T`` (checked by an assignment),
    the constrained Held-Karp path.
    """
    p = w.shape[0]
    costs, tables = _held_karp(w, np.ones((1, p, p), dtype=bool), layers)
    p0 = float(costs[0])
    low = max(c.min(axis=0).max(), c.min(axis=1).max())  # below: some slot has no group
    if low + p0 > cutoff:
        return None
    order = _hk_path(w, tables[:, :, 0])
    best_dp, best_pp = _order_cost(order, w, c)
    best = best_dp + best_pp
    for t in np.unique(c[(c >= low) & (c < best_dp)]):
        if t + p0 >= best * (1 - 1e-12) or t + p0 > cutoff:
            break
        allowed = c <= t
        over = (~allowed).astype(float)
        r, col = linear_sum_assignment(over)
        if over[r, col].sum() > 0:  # no assignment of groups to positions within t
            continue
        costs, tables = _held_karp(w, allowed[None], layers)
        if t + costs[0] < best * (1 - 1e-12):
            path = _hk_path(w, tables[:, :, 0])
            d, q = _order_cost(path, w, c)
            if d + q < best:
                order, best_dp, best_pp, best = path, d, q, d + q
    if best > cutoff:
        return None
    return order, best_dp, best_pp


def _two_opt_path(order: np.ndarray, w: np.ndarray) -> np.ndarray:
    """2-opt on an open path (segment reversals) until no move shortens ``sum w``; all moves
    of a round are priced at once with numpy (a zero-cost dummy node pins both ends)."""
    p = order.size
    ext = np.zeros((p + 1, p + 1))
    ext[:p, :p] = w
    o = order.copy()
    upper = np.triu(np.ones((p, p), dtype=bool), 1)
    for _ in range(p * p):
        full = np.concatenate([[p], o, [p]])
        a, b, d = full[:-2], full[1:-1], full[2:]
        # reverse b[i..j]: edges (a_i, b_i) and (b_j, d_j) become (a_i, b_j) and (b_i, d_j)
        delta = (ext[a[:, None], b[None, :]] + ext[b[:, None], d[None, :]]
                 - ext[a, b][:, None] - ext[b, d][None, :])
        delta = np.where(upper, delta, 0.0)
        i, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
        if delta[i, j] >= -1e-12 * max(1.0, float(np.abs(w).max())):
            break
        o[i:j + 1] = o[i:j + 1][::-1].copy()
    return o


def _heuristic_order(w: np.ndarray, c: np.ndarray) -> tuple[list[int], float, float]:
    """Order for pp above ORDER_EXACT_MAX: nearest-neighbour paths from every start (built
    together with numpy), the three shortest improved by 2-opt, every candidate tried in
    both directions on the true (position-dependent) objective."""
    p = w.shape[0]
    rows = np.arange(p)
    paths = np.zeros((p, p), dtype=np.intp)
    paths[:, 0] = rows
    visited = np.eye(p, dtype=bool)
    for k in range(1, p):
        nxt = np.where(visited, np.inf, w[paths[:, k - 1]]).argmin(axis=1)
        paths[:, k] = nxt
        visited[rows, nxt] = True
    sums = w[paths[:, :-1], paths[:, 1:]].sum(axis=1)
    improved = [_two_opt_path(paths[i], w) for i in np.argsort(sums, kind="stable")[:3]]
    cands = np.concatenate([paths, np.array(improved)])
    cands = np.concatenate([cands, cands[:, ::-1]])
    totals = c[cands, rows].max(axis=1) + w[cands[:, :-1], cands[:, 1:]].sum(axis=1)
    best = cands[int(np.argmin(totals))].tolist()
    d, q = _order_cost(best, w, c)
    return best, d, q


# ---- fixed placements ------------------------------------------------------------------------


def _fixed_result(ev: _Evaluator, groups: list[list[int]], seed: int | None = None,
                  ) -> PlacementResult:
    """Cost of ``groups`` exactly as given (order and replica matching fixed; each group's
    ring order is still chosen by the cost model)."""
    prob = ev.p
    stage = tuple(float(ev.group_costs(g)[k]) for k, g in enumerate(groups))
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
    of stage ``k`` of replica ``i`` (DT-FM sec 3). ``groups`` must use every GPU of
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
    """The naive placement: stage ``k`` runs on GPUs ``[k*dp, (k+1)*dp)`` in index order,
    replica ``i`` on the ``i``-th GPU of each stage (Megatron's rank order with tp=1, the
    baseline of DT-FM's evaluation), pipeline order and matchings not optimised."""
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


def _set_partitions(items: tuple[int, ...], size: int,
                    ) -> Iterator[list[tuple[int, ...]]]:
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
            b[i, j] = b[j, i] = ev.matching(part[i], part[j])[0]
    groups, stage, bound = ev.ordered(part, order.tolist(), c, b)
    res = _fixed_result(ev, groups)
    return PlacementResult(res.groups, res.cost_s, res.dp_cost_s, res.pp_cost_s,
                           stage_dp_cost_s=stage, boundary_cost_s=bound, evaluations=count,
                           search_time_s=time.perf_counter() - start)


# ---- the hybrid genetic algorithm (DT-FM sec 3) ----------------------------------------------


class _Search:
    """Operators of the memetic search; all randomness from one numpy Generator."""

    def __init__(self, ev: _Evaluator, rng: np.random.Generator) -> None:
        self.ev, self.rng = ev, rng
        prob = ev.p
        self.n, self.pp, self.dp = prob.pp * prob.dp, prob.pp, prob.dp
        # Pairwise surrogate weights, each normalised by its mean: t_dp is the ring time if the
        # two GPUs' link were a stage's bottleneck (DP wants such pairs in one group), t_pp
        # the pipeline time if they were matched across every boundary (PP wants slow pairs
        # kept apart, i.e. inside one group, and fast pairs in consecutive groups).
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
        self.iu, self.iv = np.triu_indices(self.n, 1)

    def random_labels(self) -> np.ndarray:
        labels = np.empty(self.n, dtype=np.intp)
        labels[self.rng.permutation(self.n)] = np.repeat(np.arange(self.pp), self.dp)
        return labels

    def crossover(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Group-preserving crossover: each group of ``a`` is inherited with probability
        ``f ~ U(0, 1)`` (drawn per child), then each group of ``b`` disjoint from those with
        the same probability; the leftover GPUs form the remaining groups, shuffled at random
        or (half of the time) dealt out by class like cards, which gives groups of equal
        class composition: consecutive stages whose GPUs pair up inside a region."""
        pp, dp = self.pp, self.dp
        ga = np.argsort(a, kind="stable").reshape(pp, dp)
        gb = np.argsort(b, kind="stable").reshape(pp, dp)
        used = np.zeros(self.n, dtype=bool)
        chosen = []
        f = self.rng.random()
        for k in np.flatnonzero(self.rng.random(pp) < f):
            chosen.append(ga[k])
            used[ga[k]] = True
        for k in self.rng.permutation(pp):
            if not used[gb[k]].any() and self.rng.random() < f:
                chosen.append(gb[k])
                used[gb[k]] = True
        rest = np.flatnonzero(~used)
        self.rng.shuffle(rest)
        left = rest.size // dp
        if self.rng.random() < 0.5:  # deal by class: group j gets rest[j], rest[j+left], ...
            rest = rest[np.argsort(self.ev.cls[rest], kind="stable")]
            chosen.extend(rest.reshape(dp, left).T)
        else:
            chosen.extend(rest.reshape(left, dp))
        child = np.empty(self.n, dtype=np.intp)
        for k, g in enumerate(chosen):
            child[g] = k
        return child

    def mutate(self, labels: np.ndarray) -> np.ndarray:
        """Swap ``Geometric(1/2)`` (1 or more) random pairs of GPUs in different groups and of
        different classes (swapping interchangeable GPUs would change nothing)."""
        out = labels.copy()
        cls = self.ev.cls
        for _ in range(int(self.rng.geometric(0.5))):
            u = int(self.rng.integers(self.n))
            others = np.flatnonzero((out != out[u]) & (cls != cls[u]))
            if others.size == 0:
                others = np.flatnonzero(out != out[u])
            v = int(others[self.rng.integers(others.size)])
            out[u], out[v] = out[v], out[u]
        return out

    def swap_gains(self, labels: np.ndarray, dp_share: float) -> np.ndarray:
        """Kernighan-Lin gain of swapping each pair (u, v) under the surrogate objective
        ``sum over same-group pairs of (dp_share*t_dp - (1-dp_share)*t_pp)``, vectorised:
        ``gain[u, v] = S[u,A] + S[v,B] - S[u,B] - S[v,A] + 2 w(u,v)`` with ``S[x, G]`` the
        weight from ``x`` to group ``G``."""
        w = dp_share * self.t_dp - (1.0 - dp_share) * self.t_pp
        onehot = np.zeros((self.n, self.pp))
        onehot[np.arange(self.n), labels] = 1.0
        s = w @ onehot
        own = s[np.arange(self.n), labels]
        cross = s[:, labels]  # [u, v] = S[u, group of v]
        return own[:, None] + own[None, :] - cross - cross.T + 2.0 * w

    def candidates(self, labels: np.ndarray, dp_share: float) -> tuple[np.ndarray, np.ndarray]:
        """Swaps (u, v) that change the partition, best surrogate gain first (random
        tie-breaks), one per distinct outcome (group and class of both ends)."""
        u, v = self.iu, self.iv
        cls, nc = self.ev.cls, int(self.ev.cls.max()) + 1
        keep = np.flatnonzero((labels[u] != labels[v]) & (cls[u] != cls[v]))
        if keep.size == 0:
            return keep, keep
        gain = self.swap_gains(labels, dp_share)[u[keep], v[keep]]
        noise = self.rng.random(keep.size) * 1e-9 * (float(np.abs(gain).max()) + 1.0)
        keep = keep[np.argsort(-(gain + noise), kind="stable")]
        a = labels[u[keep]] * nc + cls[u[keep]]
        b = labels[v[keep]] * nc + cls[v[keep]]
        code = np.minimum(a, b) * (self.pp * nc) + np.maximum(a, b)
        _, first = np.unique(code, return_index=True)
        keep = keep[np.sort(first)]
        return u[keep], v[keep]

    def local_search(self, labels: np.ndarray, budget: int) -> tuple[np.ndarray, float]:
        """Kernighan-Lin-style swaps (DT-FM sec 3's local search): candidates from
        :meth:`candidates`, screened by :meth:`_Evaluator.lower_bound` and costed exactly;
        the first improving swap is taken and the gains recomputed. At a local optimum one
        sideways swap (equal cost, to a partition not seen in this search) may be taken,
        since improvements on these bottleneck objectives often need two swaps (KL's
        tentative moves). At most ``budget`` swaps are costed exactly, ``8 * budget``
        screened."""
        total, dp_c, _ = self.ev.total(labels)
        if self.pp == 1 or budget <= 0:
            return labels, total
        exact, screened, sideways = 0, 0, 1
        seen = {self.ev.key(labels)}
        while exact < budget and screened < 8 * budget:
            share = dp_c / total if total > 0 else 0.5
            moved = False
            plateau: tuple[np.ndarray, float, float] | None = None
            for u, v in zip(*self.candidates(labels, share), strict=True):
                if exact >= budget or screened >= 8 * budget:
                    break
                cand = labels.copy()
                cand[u], cand[v] = labels[v], labels[u]
                screened += 1
                if self.ev.lower_bound(cand) > total * (1 + 1e-12):
                    continue
                exact += 1
                found = self.ev.cost(cand, total * (1 + 1e-12))
                if found is None:
                    continue
                c_total, c_dp, _ = found
                if c_total < total * (1 - 1e-12):
                    labels, total, dp_c, moved = cand, c_total, c_dp, True
                    seen.add(self.ev.key(labels))
                    break
                if (plateau is None and sideways and c_total <= total * (1 + 1e-12)
                        and self.ev.key(cand) not in seen):
                    plateau = (cand, c_total, c_dp)
            if not moved and plateau is not None:
                labels, total, dp_c = plateau
                seen.add(self.ev.key(labels))
                sideways -= 1
                moved = True
            if not moved:
                break
        return labels, total


def evolutionary_placement(network: Network, pp: int, dp: int,
                           dp_bytes: float | Sequence[float], pp_bytes: float,
                           num_microbatches: int = 1, *,
                           seed: int | np.random.Generator | None = 0,
                           population_size: int = 16, generations: int = 20,
                           crossover_rate: float = 0.9, mutation_rate: float = 0.5,
                           immigrant_rate: float = 0.2,
                           local_search_evals: int = 10, patience: int | None = None,
                           num_gpus: int | None = None,
                           dp_algorithm: DpAlgorithm = "ring") -> PlacementResult:
    """Place ``pp x dp`` tasklets on GPUs ``0..pp*dp-1`` of ``network`` with DT-FM's hybrid
    genetic algorithm (Yuan et al. 2022 sec 3: a memetic algorithm for balanced graph
    partitioning, GCMA in the reference scheduler).

    Each individual is a balanced partition of the GPUs into ``pp`` groups; its fitness is the
    exact cost of its best pipeline order and replica matchings (module docstring, DT-FM
    sec 3). A generation breeds ``population_size`` children: binary-tournament parents,
    group-preserving crossover (probability ``crossover_rate``, else a copy of one parent),
    swap mutation (probability ``mutation_rate``) and a local search of up to
    ``local_search_evals`` swaps; a fraction ``immigrant_rate`` of the children are random
    partitions instead (locally searched too), which keeps the search from settling in one
    basin of these multi-modal landscapes. Parents and children then compete (the best
    ``population_size`` distinct partitions survive, so the best cost never rises; random
    immigrants refill a population short of distinct partitions). Stops after
    ``generations``, or after ``patience`` generations without improvement. Unlike DT-FM
    (random initial population) the rank-order partition is one of the initial individuals,
    so the result never costs more than :func:`rank_order_placement`.

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
    for name, rate in (("crossover_rate", crossover_rate), ("mutation_rate", mutation_rate),
                       ("immigrant_rate", immigrant_rate)):
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
        return total, ev.key(labels), labels

    def survivors(cands: list[tuple[float, bytes, np.ndarray]],
                  ) -> list[tuple[float, bytes, np.ndarray]]:
        """The best ``pop_size`` distinct partitions; random immigrants (not locally
        searched) fill the population when too few distinct ones remain."""
        seen: dict[bytes, tuple[float, bytes, np.ndarray]] = {}
        for ind in cands:
            seen.setdefault(ind[1], ind)
        for _ in range(2 * pop_size):
            if len(seen) >= pop_size:
                break
            labels = ops.random_labels()
            seen.setdefault(ev.key(labels), (ev.total(labels)[0], ev.key(labels), labels))
        return sorted(seen.values(), key=lambda ind: (ind[0], ind[1]))[:pop_size]

    # Megatron's rank order joins the random initial population, so the search never
    # returns a partition worse than the naive baseline's.
    rank_order = np.repeat(np.arange(prob.pp), prob.dp)
    pop = survivors([individual(rank_order)]
                    + [individual(ops.random_labels()) for _ in range(pop_size - 1)])
    history = [(pop[0][0], float(np.mean([ind[0] for ind in pop])))]
    gens_run, stale = 0, 0
    for _ in range(gens):
        children = []
        for _ in range(pop_size):
            if rng.random() < immigrant_rate:  # random immigrant: a fresh basin
                children.append(individual(ops.random_labels()))
                continue
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
        pop = survivors(pop + children)
        gens_run += 1
        history.append((pop[0][0], float(np.mean([ind[0] for ind in pop]))))
        stale = 0 if pop[0][0] < prev_best * (1 - 1e-12) else stale + 1
        if patience is not None and stale >= patience:
            break
    groups, stage, bound, dp_c, pp_c = ev.placement(pop[0][2])
    return PlacementResult(groups, dp_c + pp_c, dp_c, pp_c, history, gens_run, seed_int,
                           stage, bound, ev.evaluations, time.perf_counter() - start)


# ---- plan search with placement (``paraplan best --searcher evolutionary``) ------------------

SHORTLIST = 12
"""Distinct plan shapes (tp, pp, dp, cp, ep, vpp) taken from the uniform-view ranking."""
VARIANTS = 4
"""Fastest variants (ZeRO, recompute, micro-batch, schedule) kept per shortlisted shape."""
PLACED = 3
"""Of those, the fastest shapes (simulated on the real network in rank order) get a GA
placement (each with all its shortlisted ZeRO / recompute / schedule variants)."""


def uniform_view(cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` as one node group of its slowest GPU type on its first group's links and
    node shape: what a topology-oblivious planner assumes. Used to shortlist plan shapes (the
    vectorized space needs one GPU type); every shortlisted plan is then simulated on the real
    cluster. The GPU kept is the one with the least memory (then the lowest peak FLOP/s), so
    a shape that fits the view fits every GPU of the cluster."""
    if cluster.is_homogeneous:
        return cluster
    groups = cluster.node_groups
    gpn = min(g.gpus_per_node for g in groups)
    n = cluster.num_gpus
    if n % gpn:
        raise SpecError(f"cluster {cluster.name!r} mixes node sizes whose smallest "
                        f"({gpn} GPUs) does not divide its {n} GPUs", field="cluster",
                        value=cluster.name)
    slow = min(groups, key=lambda g: (g.gpu.memory_GiB, max(g.gpu.peak_tflops.values())))
    first = next(g for g in groups if g.gpus_per_node == gpn)
    group = first.model_copy(update={"gpu": slow.gpu, "num_nodes": n // gpn,
                                     "region": "default", "name": "uniform"})
    return ClusterSpec(name=f"{cluster.name}-uniform", node_groups=[group])


def _slot_matrices(cluster: ClusterSpec, unit: int) -> tuple[np.ndarray, PairMatrices]:
    """First GPU of every aligned block of ``unit`` GPUs, and the pair costs between them."""
    topo = cluster.topology
    slots = np.arange(0, cluster.num_gpus, unit)
    a, b = (x.ravel() for x in np.meshgrid(slots, slots, indexing="ij"))
    bw, lat, _ = topo._pairs(a, b, shared=True)
    k = slots.size
    return slots, PairMatrices(np.asarray(bw, float).reshape(k, k) * 1e9,
                               np.asarray(lat, float).reshape(k, k))


def _placement_of(groups: list[list[int]], slots: np.ndarray, unit: int) -> list[int]:
    """Rank -> GPU for a (stage, replica) -> slot assignment: the tasklet of stage k and
    replica i (ranks ``(i + dp*k)*unit .. +unit`` in Megatron order, unit = tp*cp) runs on
    the ``unit`` consecutive GPUs of slot ``groups[k][i]``."""
    out: list[int] = []
    for row in groups:
        for s in row:
            base = int(slots[s])
            out.extend(range(base, base + unit))
    # out lists ranks stage-major, replica next, tp*cp innermost: exactly Megatron's order.
    return out


def _shape(plan: dict) -> tuple:
    return tuple(plan.get(k) for k in ("tp", "pp", "dp", "cp", "ep", "virtual_stages"))


def evolutionary_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
                        fix: dict | None = None, top: int = 10, options=None,
                        progress=None, seed: int = 0, shortlist: int = SHORTLIST,
                        placed: int = PLACED, generations: int = 20,
                        population_size: int = 16):
    """Best plans with topology-aware placement (DT-FM sec 3), for ``paraplan best``.

    1. Shortlist: rank every legal plan shape with the vectorized exhaustive search on the
       cluster's :func:`uniform_view` (one GPU type, uniform links) and keep ``shortlist``.
    2. Simulate each on the real cluster in Megatron rank order (``placement`` = identity):
       the best of these is ``baseline_step_time_s``, what topology-oblivious placement gets.
    3. For the ``placed`` fastest, place the (stage, replica) tasklets - blocks of tp*cp GPUs,
       so TP/CP groups stay together - with :func:`evolutionary_placement` on the pair costs
       between blocks, and simulate the placed plan (``simulate`` prices every stage's DP
       group and every boundary on the GPUs the placement uses). A placement that the
       simulator does not find faster than rank order is dropped.

    The GA minimises DT-FM's communication cost; compute heterogeneity (mixed GPU types) is
    only seen by ``simulate``'s verification - the ILP searcher models it. Times in seconds.
    Returns a :class:`~paraplan.search.exhaustive.SearchResult` whose ``extra["placements"]``
    lists, per placed shape, the DT-FM cost of rank order and of the GA placement, the
    simulated step times and the GA's convergence (best cost per generation).
    """
    from paraplan.search.exhaustive import SearchResult, rank_key
    from paraplan.search.space import build_space, evaluate_space
    from paraplan.simulator.step import simulate

    start = time.perf_counter()
    if top < 1:
        raise SpecError("top must be >= 1", field="top", value=top)
    view = uniform_view(cluster)
    space = build_space(model, view, training, fix, options)
    if len(space) == 0:
        reasons = ", ".join(f"{k:,} {r}" for r, k in space.rejected.most_common(3))
        raise SpecError(f"no legal plan for {model.name} on {cluster.num_gpus} GPUs of "
                        f"{cluster.name}" + (f" ({reasons})" if reasons else ""),
                        field="plan", value=str(fix or {}))
    ev = evaluate_space(space, None, exact_interleaved=False)
    ok = np.nonzero(ev.feasible & np.isfinite(ev.step_time_s))[0]
    if ok.size == 0:
        raise SpecError(f"no plan of {model.name} fits in the memory of {cluster.name!r}'s "
                        f"smallest GPU ({view.gpu.name}, {view.gpu.memory_GiB:g} GiB)",
                        field="memory", value=view.gpu.memory_GiB)
    n = cluster.num_gpus
    identity = list(range(n))
    # The best ``VARIANTS`` rows (ZeRO, recompute, micro-batch, schedule) of each of the
    # ``shortlist`` fastest shapes (tp, pp, dp, cp, ep, vpp) on the uniform view: on slow
    # links the shape decides what crosses the network, so every shape gets a chance.
    cols = space.cols
    order = ok[np.argsort(ev.step_time_s[ok], kind="stable")]
    per_shape: dict[tuple, int] = {}
    keep = []
    for i in order.tolist():
        key = tuple(int(cols[k][i]) for k in ("tp", "pp", "dp", "cp", "ep", "v"))
        if key not in per_shape:
            if len(per_shape) >= shortlist:
                continue
            per_shape[key] = 0
        if per_shape[key] < VARIANTS:
            per_shape[key] += 1
            keep.append(space.plan(i))
        if len(per_shape) >= shortlist and all(v >= VARIANTS for v in per_shape.values()):
            break
    rank_order: list[tuple[StepReport, ParallelPlan]] = []
    for plan in keep:
        r = simulate(model, cluster, training, plan.model_copy(update={"placement": identity}))
        if r.feasible and r.step_time_s is not None:
            rank_order.append((r, plan))
    if not rank_order:
        raise SpecError(f"none of the {len(keep)} fastest plans of the uniform "
                        f"view fits {cluster.name!r} once simulated on its real GPUs",
                        field="cluster", value=cluster.name)
    rank_order.sort(key=lambda x: rank_key(x[0]))
    baseline = rank_order[0][0].step_time_s
    reports = [r for r, _ in rank_order]
    info: list[dict] = []
    cache: dict[tuple, PlacementResult] = {}
    seen: set[tuple] = set()
    chosen: list[tuple] = []  # the ``placed`` fastest shapes on the real cluster
    for r, _ in rank_order:
        if _shape(r.plan) not in chosen and len(chosen) < placed:
            chosen.append(_shape(r.plan))
    todo = [(r, p) for r, p in rank_order if _shape(r.plan) in chosen]
    for j, (base_rep, plan) in enumerate(todo):
        dp = plan.resolved_dp(n)
        unit = plan.tp * plan.cp
        if plan.pp * dp < 2:
            continue
        slots, pairs = _slot_matrices(cluster, unit)
        vol = comm_volumes(model, training, plan, n, model_parallel=True)
        key = (plan.pp, dp, unit, vol.dp_bytes, vol.pp_bytes, vol.num_microbatches)
        if key not in cache:
            cache[key] = evolutionary_placement(
                pairs, plan.pp, dp, vol.dp_bytes, vol.pp_bytes, vol.num_microbatches,
                seed=seed, generations=generations, population_size=population_size,
                patience=max(3, generations // 4))
        res = cache[key]
        naive = rank_order_placement(pairs, plan.pp, dp, vol.dp_bytes, vol.pp_bytes,
                                     vol.num_microbatches)
        placed_plan = plan.model_copy(update={"placement": _placement_of(res.groups, slots,
                                                                         unit)})
        rep = simulate(model, cluster, training, placed_plan)
        kept = bool(rep.feasible and rep.step_time_s is not None
                    and rep.step_time_s < base_rep.step_time_s * (1 - 1e-9))
        if kept:
            rep.extra.update(placement_comm_cost_s=res.cost_s,
                             rank_order_comm_cost_s=naive.cost_s,
                             rank_order_step_time_s=base_rep.step_time_s)
            reports.append(rep)
        if key not in seen:  # one row per GA run (its fastest variant)
            seen.add(key)
            info.append({"plan": plan.short(), "rank_order_step_time_s": base_rep.step_time_s,
                         "placed_step_time_s": rep.step_time_s if rep.feasible else None,
                         "kept": kept, "rank_order_comm_cost_s": naive.cost_s,
                         "placement_comm_cost_s": res.cost_s,
                         "generations": res.generations_run, "evaluations": res.evaluations,
                         "convergence_s": [round(b, 6) for b, _ in res.history]})
        if progress:
            progress(j + 1, len(todo))
    reports.sort(key=rank_key)
    notes = [f"plan shapes shortlisted on {view.name} (one GPU type, uniform links), then "
             "simulated on the real cluster in rank order (the baseline) and, for the "
             f"{len(chosen)} fastest shapes, with a DT-FM genetic placement of their "
             "(stage, replica) tasklets, kept where simulate finds it faster"]
    return SearchResult(
        searcher="evolutionary", plans_evaluated=len(space) + len(keep),
        search_time_s=time.perf_counter() - start, reports=reports[:top],
        baseline_step_time_s=baseline, rejected=dict(space.rejected),
        considered=space.considered,
        notes=notes, extra={"placements": info, "seed": seed})
