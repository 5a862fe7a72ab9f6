"""The plan space of a (model, cluster, training) and a vectorized evaluator over it.

``build_space`` enumerates every homogeneous plan: tp, pp, cp, ep, expert-tp, sequence
parallelism, ZeRO stage, micro-batch size, schedule, virtual stages and recompute (dp follows
from the GPU count). Plans that break a trainer's start-up rule (the rules of
``specs.checks.check_plan``) are counted by reason, not kept. Layers are split evenly; when
``pp`` does not divide the layer count the split is as even as possible (earlier stages get
one more layer, as torchtitan and Megatron's uneven first/last-stage options allow), which the
plan then states in ``layers_per_stage``. Interleaving needs ``pp * vpp`` to divide the layers,
or the layers plus the embedding and the loss (Megatron-Core's accounted split,
``simulator.stages.pipeline_chunks``).

``evaluate_space`` computes step time, memory and the time breakdown of every plan at once as
numpy arrays. It is ``simulate()`` restated over arrays: the per-layer costs, activation sizes,
LM-head times and collective lines are computed once per distinct combination of the plan
fields they depend on (by the simulator's own scalar functions), and the composition
(pipeline closed form, DP synchronisation, ZeRO-3 gathers, optimizer, memory per stage) is the
same arithmetic on arrays. On plans with an even split it agrees with ``simulate()`` to 1e-6
(property test); on uneven splits it uses the closed form on the mean stage plus the slowest
stage's excess (what ``simulate`` does for the embedding/LM-head asymmetry) where ``simulate``
runs the event simulation, and ``Evaluation.lower_s`` bounds those plans' exact step time
from below, so the searchers simulate every plan whose bound can still reach the top.
Homogeneous clusters only (one GPU type); mixed clusters are searched by ``ilp``/``evolutionary``.
Times are seconds, memory GiB (2^30 bytes).

Modules: ``fix`` (searched and constant fields, rejection reasons, ``parse_fix``), ``build``
(``SpaceOptions``, ``PlanSpace``, ``build_space``), ``evaluate`` (``evaluate_space`` and its
per-key tables), ``block`` (one block of plans evaluated as arrays), ``span`` (in-flight
micro-batches and the pipeline span as arrays)."""

from __future__ import annotations

from paraplan.search.space.build import (
    R_BATCH,
    R_EXPERTS,
    R_HEADS,
    R_LAYERS,
    R_SEQ,
    R_TP_NODE,
    R_WORLD,
    PlanSpace,
    SpaceOptions,
    build_space,
)
from paraplan.search.space.evaluate import Evaluation, evaluate_space
from paraplan.search.space.fix import (
    COMPRESSION_FIELDS,
    CONSTANT_FIELDS,
    RECOMPUTES,
    SEARCHED_FIELDS,
    parse_fix,
)

__all__ = [
    "COMPRESSION_FIELDS",
    "CONSTANT_FIELDS",
    "Evaluation",
    "PlanSpace",
    "RECOMPUTES",
    "R_BATCH",
    "R_EXPERTS",
    "R_HEADS",
    "R_LAYERS",
    "R_SEQ",
    "R_TP_NODE",
    "R_WORLD",
    "SEARCHED_FIELDS",
    "SpaceOptions",
    "build_space",
    "evaluate_space",
    "parse_fix",
]
