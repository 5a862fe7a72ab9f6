"""ILP searchers for heterogeneous clusters (several GPU types), solved with PuLP + CBC.

Two formulations, each solved once per *structural choice* (tp, dp, pp, micro-batch size,
recompute, ZeRO stage; schedule 1F1B; sequence parallelism whenever tp > 1) in an outer
loop; the better verified plan wins and the result says which.

* **Pipeline-heterogeneous** (``formulation="pipeline"``): every pipeline stage is a block of
  dp*tp*cp GPUs of ONE GPU type; the ILP chooses the type of each ordered stage position
  (binary ``y[k,g]``) and the integer layer split (``l[k,g] <= Lmax[k,g] * y[k,g]``, which
  both linearises "layers x type" and carries the memory limit) within the GPUs of each
  type; each type hosts one contiguous run of stages. Stages on different GPU types with
  an uneven layer partition balanced by speed and memory follow Metis (Um et al. 2024,
  "Metis: Fast Automatic Distributed Training on Heterogeneous GPUs"). The objective is
  AMP's pipeline latency ``(m - 1) * max_k t_k + sum_k t_k`` (Li et al. 2022, "AMP:
  Automatically Finding Model Parallel Strategies with Heterogeneity Awareness", its
  ``pipe_cost``: (B - 1) x the slowest stage + the sum of the stages) with ``simulate``'s
  per-op transfer added to every stage: the bottleneck stage time weighted by the m - 1
  steady-state micro-batches plus the fill/drain. On a homogeneous cluster the sum is
  fixed and it minimises the bottleneck alone.
* **Data-heterogeneous** (``formulation="data"``): every data-parallel replica is a whole
  pipeline on GPUs of one type (HetPipe's "virtual workers", Park et al. 2020) and
  replicas get unequal integer numbers of micro-batches of the global batch (hardware-
  aware batch shares as in Whale, Jia et al. 2022); an ILP over per-replica micro-batch
  counts minimises the slowest replica's step ``alpha_g n + beta_g``. ``simulate`` runs one
  batch size per plan, so such a plan is verified per GPU type (``simulate`` of its
  replicas) and its step is the last type's compute plus the gradient all-reduce over
  all types, priced by ``simulate``'s own rule (:func:`_union_dp_time`).

Costs are the simulator's own: per-layer forward + backward seconds from
``simulator.step.layer_cost`` on ``Device.of_training(gpu, training)`` (exposed TP/CP/EP
communication and recomputation included), the LM head from ``step.head_times``,
and per-stage peak memory (bytes) from ``memory.pipeline_memory`` with 1F1B's in-flight
micro-batches ``min(p - k, m)`` on stage k (Narayanan et al. 2021 sec 2.2), compared with
each GPU type's ``memory_GiB`` (GiB = 2^30 bytes) as ``simulate`` compares them. Every
plan is verified with ``simulate`` - pipeline plans on the cluster they actually use (node
groups reordered and trimmed so that stage k's ranks land on its GPU type) - and plans
are ranked by simulated ``step_time_s``. Inside the ILPs times are milliseconds (better
conditioned); everything returned is seconds.

Search: best-first over the structural choices by a lower bound on the simulated step
(compute-only at first, then refined with the memory limits, integer layers and the
1F1B fill, :func:`span_bound`); a choice is solved only while its bound is below the
incumbent (the best simulated step so far), so most are never solved.

Pure functions: nothing is cached across calls; CBC runs as a subprocess per solve.

Modules: ``results`` (what a search returns), ``context`` (per-search costs from the simulator),
``choices`` (the structural choices of the outer loop), ``bounds`` (lower bounds that prune
them), ``cbc`` (PuLP/CBC plumbing), ``clusters`` (the cluster a plan actually uses),
``pipeline_inputs`` and ``pipeline_ilp`` (the pipeline-heterogeneous formulation), ``data_ilp``
(the data-heterogeneous formulation), ``search`` (the baseline and the best-first search)."""

from __future__ import annotations

from paraplan.search.ilp.cbc import MIN_SOLVE_S, MS
from paraplan.search.ilp.choices import CP_DEGREES, MAX_MICRO_BATCH
from paraplan.search.ilp.clusters import pipeline_cluster
from paraplan.search.ilp.pipeline_ilp import solve_pipeline_ilp
from paraplan.search.ilp.results import (
    FORMULATIONS,
    DataGroup,
    IlpCandidate,
    IlpResult,
    PipelineSolution,
    SolveRecord,
)
from paraplan.search.ilp.search import ilp_search, ilp_search_result

__all__ = [
    "CP_DEGREES",
    "DataGroup",
    "FORMULATIONS",
    "IlpCandidate",
    "IlpResult",
    "MAX_MICRO_BATCH",
    "MIN_SOLVE_S",
    "MS",
    "PipelineSolution",
    "SolveRecord",
    "ilp_search",
    "ilp_search_result",
    "pipeline_cluster",
    "solve_pipeline_ilp",
]
