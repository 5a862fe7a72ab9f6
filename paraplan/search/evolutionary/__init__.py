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

Modules: ``inputs`` (the network as pair matrices, communication volumes), ``problem`` (a
validated placement problem and its result), ``rings`` (DP cost inside a group), ``ordering``
(stage order and replica matching between groups), ``evaluator`` (DT-FM's cost of a
placement), ``fixed`` (rank-order, random and exhaustive placements), ``genetic`` (the
hybrid genetic algorithm), ``plan_search`` (``best --searcher evolutionary``)."""

from __future__ import annotations

from paraplan.search.evolutionary.fixed import (
    exhaustive_placement,
    placement_cost,
    random_placement,
    rank_order_placement,
)
from paraplan.search.evolutionary.genetic import evolutionary_placement
from paraplan.search.evolutionary.inputs import (
    RING_EXACT_MAX,
    CommVolumes,
    DpAlgorithm,
    Network,
    PairMatrices,
    comm_volumes,
)
from paraplan.search.evolutionary.ordering import ORDER_EXACT_MAX
from paraplan.search.evolutionary.plan_search import (
    PLACED,
    SHORTLIST,
    VARIANTS,
    evolutionary_search,
    uniform_view,
)
from paraplan.search.evolutionary.problem import PlacementResult

__all__ = [
    "CommVolumes",
    "DpAlgorithm",
    "Network",
    "ORDER_EXACT_MAX",
    "PLACED",
    "PairMatrices",
    "PlacementResult",
    "RING_EXACT_MAX",
    "SHORTLIST",
    "VARIANTS",
    "comm_volumes",
    "evolutionary_placement",
    "evolutionary_search",
    "exhaustive_placement",
    "placement_cost",
    "random_placement",
    "rank_order_placement",
    "uniform_view",
]
