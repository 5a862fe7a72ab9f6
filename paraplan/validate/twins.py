"""Measured checks of the search's claims and of its ranking, from the recipes' own sources.

A recipe's source often measured other plans of the same model on the same GPUs and software:
MPT's tables sweep the micro-batch size, recomputation and GPU count; torchtitan's switch
activation checkpointing and async TP on and off. Two measured rows of one source, model,
cluster (node count aside), trainer and training setup (``setting_key``: every
``TrainingSpec`` field but the global batch and the MoE run setting) differ only in their
plans, GPU counts and global batches, so the ratio of their measured tokens/s per GPU is a
measured answer to "how much faster is this plan than that one" (at those GPU counts and
batches), against which the model's ratio for the same two rows can be held. Two checks come
of it:

- ``attach_twins``: for a recipe the search's #1 beats, the source's measurement of #1's own
  plan (``exact``: every knob equal, the GPU count may differ) or, failing that, of the plan
  that differs from #1 only in its micro-batch size (``mbs``: the nearest size, within a
  factor of ``MBS_FACTOR``), and the gain of #1 that this measurement implies: the predicted
  gain times the twin's measured over predicted ratio to the recipe, i.e. the model's own
  error on that very comparison taken out (for an exact twin at the recipe's GPU count it is
  the measured ratio itself).
- ``pair_order`` (``validate-recipes`` and ``validate-published``): over every two rows of
  one setting whose plans differ, how often the model orders them as measured (pairs
  measured within ``TIE_FRACTION`` of each other are ties and not counted) and its median
  error on their throughput ratio. This is the accuracy a searcher relies on: it only ever
  compares plans.

Pure functions of the rows (``recipes.check_recipe``'s dicts: ``index``, ``status``,
``num_gpus``, ``gain``, ``recipe``, ``recipe_knobs``, ``best_knobs``,
``measured_tokens_per_gpu_s``, ``predicted_tokens_per_gpu_s``) and a setting key per row index.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Hashable, Mapping
from itertools import combinations
from typing import TYPE_CHECKING, Any

from paraplan.search.moe_runs import MOE_RUN_FIELDS, run_label

if TYPE_CHECKING:
    from paraplan.validate.published import PublishedCase

TIE_FRACTION = 0.02
"""Two measured rows whose throughputs differ by less than this are a tie for ``pair_order``:
run-to-run noise of the published tables (MPT's large-scale sweep repeats one plan at three GPU
counts within 1-5%) is of this order."""
CLAIM_FRACTION = 0.05
"""A gain of #1 over a recipe beyond this is a claim ``attach_twins`` counts (the 5% of
``validate-recipes``)."""
MBS_KNOB = "mbs"
MBS_FACTOR = 2.0
"""An ``mbs`` twin's micro-batch size is within this factor of #1's: further off, it measures
another regime (GEMM sizes, memory) rather than #1's plan."""


KNOB_FIELDS = (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("ep", "ep"),
               ("etp", "etp"), ("sequence_parallel", "sp"), ("zero_stage", "zero"),
               ("micro_batch_size", "mbs"), ("schedule", "schedule"),
               ("virtual_stages", "vpp"), ("recompute", "recompute"))
"""(``ParallelPlan`` / ``StepReport.plan`` key, short name) of the knobs a search sets (dp
follows from the GPU count and the other degrees)."""
LAYOUT_FIELDS = (("tp_comm_overlap", "tp_overlap"), ("layers_per_stage", "layers"))
"""Plan fields beside the knobs that also make two measured rows different plans (torchtitan's
async-TP rows switch ``tp_comm_overlap``; a pipeline's layer split, as written)."""


def knob_value(plan: Mapping[str, Any], key: str) -> Any:
    """``plan[key]``, with an ``etp`` equal to the plan's tp written as None, as an unset one
    runs (``ParallelPlan.etp``): None means the experts follow tp."""
    if key == "etp" and plan.get("etp") == plan.get("tp"):
        return None
    return plan.get(key)


def knobs(plan: Mapping[str, Any], run: str | None = None) -> dict[str, Any]:
    """What makes a plan this plan, by short names (a ``ParallelPlan.model_dump()`` or a
    ``StepReport.plan``; dp left out): the knobs (``KNOB_FIELDS``) and ``LAYOUT_FIELDS``, with
    the MoE run setting (``search.moe_runs.run_label``) as ``moe`` where there is one."""
    out = {name: knob_value(plan, key) for key, name in KNOB_FIELDS + LAYOUT_FIELDS}
    if run is not None:
        out["moe"] = run
    return out


def case_knobs(case: PublishedCase) -> dict[str, Any]:
    """``knobs`` of a published row's plan, with its MoE run setting for an MoE model."""
    return knobs(case.plan.model_dump(),
                 run_label(case.training) if case.model.is_moe else None)


def setting_key(case: PublishedCase) -> str:
    """What two rows must share for their measured ratio to compare plans: source, model,
    trainer, the cluster but for its node counts (GPU, links, NICs, regions) and every
    ``TrainingSpec`` field but the global batch and the MoE run setting (dispatcher,
    all-to-all overlap, the dispatcher's SMs), which ``case_knobs`` counts as part of the
    plan, as the search does."""
    skip = {"global_batch_size", "tokens_to_train", "moe_dispatcher_sms", *MOE_RUN_FIELDS}
    training = case.training.model_dump(mode="json", exclude=skip)
    cluster = case.cluster.model_dump(mode="json")
    for group in cluster["node_groups"]:
        group.pop("num_nodes", None)
    return json.dumps([case.source_id, case.model_name, case.framework, cluster, training],
                      sort_keys=True)


def tokens_per_gpu_s(case: PublishedCase, step_s: float | None) -> float | None:
    """Tokens per second per GPU of ``case`` at ``step_s`` seconds per step (None without a
    positive step)."""
    if not step_s or step_s <= 0 or not math.isfinite(step_s):
        return None
    return case.training.global_batch_size * case.training.seq_len / step_s / case.num_gpus


def _ok(row: Mapping[str, Any]) -> bool:
    return (row.get("status") == "ok" and row.get("measured_tokens_per_gpu_s") is not None
            and row.get("predicted_tokens_per_gpu_s") is not None)


def _without_mbs(knobs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in knobs.items() if k != MBS_KNOB}


def _log_gap(a: float, b: float) -> float:
    return abs(math.log(a / b))


def find_twin(row: Mapping[str, Any], rows: list[Mapping[str, Any]],
              settings: Mapping[int, Hashable]) -> dict[str, Any] | None:
    """The measured row of ``row``'s setting that ran the search's #1 plan (``exact``) or, if
    none did, #1's plan with another micro-batch size (``mbs``: the nearest size, within
    ``MBS_FACTOR``), the nearest GPU count first among equals; with the ratios and the
    implied gain (module docstring). None where ``row`` is not a claim (#1 = the recipe's
    plan) or nothing matches."""
    if not _ok(row) or row["best_knobs"] == row["recipe_knobs"] or row["index"] not in settings:
        return None
    key = settings[row["index"]]
    # The recipe's own plan measured at another GPU count says nothing about #1's.
    peers = [s for s in rows if _ok(s) and s["index"] != row["index"]
             and s["index"] in settings and settings[s["index"]] == key
             and s["recipe_knobs"] != row["recipe_knobs"]]
    best = row["best_knobs"]
    kind, found = "exact", [s for s in peers if s["recipe_knobs"] == best]
    if not found:
        kind = MBS_KNOB
        found = [s for s in peers if _without_mbs(s["recipe_knobs"]) == _without_mbs(best)
                 and _log_gap(s["recipe_knobs"][MBS_KNOB], best[MBS_KNOB])
                 <= math.log(MBS_FACTOR) + 1e-12]
    if not found:
        return None
    twin = min(found, key=lambda s: (_log_gap(s["recipe_knobs"][MBS_KNOB], best[MBS_KNOB]),
                                     _log_gap(s["num_gpus"], row["num_gpus"]), s["index"]))
    measured = twin["measured_tokens_per_gpu_s"] / row["measured_tokens_per_gpu_s"]
    predicted = twin["predicted_tokens_per_gpu_s"] / row["predicted_tokens_per_gpu_s"]
    return {"index": twin["index"], "kind": kind, "plan": twin["recipe"],
            "num_gpus": twin["num_gpus"], "measured_ratio": measured,
            "predicted_ratio": predicted, "measured_gain": row["gain"] * measured / predicted}


def attach_twins(rows: list[dict[str, Any]], settings: Mapping[int, Hashable]
                 ) -> dict[str, Any]:
    """Set ``measured_twin`` (``find_twin``, or None) on every row; summary over the claims
    beyond ``CLAIM_FRACTION``: how many have a twin (``checked``; ``exact`` of them), and of
    those how many the measurement confirms beyond 5% or not."""
    for row in rows:
        if row.get("status") == "ok":
            row["measured_twin"] = find_twin(row, rows, settings)
    claims = [r for r in rows if r.get("status") == "ok" and r["gain"] > 1 + CLAIM_FRACTION]
    checked = [r for r in claims if r["measured_twin"] is not None]
    confirmed = {r["index"] for r in checked
                 if r["measured_twin"]["measured_gain"] > 1 + CLAIM_FRACTION}
    return {"claims": len(claims), "checked": len(checked),
            "exact": sum(r["measured_twin"]["kind"] == "exact" for r in checked),
            "confirmed": len(confirmed), "not_confirmed": len(checked) - len(confirmed),
            "not_confirmed_rows": [r["index"] for r in checked if r["index"] not in confirmed]}


def _groups(rows: list[Mapping[str, Any]], settings: Mapping[int, Hashable]
            ) -> list[list[Mapping[str, Any]]]:
    """The ok rows (``_ok``) of each setting, by row index (``pair_order``, ``pick_regret``)."""
    groups: dict[Hashable, list[Mapping[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["index"]):
        if _ok(row) and row["index"] in settings:
            groups.setdefault(settings[row["index"]], []).append(row)
    return list(groups.values())


def pair_order(rows: list[Mapping[str, Any]], settings: Mapping[int, Hashable],
               knobs_key: str = "recipe_knobs") -> dict[str, Any]:
    """Every two ok rows of one setting whose plans (``row[knobs_key]``) differ: ``pairs``;
    ``decisive`` (measured apart by more than ``TIE_FRACTION``); ``agree`` (of those, the
    model's faster one is the measured faster one; a pair the model prices exactly alike is
    neither, ``predicted_ties``); ``median_ratio_error_pct`` over all pairs, the error on the
    pair's throughput ratio either way round (exp |ln(predicted / measured)| - 1); and the
    disagreeing pairs (index, index)."""
    pairs = decisive = agree = ties = 0
    errors: list[float] = []
    wrong: list[tuple[int, int]] = []
    for members in _groups(rows, settings):
        for a, b in combinations(members, 2):
            if a[knobs_key] == b[knobs_key]:
                continue
            measured = a["measured_tokens_per_gpu_s"] / b["measured_tokens_per_gpu_s"]
            predicted = a["predicted_tokens_per_gpu_s"] / b["predicted_tokens_per_gpu_s"]
            pairs += 1
            errors.append(math.expm1(_log_gap(predicted, measured)))
            if _log_gap(measured, 1.0) <= math.log1p(TIE_FRACTION):
                continue
            decisive += 1
            if predicted == 1.0:
                ties += 1
            elif (predicted > 1.0) == (measured > 1.0):
                agree += 1
            else:
                wrong.append((a["index"], b["index"]))
    return {"pairs": pairs, "decisive": decisive, "agree": agree, "predicted_ties": ties,
            "median_ratio_error_pct": 100.0 * statistics.median(errors) if errors else None,
            "disagree": wrong}


def pick_regret(rows: list[Mapping[str, Any]], settings: Mapping[int, Hashable],
                knobs_key: str = "recipe_knobs") -> dict[str, Any]:
    """The search's question on what a source measured: in every setting with two or more
    measured plans (``pair_order``'s groups), is the row the model predicts fastest per GPU
    the measured fastest, and if not, how much measured throughput does that pick give up
    (``regret`` = 1 - measured tokens/s/GPU of the pick / of the measured best)?

    ``settings`` (groups), ``picked_best`` (the pick is the measured best, or measured within
    ``TIE_FRACTION`` of it), ``median_regret_pct`` and ``worst`` (the largest regret: the
    picked and the best rows' indices and the regret in percent; None without groups)."""
    regrets: list[tuple[float, int, int]] = []
    for members in _groups(rows, settings):
        plans = {json.dumps(r[knobs_key], sort_keys=True, default=str) for r in members}
        if len(plans) < 2:
            continue
        best = max(members, key=lambda r: r["measured_tokens_per_gpu_s"])
        pick = max(members, key=lambda r: r["predicted_tokens_per_gpu_s"])
        regret = 1.0 - pick["measured_tokens_per_gpu_s"] / best["measured_tokens_per_gpu_s"]
        regrets.append((regret, pick["index"], best["index"]))
    if not regrets:
        return {"settings": 0, "picked_best": 0, "median_regret_pct": None, "worst": None}
    worst = max(regrets)
    return {"settings": len(regrets),
            "picked_best": sum(r <= TIE_FRACTION / (1 + TIE_FRACTION) for r, _, _ in regrets),
            "median_regret_pct": 100.0 * statistics.median(r for r, _, _ in regrets),
            "worst": {"picked": worst[1], "best": worst[2], "regret_pct": 100.0 * worst[0]}}
