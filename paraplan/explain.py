"""``paraplan explain``: one plan in plain words, and the one-knob changes that would help.

The plan is simulated; its step is described part by part (compute, bubble, each kind of
exposed communication, optimizer, memory headroom) with the cause of every part worth more
than a few percent. Then every plan one knob away (micro-batch size halved or doubled, SP on
or off, each recompute mode, ZeRO stage one up or down, virtual stages doubled or halved,
tp and pp traded for each other or for dp, NCCL collectives or a sharded parameter server
for the gradients; for MoE models each other dispatcher and all-to-all overlap setting the
trainer has) is simulated too, and the changes that make the
plan faster, or make an infeasible plan fit, are ranked by step time. Nothing is guessed:
every number is the simulator's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from paraplan.simulator.step import STEP_PARTS, simulate
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec
from paraplan.specs.training import TrainingSpec

WORTH = 0.05  # parts below this share of the step are not discussed


def neighbours(plan: ParallelPlan, num_gpus: int) -> Iterator[tuple[str, ParallelPlan]]:
    """Plans one knob away from ``plan``, each with a short description of the change.

    A variant sets only what the user set plus what the change moves, so the trainer's run
    facts (TP overlap, which depends on tp and sequence parallelism; overlapped pipeline sends
    and gradient reduction) still come from the trainer when it is simulated, as they do for
    ``plan`` itself (``specs.trainer.apply_trainer`` keeps fields the user set)."""
    p = plan.model_dump()
    given = plan.model_fields_set
    dp = plan.resolved_dp(num_gpus)

    def variant(change: str, **update: Any) -> tuple[str, ParallelPlan] | None:
        data = {**p, **update}
        if data.get("layers_per_stage") is not None and (
                data["pp"] != plan.pp or data["virtual_stages"] != plan.virtual_stages):
            data["layers_per_stage"] = None
        if data["virtual_stages"] == 1 and data["schedule"] == "interleaved":
            data["schedule"] = "1f1b"
        if data["virtual_stages"] > 1 and data["schedule"] != "interleaved":
            data["schedule"] = "interleaved"
        data = {k: v for k, v in data.items() if k in given or k in update or v != p[k]}
        try:
            new = ParallelPlan(**data)
        except ValidationError:
            return None
        return (change, new) if new.model_dump() != p else None

    mbs = plan.micro_batch_size
    candidates = [
        variant(f"micro_batch_size {mbs} -> {mbs * 2}", micro_batch_size=mbs * 2),
        variant(f"micro_batch_size {mbs} -> {mbs // 2}", micro_batch_size=mbs // 2)
        if mbs > 1 else None,
        variant("sequence_parallel on" if not plan.sequence_parallel else
                "sequence_parallel off", sequence_parallel=not plan.sequence_parallel)
        if plan.tp > 1 else None,
        *(variant(f"recompute {plan.recompute} -> {rc}", recompute=rc)
          for rc in ("none", "selective", "op", "full") if rc != plan.recompute),
        variant(f"zero_stage {plan.zero_stage} -> {plan.zero_stage + 1}",
                zero_stage=plan.zero_stage + 1) if plan.zero_stage < 3 else None,
        variant(f"zero_stage {plan.zero_stage} -> {plan.zero_stage - 1}",
                zero_stage=plan.zero_stage - 1) if plan.zero_stage > 0 else None,
    ]
    if dp > 1:
        candidates += [variant(f"dp_algorithm {plan.dp_algorithm} -> {a}", dp_algorithm=a)
                       for a in ("collective", "sharded_ps") if a != plan.dp_algorithm]
    if plan.pp > 1:
        v = plan.virtual_stages
        candidates.append(variant(f"virtual_stages {v} -> {v * 2}", virtual_stages=v * 2))
        if v > 1:
            candidates.append(variant(f"virtual_stages {v} -> {v // 2}", virtual_stages=v // 2))
    # Trade model-parallel degrees: tp <-> pp, and tp or pp <-> dp (world size kept).
    for key in ("tp", "pp"):
        size = getattr(plan, key)
        other = "pp" if key == "tp" else "tp"
        if size > 1 and size % 2 == 0:
            candidates.append(variant(f"{key} {size} -> {size // 2}, {other} x2",
                                      **{key: size // 2, other: getattr(plan, other) * 2,
                                         "dp": plan.dp}))
            candidates.append(variant(f"{key} {size} -> {size // 2}, dp {dp} -> {dp * 2}",
                                      **{key: size // 2, "dp": dp * 2 if plan.dp else None}))
        if dp % 2 == 0:
            candidates.append(variant(f"{key} {size} -> {size * 2}, dp {dp} -> {dp // 2}",
                                      **{key: size * 2, "dp": dp // 2 if plan.dp else None}))
    seen = set()
    for c in candidates:
        if c is None:
            continue
        key = c[1].model_dump_json()
        if key not in seen:
            seen.add(key)
            yield c


def _describe(rep: dict[str, Any], model: ModelSpec, training: TrainingSpec,
              plan: ParallelPlan) -> list[str]:
    """Plain-English findings for a feasible report."""
    step = rep["step_time_s"]
    t = rep["time_s"]
    out = [f"{step:.4g} s per step, {100 * rep['mfu']:.1f}% MFU, "
           f"{rep['tokens_per_s']:,.0f} tokens/s on {rep['num_gpus']} GPUs"]
    m, p = rep["num_microbatches"], plan.pp
    shares = {k: t[k] / step for k in STEP_PARTS}
    if shares["compute"] >= 0.8:
        out.append(f"compute is {100 * shares['compute']:.0f}% of the step: the plan is "
                   "compute-bound; only faster kernels, less recomputation or a higher MFU "
                   "GPU help much")
    if shares["bubble"] >= WORTH:
        out.append(f"pipeline bubble {t['bubble']:.3g} s ({100 * shares['bubble']:.0f}%): "
                   f"{p} stages idle while {m} micro-batches fill and drain the pipeline "
                   f"(about (p-1)/(v*m) = {(p - 1) / (plan.virtual_stages * m):.2f} of the "
                   "compute); more micro-batches, interleaving or fewer stages shrink it")
    if shares["tp_comm"] >= WORTH:
        out.append(f"tensor-parallel communication {t['tp_comm']:.3g} s "
                   f"({100 * shares['tp_comm']:.0f}%): tp={plan.tp} all-reduces (or "
                   "all-gather + reduce-scatter with SP) every layer's activations, twice "
                   "forward and twice backward; keep TP inside a node, or lower tp")
    if shares["cp_comm"] >= WORTH:
        out.append(f"context-parallel communication {t['cp_comm']:.3g} s "
                   f"({100 * shares['cp_comm']:.0f}%): ring attention passes K/V blocks "
                   f"cp-1 = {plan.cp - 1} times per layer, more than attention can hide")
    if shares["ep_comm"] >= WORTH:
        out.append(f"MoE dispatch {t['ep_comm']:.3g} s "
                   f"({100 * shares['ep_comm']:.0f}%): all-to-all dispatch and combine of top-"
                   f"{model.moe_top_k} token copies over ep={plan.ep} ranks every MoE layer, "
                   "and the trainer's host stall after each MoE layer's sync where it has one")
    if shares["pp_comm"] >= WORTH:
        out.append(f"pipeline sends {t['pp_comm']:.3g} s ({100 * shares['pp_comm']:.0f}%) on "
                   "the critical path: stage boundaries cross a slow link")
    if shares["dp_comm"] >= WORTH:
        zero = {0: "all-reduce of the gradients", 1: "reduce-scatter of the gradients and "
                "all-gather of the parameters", 2: "reduce-scatter of the gradients and "
                "all-gather of the parameters", 3: "per-layer parameter all-gathers and "
                "gradient reduce-scatters"}[plan.zero_stage]
        out.append(f"data-parallel communication {t['dp_comm']:.3g} s exposed "
                   f"({100 * shares['dp_comm']:.0f}%): the {zero} over dp={rep['dp']} that "
                   "the backward pass cannot hide")
    if shares["optimizer"] >= WORTH:
        out.append(f"optimizer step {t['optimizer']:.3g} s ({100 * shares['optimizer']:.0f}%):"
                   " memory-bound Adam over the parameters this rank updates; ZeRO shards it")
    head = rep.get("memory_headroom_gb")
    if head is not None:
        out.append(f"memory: {rep['memory_gb']['peak']:.1f} of "
                   f"{rep['memory_capacity_gb']:g} GiB on the fullest stage "
                   f"(stage {rep['worst_stage']}), {head:.1f} GiB free")
    return out


def explain(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
            plan: ParallelPlan, *, top: int = 5,
            trainer: TrainerSpec | str | None = None) -> dict[str, Any]:
    """Explain ``plan``: findings, time shares and up to ``top`` better one-knob changes.

    With a ``trainer`` the plan is priced as that trainer runs it, and only changes the
    trainer can express are suggested (``simulate`` finds the others infeasible).

    Returns a JSON-ready dict: ``plan`` (short form), ``feasible``, ``reasons``,
    ``step_time_s``, ``mfu``, ``time_share`` (part -> fraction of the step), ``findings``
    (sentences), ``alternatives`` (``change``, ``plan`` (short form), ``plan_fields`` (the
    ParallelPlan, loadable), ``step_time_s``, ``speedup`` =
    this plan's step time / theirs, ``memory_peak_gb``), best first.
    """
    report = simulate(model, cluster, training, plan, trainer=trainer).to_dict()
    out: dict[str, Any] = {"plan": plan.short(), "feasible": report["feasible"],
                           "reasons": report["reasons"], "step_time_s": report["step_time_s"],
                           "mfu": report["mfu"]}
    if report["feasible"]:
        step = report["step_time_s"]
        out["time_share"] = {k: report["time_s"][k] / step for k in STEP_PARTS}
        out["findings"] = _describe(report, model, training, plan)
    else:
        out["time_share"] = {}
        out["findings"] = [f"infeasible: {r}" for r in report["reasons"]]
    better = []
    for change, alt in neighbours(plan, cluster.num_gpus):
        rep = simulate(model, cluster, training, alt, trainer=trainer)
        if not rep.feasible:
            continue
        if report["feasible"] and rep.step_time_s >= report["step_time_s"] * 0.999:
            continue
        better.append({"change": change, "plan": alt.short(),
                       "plan_fields": alt.model_dump(mode="json", exclude_none=True,
                                                     exclude_unset=True),
                       "step_time_s": rep.step_time_s,
                       "speedup": (report["step_time_s"] / rep.step_time_s
                                   if report["feasible"] else None),
                       "mfu": rep.mfu, "memory_peak_gb": rep.memory_gb["peak"]})
    better += _run_changes(model, cluster, training, plan, trainer, report)
    better.sort(key=lambda a: a["step_time_s"])
    out["alternatives"] = better[:top]
    return out


def _run_changes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 plan: ParallelPlan, trainer: TrainerSpec | str | None,
                 report: dict[str, Any]) -> list[dict[str, Any]]:
    """The MoE run settings (dispatcher, all-to-all overlap) the trainer has besides the one
    the plan runs under (``search.moe_runs``; a setting the user gave stays), each simulated
    on the same plan: those that are faster, or fit where the plan does not. Each carries
    ``training_fields``, the TrainingSpec fields to set (``--moe-dispatcher``,
    ``--moe-a2a-overlap``)."""
    from paraplan.search.moe_runs import moe_runs, run_fields, run_label
    from paraplan.specs.loaders import load_trainer
    from paraplan.specs.trainer import trainer_training

    if not model.is_moe or trainer is None:
        return []
    spec = trainer if isinstance(trainer, TrainerSpec) else load_trainer(trainer)
    base = trainer_training(spec, training)
    out = []
    for run in moe_runs(model, base, spec, {}, set(training.model_fields_set)):
        if run_fields(run) == run_fields(base):
            continue
        rep = simulate(model, cluster, run, plan, trainer=spec)
        if not rep.feasible or (report["feasible"]
                                and rep.step_time_s >= report["step_time_s"] * 0.999):
            continue
        out.append({"change": f"MoE run {run_label(base)} -> {run_label(run)}",
                    "plan": plan.short(),
                    "plan_fields": plan.model_dump(mode="json", exclude_none=True,
                                                   exclude_unset=True),
                    "training_fields": run_fields(run),
                    "step_time_s": rep.step_time_s,
                    "speedup": (report["step_time_s"] / rep.step_time_s
                                if report["feasible"] else None),
                    "mfu": rep.mfu, "memory_peak_gb": rep.memory_gb["peak"]})
    return out
