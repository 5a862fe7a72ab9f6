"""Dynamic-programming searchers: pipeline layer partition and per-layer recomputation.

Two exact (or conservatively discretised) DPs over the simulator's own cost model:

* :func:`optimal_layer_split` - the contiguous split of the transformer layers over the
  pipeline stages that minimises the bottleneck stage time (forward + backward of one
  micro-batch) under a per-stage memory cap. This is the classic linear-partition DP
  (PipeDream, Narayanan et al. 2019 sec 3.1; the balanced-stage objective of Narayanan et al.
  2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM";
  Alpa, Zheng et al. 2022 sec 5.2, and Galvatron, Miao et al. 2022 use the same min-max
  recurrence): ``best[r][j] = min_i max(best[r-1][i], cost_r(i, j))``, O(pp * L^2).
* :func:`per_layer_recompute` - per-layer activation checkpointing (full recompute vs none)
  under a memory budget as a 0/1 knapsack over layers with memory discretised into units
  (64 MiB by default), in the spirit of Galvatron (Miao et al. 2022, "Galvatron: Efficient
  Transformer Training over Multiple GPUs Using Automatic Parallelism", sec 4, which runs a
  knapsack DP over layers with discretised memory) and Checkmate (Jain et al. 2020).

Costs come from the simulator (``simulator.layer_terms.layer_times`` / ``step.head_times``, exposed
TP/CP/EP communication as ``simulator.step.simulate`` charges it, ``memory.pipeline_memory``
with the schedule's in-flight micro-batches), so ``simulate`` of the returned plan reports the
same stage times and memory. Times are seconds, memory is bytes internally and GiB (2^30
bytes) in results. All functions are pure.

Modules: ``algorithms`` (the two generic dynamic programs), ``costs`` (the simulator's
per-layer costs per GPU type), ``layer_split`` (the optimal contiguous layer split),
``recompute`` (the per-layer recompute knapsack), ``search`` (``best --searcher dp``)."""

from __future__ import annotations

from paraplan.search.dp.algorithms import min_bottleneck_partition, min_cost_cover
from paraplan.search.dp.layer_split import LayerSplit, optimal_layer_split
from paraplan.search.dp.recompute import (
    RECOMPUTE_UNIT_BYTES,
    MiB,
    RecomputeChoice,
    per_layer_recompute,
)
from paraplan.search.dp.search import dp_search

__all__ = [
    "LayerSplit",
    "MiB",
    "RECOMPUTE_UNIT_BYTES",
    "RecomputeChoice",
    "dp_search",
    "min_bottleneck_partition",
    "min_cost_cover",
    "optimal_layer_split",
    "per_layer_recompute",
]
