"""What an ILP search returns: solve records, pipeline solutions, data groups, candidates and the
result."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from paraplan.simulator.step import StepReport
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.plan import ParallelPlan

FORMULATIONS: tuple[str, ...] = ("pipeline", "data")




@dataclass(frozen=True)
class SolveRecord:
    """One solve (CBC; the data formulation by exact enumeration when every replica line
    rises, ``data_ilp.exact_shares``): what it was, how it ended, how long it took."""

    formulation: str
    """``pipeline`` or ``data``."""
    choice: str
    """The structural choice solved (``ParallelPlan.short()`` form)."""
    status: str
    """``optimal``, ``time_limit`` (a solution, not proven optimal), ``infeasible``,
    ``cutoff`` (no solution can beat the incumbent plan) or ``no_solution`` (time ran out
    before any)."""
    objective: float | None
    """CBC's objective, milliseconds (None without a solution)."""
    bound: float | None
    """CBC's best lower bound, milliseconds (equals the objective when optimal)."""
    gap: float | None
    """(objective - bound) / objective; 0 when optimal, None without a solution."""
    time_s: float
    """Wall-clock seconds of the CBC subprocess (model write + solve + read back)."""
    solver: str = "CBC"
    """What solved it: ``CBC`` or ``enumeration`` (``data_ilp.exact_shares``)."""


@dataclass(frozen=True)
class PipelineSolution:
    """The pipeline-heterogeneous ILP's answer for one structural choice."""

    plan: ParallelPlan
    """The structural choice with ``layers_per_stage`` (and ``dp``) set."""
    cluster: ClusterSpec
    """The cluster actually used: node groups reordered/trimmed so that stage k's ranks
    [k*dp*tp*cp, (k+1)*dp*tp*cp) are GPUs of ``stage_gpu_types[k]``."""
    stage_gpu_types: list[str]
    """GPU type of each pipeline stage, first stage first."""
    layers_per_stage: list[int]
    """Transformer layers per stage."""
    stage_times_s: list[float]
    """Forward + backward seconds of one micro-batch on each stage (LM head on the last),
    the ILP's cost model evaluated at its integer solution."""
    stage_memory_gb: list[float]
    """Peak memory of one rank of every stage, GiB (2^30 bytes)."""
    bottleneck_s: float
    """max(stage_times_s), seconds."""
    p2p_s: float
    """The transfer ``simulate`` charges after every forward/backward op, seconds."""
    objective_s: float
    """(m - 1)(bottleneck + 2 p2p) + sum_k (stage_times_s[k] + 2 p2p), seconds (AMP's
    pipeline latency with the transfers)."""
    idle_gpus: dict[str, int]
    """GPUs of each type the plan leaves unused."""
    solve: SolveRecord


@dataclass(frozen=True)
class DataGroup:
    """The active replicas of one GPU type in a data-heterogeneous plan."""

    gpu: str
    replicas: int
    microbatches_per_replica: list[int]
    """Micro-batches each replica runs (they differ by at most a few)."""
    global_batch: int
    """Sequences this type processes per step (sum of micro-batches x mbs)."""
    report: StepReport
    """``simulate`` of these replicas alone, each at the largest micro-batch count (the
    type's slowest replica; its data-parallel reduction only over this type)."""
    plan: ParallelPlan
    cluster: ClusterSpec


@dataclass(frozen=True)
class IlpCandidate:
    """One verified plan of either formulation."""

    formulation: str
    report: StepReport
    """``simulate``'s report (pipeline) or the composed report of the groups (data)."""
    plan: ParallelPlan
    cluster: ClusterSpec
    stage_gpu_types: list[str]
    """Pipeline: the GPU type of each stage. Data: the GPU type of each replica group."""
    ilp_stage_times_s: list[float]
    """Pipeline: forward + backward seconds of one micro-batch per stage. Data: each group's
    predicted step seconds (alpha_g * n + beta_g)."""
    ilp_objective_s: float
    """The ILP objective at its solution, seconds."""
    idle_gpus: dict[str, int]
    solve: SolveRecord
    groups: list[DataGroup] = field(default_factory=list)
    """Data formulation only: the replica groups."""

    @property
    def step_time_s(self) -> float:
        return float(self.report.step_time_s or math.inf)


@dataclass(frozen=True)
class IlpResult:
    """Best plans of the heterogeneous ILP search, best (lowest simulated step time) first."""

    reports: list[StepReport]
    plans: list[ParallelPlan]
    clusters: list[ClusterSpec]
    """The (reordered, trimmed) cluster each plan runs on."""
    formulation: str
    """Formulation of the best plan: ``pipeline`` or ``data``."""
    solver_status: str
    """Status of the solve that produced the best plan (see SolveRecord.status)."""
    gap: float
    """Optimality gap of that solve (0 when optimal)."""
    solve_time_s: float
    """Total CBC wall-clock seconds over every solve."""
    plans_evaluated: int
    """Number of ILP solves."""
    baseline_step_time_s: float | None
    """Best step time of an even-split plan on the original rank order (each stage paced by
    its slowest GPU, i.e. all GPUs treated as the slowest type), seconds; None if none fits."""
    baseline_plan: ParallelPlan | None
    candidates: list[IlpCandidate]
    """Everything per plan (aligned with reports/plans/clusters)."""
    solves: list[SolveRecord]
    """Every solve in order."""
    choices: int
    """Structural choices enumerated (both formulations)."""
    pruned: int
    """Choices never solved because a lower bound on their step time could not beat the
    incumbent (the best simulated plan so far)."""
    complete: bool
    """False when ``time_limit_s`` ran out before every choice was solved or pruned."""
    search_time_s: float

    @property
    def step_time_s(self) -> float:
        return float(self.reports[0].step_time_s or math.inf)

    @property
    def speedup_vs_baseline(self) -> float | None:
        """baseline_step_time_s / best step time (> 1 means the ILP plan is faster)."""
        if self.baseline_step_time_s is None:
            return None
        return self.baseline_step_time_s / self.step_time_s
