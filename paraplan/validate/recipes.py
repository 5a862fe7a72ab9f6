"""``paraplan validate-recipes``: does the search rank hand-tuned recipes at the top?

Every bundled published run that is a tuned benchmark recipe (NVIDIA's NeMo H100 recipes and
Megatron-Bridge MoE recipes, torchtitan's published configurations, MosaicML's MPT benchmark
tables) is searched again with the same model, GPU count, global batch and sequence length,
restricted to that recipe's trainer profile. For an MoE model the search ranks every plan
under each MoE run setting the trainer has (dispatcher, all-to-all overlap:
``search.dispatch.moe_runs``), as ``paraplan best`` does, whatever the recipe chose. For each
recipe the report gives:

- its rank among every plan the trainer can run (the vectorized evaluator's ranking of the
  whole space; 1 = nothing predicted faster), or that the recipe is outside the searched space;
- the predicted gain of the search's #1 over the recipe (recipe step time / #1's, both from
  ``simulate``);
- why #1 is faster: the time parts (compute, bubble, TP/CP/EP/PP/DP communication,
  optimizer) that differ most, and the knobs #1 sets differently (``changed``: plan fields
  and, for MoE models, the run setting); the summary counts, over the recipes #1 beats by
  more than 5%, how often each knob changed (``changed_beyond_5pct``);
- both plans' peak memory per GPU and whether #1 is ``tight``: it needs more memory than the
  recipe and sits within ``TIGHT_MEMORY_FRACTION`` of the GPU's memory, so its claim rests on
  the memory model's accuracy as much as on its times (counted over the claims beyond 5%:
  ``tight_beyond_5pct``).

A cost model with no free lunches ranks tuned recipes at or near the top: a large predicted
gain points at a cost the model leaves out (or at a recipe that really is slow).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from paraplan.search.dp.resplit import best_split, resplit_finalists
from paraplan.search.exhaustive import (
    RESPLIT_SHAPES,
    RESPLITS,
    rank_key,
    top_k,
    uneven_layer_costs,
)
from paraplan.search.moe_runs import moe_runs, run_fields, run_label
from paraplan.search.space import RECOMPUTES, evaluate_space
from paraplan.search.space.build import run_spaces
from paraplan.search.space.keys import plan_key
from paraplan.simulator.pipeline import SCHEDULES
from paraplan.simulator.report import STEP_PARTS
from paraplan.simulator.stages import pipeline_chunks
from paraplan.simulator.step import StepReport, simulate
from paraplan.specs.loaders import load_trainer
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.trainer import TrainerSpec, trainer_training
from paraplan.validate.published import DATA_DIR, PublishedCase, load_published_throughput
from paraplan.validate.rows import LAYOUT_GUESSED
from paraplan.validate.twins import (
    KNOB_FIELDS,
    attach_twins,
    knob_value,
    knobs,
    pair_order,
    pick_regret,
    setting_key,
    tokens_per_gpu_s,
)

PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "mbs", "sched", "v", "rc")
"""The space columns that name a plan (``PlanSpace``; ``m`` and ``uneven`` follow from them)."""
RECIPE_SOURCES = ("dgxc_nemo_h100", "megatron_bridge_moe", "megatron_bridge_moe_2608",
                  "megatron_bridge_dense", "torchtitan", "mosaicml_llmfoundry_mpt")
"""Sources whose rows are tuned benchmark recipes (sources.md, holdout/SOURCES.md,
moe_sources.md, dense_sources.md)."""


def changed_knobs(recipe: dict[str, Any], best: dict[str, Any],
                  runs: tuple[str, str] | None = None) -> list[str]:
    """The knobs #1 sets differently from the recipe, as ``name old -> new`` (plan dicts of
    ``StepReport.plan``; ``runs``: the recipe's and #1's MoE run labels, if any)."""
    out = [f"{name} {knob_value(recipe, key)} -> {knob_value(best, key)}"
           for key, name in KNOB_FIELDS if knob_value(recipe, key) != knob_value(best, key)]
    if runs is not None and runs[0] != runs[1]:
        out.append(f"moe {runs[0]} -> {runs[1]}")
    return out


def recipe_cases(sources: tuple[str, ...] = RECIPE_SOURCES) -> list[PublishedCase]:
    """The predictable recipe rows of the bundled published and hold-out CSVs."""
    cases = load_published_throughput() + load_published_throughput(
        DATA_DIR / "holdout" / "holdout_throughput.csv")
    return [c for c in cases if c.source_id in sources and c.skip_reason is None
            and c.plan is not None and c.cluster is not None and c.cluster.is_homogeneous]


def _recipe_layout(case: PublishedCase, trainer: TrainerSpec, even: StepReport
                   ) -> StepReport | None:
    """The recipe under the exact layer-partition DP's split, where that is faster and fits
    as well as the near-even split the row was given, else None.

    Only for rows whose layout paraplan guessed (``rows.LAYOUT_GUESSED``)
    on a model whose layers differ in cost, pipelined without interleaving: NVIDIA lays such
    stages out by hand (Megatron ``--pipeline-model-parallel-layout``, e.g. DeepSeek-V3's MTP
    module and loss on a lighter last stage), and ``best`` re-splits its own pipelined plans
    the same way, so the recipe is not charged a layout it did not run."""
    plan = case.plan.model_copy(update={"dp": None})
    guessed = any(LAYOUT_GUESSED in note for note in case.assumptions)
    if not (guessed and uneven_layer_costs(case.model) and plan.pp > 1
            and plan.virtual_stages == 1 and trainer.can.uneven_layers):
        return None
    split = best_split(case.model, case.cluster, case.training, plan)
    if split is None:
        return None
    rep = simulate(case.model, case.cluster, case.training, split, trainer=trainer,
                   time_if_oom=True)
    if rep.step_time_s is None or rep.feasible < even.feasible \
            or rep.step_time_s >= even.step_time_s:
        return None
    return rep


def _row_of(case: PublishedCase, plan: ParallelPlan) -> tuple[int, ...] | None:
    """The recipe as a row of ``PLAN_COLUMNS``, or None where its layer split is not the one
    the space gives its (pp, vpp) shape (``stages.pipeline_chunks``)."""
    layers = case.model.num_layers
    if plan.recompute not in RECOMPUTES or plan.layers_per_stage is not None and list(
            plan.layers_per_stage) != pipeline_chunks(layers, plan.pp, plan.virtual_stages):
        return None
    dp = case.num_gpus // (plan.tp * plan.pp * plan.cp)
    sched = SCHEDULES.index(plan.schedule if plan.pp > 1 else "1f1b")
    return (plan.tp, plan.pp, dp, plan.cp, plan.ep, plan.expert_tp, int(plan.sequence_parallel),
            plan.zero_stage, plan.micro_batch_size, sched, plan.virtual_stages,
            RECOMPUTES.index(plan.recompute))


# A plan within this fraction of the GPU's memory fits or not within the memory model's error
# on measured runs (9.1% MAPE on the 21 measured rows of published_memory.csv, 2026-11-30).
TIGHT_MEMORY_FRACTION = 0.9


def check_recipe(case: PublishedCase) -> dict[str, Any]:
    """One recipe row: its rank, #1's predicted gain over it and the parts that differ."""
    trainer = load_trainer(case.framework)
    model, cluster, training = case.model, case.cluster, case.training
    plan = case.plan.model_copy(update={"dp": None})
    row: dict[str, Any] = {"index": case.index, "source_id": case.source_id,
                           "model": case.model_name, "trainer": trainer.name,
                           "recipe": plan.short(), "num_gpus": case.num_gpus}
    recipe = simulate(model, cluster, training, plan, trainer=trainer, time_if_oom=True)
    if recipe.step_time_s is None:
        return {**row, "status": "recipe_not_priced", "reason": "; ".join(recipe.reasons)}
    laid_out = _recipe_layout(case, trainer, recipe)
    if laid_out is not None:
        recipe = laid_out
        row["recipe_layers_per_stage"] = list(recipe.plan["layers_per_stage"])
    row["recipe_step_time_s"] = recipe.step_time_s
    row["measured_step_time_s"] = case.measured_step_time_s
    row["measured_tokens_per_gpu_s"] = tokens_per_gpu_s(case, case.measured_step_time_s)
    row["predicted_tokens_per_gpu_s"] = tokens_per_gpu_s(case, recipe.step_time_s)
    row["recipe_fits"] = recipe.feasible
    if not recipe.feasible:
        row["note"] = "; ".join(recipe.reasons)
    # One evaluation of the trainer's whole space per MoE run setting ranks the recipe and,
    # through the exhaustive searcher's own top_k (exact re-simulation) and, for layers of
    # unequal cost, its layer re-split, gives the search's #1. As ``search``, the settings
    # after the first see only plans with ep > 1 (the others price alike under every one);
    # plans are ranked once each, at their fastest setting.
    found: list[StepReport] = []
    codes, times, split_times = [], [], []
    runs = moe_runs(model, trainer_training(trainer, training), trainer, {}, set())
    for run, space in zip(runs, run_spaces(model, cluster, runs, trainer=trainer), strict=True):
        if not len(space):
            continue
        ev = evaluate_space(space, exact_interleaved=True)
        ok = ev.feasible & np.isfinite(ev.step_time_s)
        if not ok.any():
            continue
        for rep in top_k(ev.step_time_s, ev.lower_s, ok, 1,
                         lambda i, r=run, sp=space: simulate(model, cluster, r, sp.plan(i),
                                                             trainer=trainer)):
            if model.is_moe:
                rep.extra.update(run_fields(run))
            found.append(rep)
        codes.append(np.stack([space.cols[k][ok] for k in PLAN_COLUMNS], axis=1))
        times.append(ev.step_time_s[ok])
        if uneven_layer_costs(model):  # as best's exhaustive searcher: the exact layer split
            more, _ = resplit_finalists(space, ev, RESPLITS, trainer,
                                        {plan_key(r) for r in found},
                                        shapes=RESPLIT_SHAPES)
            for rep in more:
                if model.is_moe:
                    rep.extra.update(run_fields(run))
                split_times.append(rep.step_time_s)
            found += more
    if not found:
        return {**row, "status": "no_search", "reason": "no plan the trainer can run fits"}
    best = min(found, key=rank_key)
    plans, where = np.unique(np.concatenate(codes), axis=0, return_inverse=True)
    fastest = np.full(len(plans), np.inf)
    np.minimum.at(fastest, where.reshape(-1), np.concatenate(times))
    # Re-split plans (layers_per_stage set) are plans of their own beside the space's.
    faster = int(np.sum(fastest < recipe.step_time_s * (1 - 1e-9))) + sum(
        t < recipe.step_time_s * (1 - 1e-9) for t in split_times)
    ranked = len(plans) + len(split_times)
    # In the space: a row with the recipe's fields and layer split (rows with inexact,
    # closed-form times, such as accounted interleaved splits, match by plan, not by time).
    row_of = _row_of(case, plan)
    in_space = bool(np.any(np.isclose(np.concatenate(times), recipe.step_time_s, rtol=1e-9))
                    or row_of is not None and np.all(plans == row_of, axis=1).any())
    diff = {k: recipe.time_s[k] - best.time_s[k] for k in STEP_PARTS}
    why = sorted(((v, k) for k, v in diff.items() if abs(v) > 1e-9), key=lambda x: -abs(x[0]))
    runs = None
    if model.is_moe:
        row["recipe_run"] = run_label(training)
        row["best_run"] = run_label(best.extra)
        runs = (row["recipe_run"], row["best_run"])
    row["changed"] = changed_knobs(recipe.plan, best.plan, runs)
    row["recipe_knobs"] = knobs(recipe.plan, runs[0] if runs else None)
    row["best_knobs"] = knobs(best.plan, runs[1] if runs else None)
    peak, cap = best.memory_gb.get("peak", 0.0), best.extra.get("memory_capacity_gb")
    recipe_peak = recipe.memory_gb.get("peak")
    row.update(recipe_peak_gib=recipe_peak, best_peak_gib=peak, memory_capacity_gib=cap,
               tight=bool(cap and peak >= TIGHT_MEMORY_FRACTION * cap
                          and peak > (recipe_peak or 0.0)))
    return {**row, "status": "ok", "best": best.extra.get("plan_short", ""),
            "best_step_time_s": best.step_time_s, "rank": faster + 1,
            "recipe_in_space": in_space, "plans_ranked": ranked,
            "gain": recipe.step_time_s / best.step_time_s,
            "why": [{"part": k, "recipe_minus_best_s": v} for v, k in why[:3]]}


def validate_recipes(sources: tuple[str, ...] = RECIPE_SOURCES,
                     progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Check every recipe row of ``sources``; summary over the rows that ran, with the
    measured checks of ``twins`` (``measured_twins``, ``pair_order``)."""
    cases = recipe_cases(sources)
    settings = {c.index: setting_key(c) for c in cases}
    rows = []
    for i, case in enumerate(cases, start=1):
        rows.append(check_recipe(case))
        if progress is not None:
            progress(i, len(cases))
    ok = [r for r in rows if r["status"] == "ok"]
    gains = [r["gain"] for r in ok]
    by_source: dict[str, Any] = {}
    for src in dict.fromkeys(r["source_id"] for r in ok):
        mine = [r["gain"] for r in ok if r["source_id"] == src]
        by_source[src] = {"n": len(mine), "median_gain": statistics.median(mine),
                          "max_gain": max(mine),
                          "ranked_first": sum(r["rank"] == 1 for r in ok
                                              if r["source_id"] == src),
                          "within_5pct": sum(g <= 1.05 for g in mine)}
    changed: dict[str, int] = {}
    tight = sum(r["gain"] > 1.05 and r["tight"] for r in ok)
    for r in ok:
        if r["gain"] > 1.05:
            for knob in dict.fromkeys(c.split(" ")[0] for c in r["changed"]):
                changed[knob] = changed.get(knob, 0) + 1
    return {
        "rows": rows, "n": len(ok), "n_rows": len(rows), "by_source": by_source,
        "changed_beyond_5pct": dict(sorted(changed.items(), key=lambda kv: -kv[1])),
        "median_gain": statistics.median(gains) if gains else None,
        "max_gain": max(gains) if gains else None,
        "ranked_first": sum(r["rank"] == 1 for r in ok),
        "within_5pct": sum(g <= 1.05 for g in gains),
        "tight_beyond_5pct": tight,
        "measured_twins": attach_twins(rows, settings),
        "pair_order": {**pair_order(rows, settings), "pick": pick_regret(rows, settings)},
    }
