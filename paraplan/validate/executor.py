"""Executor runs vs predictions: ``paraplan validate-executor``.

Each run trains the executor's GPT with one plan on ``nproc`` local gloo ranks (real
torch.distributed processes, ``paraplan.executor.launch``), and the simulator predicts the
same run on a cluster profile of this machine (``paraplan calibrate``, or a profile the user
gives). Reported per run: measured and predicted seconds per step, the error, and the bytes
each collective kind moved (counted by the executor's ``Comm``) next to the simulator's
exact count (``paraplan.simulator.volumes``); overall the mean absolute percentage error and
the Spearman rank correlation of predicted vs measured step times.

Measured step time: each step's slowest rank (ranks meet in the loss all-reduce at the end
of every step, so they agree closely), median over the steps after ``warmup`` steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from paraplan.specs.cluster import ClusterSpec

# The executor's GPT for validation: big enough that GEMMs, not Python overhead, dominate a
# step on a CPU core (a 2,048-token micro-batch GEMM of 256 x 1024 is ~1 GFLOP), small enough
# that 8 runs of 3 steps take a few minutes on 2 cores.
DENSE_MODEL = {"num_layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "seq_len": 256,
               "vocab": 4096, "ffn_hidden": 1024, "seed": 0}
MOE_MODEL = {**DENSE_MODEL, "num_experts": 4, "top_k": 2}


@dataclass(frozen=True)
class ExecutorRun:
    """One validation run: a name, the model (``TinyGPTConfig`` fields), the plan
    (``train_worker`` plan keys) and the global batch (sequences per step)."""

    name: str
    model: dict[str, int]
    plan: dict[str, Any]
    global_batch_size: int
    optimizer: str = "adamw"
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def default_runs(nproc: int = 2) -> list[ExecutorRun]:
    """The validation set for ``nproc`` ranks (2 or 4): DP, ZeRO-1, TP, TP+SP, PP (1F1B and
    GPipe), EP, and on 4 ranks DPxTP and TPxPP."""
    d, moe = DENSE_MODEL, MOE_MODEL
    runs = [
        ExecutorRun("dp", d, {"dp": nproc, "micro_batch_size": 2}, 4 * nproc),
        ExecutorRun("dp-zero1", d, {"dp": nproc, "zero_stage": 1, "micro_batch_size": 4},
                    4 * nproc),
        ExecutorRun("tp", d, {"tp": 2, "dp": nproc // 2, "micro_batch_size": 4}, 2 * nproc),
        ExecutorRun("tp-sp", d, {"tp": 2, "dp": nproc // 2, "sequence_parallel": True,
                                 "micro_batch_size": 4}, 2 * nproc),
        ExecutorRun("pp-1f1b", d, {"pp": 2, "dp": nproc // 2, "schedule": "1f1b",
                                   "micro_batch_size": 1}, 4 * nproc),
        ExecutorRun("pp-gpipe", d, {"pp": 2, "dp": nproc // 2, "schedule": "gpipe",
                                    "micro_batch_size": 2}, 2 * nproc),
        ExecutorRun("ep", moe, {"dp": nproc, "ep": 2, "micro_batch_size": 2}, 2 * nproc),
    ]
    if nproc == 4:
        runs += [
            ExecutorRun("dp-tp", d, {"dp": 2, "tp": 2, "micro_batch_size": 2}, 8),
            ExecutorRun("tp-pp", d, {"tp": 2, "pp": 2, "sequence_parallel": True,
                                     "micro_batch_size": 2}, 8),
        ]
    return runs


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None for fewer than 2 points or a
    constant series."""
    if len(xs) < 2:
        return None
    from scipy.stats import spearmanr

    rho = spearmanr(xs, ys).statistic
    return None if rho != rho else float(rho)  # NaN for constant input


def step_times(results: list[dict]) -> list[float]:
    """Seconds of each step of a run: its slowest rank (``train_worker`` results)."""
    return [max(per_step) for per_step in zip(*(r["step_time_s"] for r in results),
                                               strict=True)]


def measured_step_s(results: list[dict], warmup: int) -> float:
    """A run's measured seconds per step: median over the steps after ``warmup``."""
    per_step = step_times(results)
    return statistics.median(per_step[warmup:] or per_step)


def bytes_exact(results: list[dict], predicted: list[dict[str, int]], steps: int) -> bool:
    """Whether every rank's counted bytes equal ``predicted[rank]`` (per step) x ``steps``."""
    return all(r["bytes_by_kind"].get(kind, 0) == value * steps
               for r in results for kind, value in predicted[r["rank"]].items())


def run_one(run: ExecutorRun, cluster: ClusterSpec, nproc: int, *, steps: int, warmup: int,
            timeout_s: float) -> dict[str, Any]:
    """Run ``run`` on ``nproc`` ranks and predict it on ``cluster``; one report row."""
    from paraplan.executor.bridge import model_spec, simulator_plan, training_spec
    from paraplan.executor.launch import launch
    from paraplan.executor.model import TinyGPTConfig
    from paraplan.executor.train import train_worker
    from paraplan.simulator.step import simulate
    from paraplan.simulator.volumes import comm_bytes

    config = {"model": run.model, "plan": run.plan, "global_batch_size": run.global_batch_size,
              "steps": warmup + steps, "optimizer": run.optimizer, **run.extra}
    model = model_spec(TinyGPTConfig(**run.model))
    training, plan = training_spec(config), simulator_plan(config, nproc)
    report = simulate(model, cluster, training, plan, time_if_oom=True)
    results = launch(train_worker, nproc, config, timeout_s=timeout_s, backend="gloo",
                     num_threads=1)
    measured = measured_step_s(results, warmup)
    predicted = report.step_time_s
    total_steps = warmup + steps
    per_rank = [comm_bytes(model, training, plan, nproc, rank=rank) for rank in range(nproc)]
    bytes_measured: dict[str, int] = {}
    bytes_predicted: dict[str, int] = {}
    for r in results:
        for kind, value in per_rank[r["rank"]].items():
            got = r["bytes_by_kind"].get(kind, 0)
            bytes_measured[kind] = bytes_measured.get(kind, 0) + got // total_steps
            bytes_predicted[kind] = bytes_predicted.get(kind, 0) + value
    keep = [k for k in bytes_predicted if bytes_predicted[k] or bytes_measured[k]]
    phases = {k: statistics.mean(r["phase_s"][k] for r in results) / total_steps
              for k in results[0]["phase_s"]}
    return {
        "plan": plan.short(), "name": run.name, "model": run.model, "note": run.note,
        "global_batch_size": run.global_batch_size, "nproc": nproc,
        "measured_step_s": measured, "predicted_step_s": predicted,
        "error_pct": None if predicted is None else 100.0 * (predicted - measured) / measured,
        "bytes_measured": {k: bytes_measured[k] for k in keep},
        "bytes_predicted": {k: bytes_predicted[k] for k in keep},
        "bytes_exact": bytes_exact(results, per_rank, total_steps),
        "predicted_time_s": report.time_s, "measured_phase_s": phases,
        "measured_step_times_s": step_times(results),
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in results),
        "loss": results[0]["loss"],
        "feasible": report.feasible, "reasons": report.reasons,
    }


def validate_executor(cluster: ClusterSpec, *, nproc: int = 2,
                      runs: Sequence[ExecutorRun] | None = None, steps: int = 4,
                      warmup: int = 1, timeout_s: float = 300,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every validation run and compare it with the simulator on ``cluster``.

    Returns the ``validate-executor`` JSON: ``runs`` (see ``run_one``), ``mape_pct``,
    ``spearman``, ``bytes_exact`` (every rank of every run moved exactly the predicted
    bytes), ``n_runs``.
    """
    say = progress or (lambda _msg: None)
    runs = list(default_runs(nproc) if runs is None else runs)
    rows = []
    for i, run in enumerate(runs, 1):
        say(f"run {i}/{len(runs)}: {run.name}")
        rows.append(run_one(run, cluster, nproc, steps=steps, warmup=warmup,
                            timeout_s=timeout_s))
    scored = [r for r in rows if r["error_pct"] is not None]
    mape = statistics.mean(abs(r["error_pct"]) for r in scored) if scored else None
    rho = spearman([r["predicted_step_s"] for r in scored], [r["measured_step_s"] for r in scored])
    return {"runs": rows, "mape_pct": mape, "spearman": rho,
            "bytes_exact": all(r["bytes_exact"] for r in rows), "n_runs": len(rows),
            "nproc": nproc, "steps": steps, "warmup": warmup, "cluster": cluster.name}
