"""Score a predictor against published cases: per row, per source and overall MAPE.

``validate_published`` returns the contract JSON of ``paraplan validate-published`` (rows with
status ok/skipped/infeasible and a reason, MAPE on step time per source and overall, coverage);
``validate_memory`` does the same for memory rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paraplan.specs import SpecError
from paraplan.validate.conventions import metric_from_step_time
from paraplan.validate.published import (
    MemoryCase,
    PublishedCase,
    _Case,
    load_published_memory,
    load_published_throughput,
)
from paraplan.validate.twins import (
    case_knobs,
    pair_order,
    pick_regret,
    setting_key,
    tokens_per_gpu_s,
)

Prediction = tuple[float | None, str | None, bool]


def _call(predict: Callable[[Any], Prediction], case: Any) -> Prediction:
    try:
        value, reason, feasible = predict(case)
    except (SpecError, ValueError) as exc:
        return None, f"predictor failed: {exc}", True
    return value, reason, bool(feasible)


def _score(row: dict[str, Any], measured: float, predicted: float | None, reason: str | None,
           feasible: bool) -> None:
    """Fill status/reason/error_pct of a row from a prediction (error on ``measured``'s basis)."""
    if not feasible:
        row.update(status="infeasible", reason=reason or "predictor says the run does not fit")
    elif predicted is None:
        row.update(status="skipped", reason=reason or "predictor returned no prediction")
    elif not (math.isfinite(predicted) and predicted > 0):
        row.update(status="skipped", reason=f"predictor returned {predicted!r}")
    else:
        row.update(status="ok", reason=reason,
                   error_pct=100.0 * (predicted - measured) / measured)


def _finite(value: float) -> float | None:
    """JSON has no NaN: an unreadable measured value is reported as null."""
    return value if math.isfinite(value) else None


def _mape(rows: list[dict[str, Any]]) -> float | None:
    return sum(abs(r["error_pct"]) for r in rows) / len(rows) if rows else None


def _worst(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not rows:
        return None
    row = max(rows, key=lambda r: abs(r["error_pct"]))
    return {"index": row["index"], "error_pct": row["error_pct"], "model": row["model"]}


def _group(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Error summary per value of ``key`` (``source_id``, ``trainer`` or ``gpu``)."""
    out: dict[str, Any] = {}
    for value in dict.fromkeys(r[key] for r in rows):
        mine = [r for r in rows if r[key] == value]
        mine_ok = [r for r in mine if r["status"] == "ok"]
        mine_certain = [r for r in mine_ok if not r["doubtful"]]
        out[value] = {
            "n": len(mine_ok), "mape_pct": _mape(mine_ok), "n_rows": len(mine),
            "n_skipped": sum(r["status"] == "skipped" for r in mine),
            "n_infeasible": sum(r["status"] == "infeasible" for r in mine),
            "n_certain": len(mine_certain), "mape_pct_certain": _mape(mine_certain),
            "n_too_fast": sum(r["error_pct"] < 0 for r in mine_ok),
            "worst_row": _worst(mine_ok),
        }
    return out


def _summary(rows: list[dict[str, Any]], basis: str) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == "ok"]
    certain = [r for r in ok if not r["doubtful"]]
    return {
        "rows": rows, "mape_pct": _mape(ok), "by_source": _group(rows, "source_id"),
        "by_trainer": _group(rows, "trainer"), "by_gpu": _group(rows, "gpu"),
        "n_too_fast": sum(r["error_pct"] < 0 for r in ok),
        "n_rows": len(rows),
        "n_predicted": len(ok),
        "coverage_pct": 100.0 * len(ok) / len(rows) if rows else 0.0,
        "mape_pct_certain": _mape(certain), "n_certain": len(certain),
        "n_skipped": sum(r["status"] == "skipped" for r in rows),
        "n_infeasible": sum(r["status"] == "infeasible" for r in rows),
        "worst_row": _worst(ok), "error_basis": basis,
    }


def _gpu(case: _Case) -> str:
    """The row's GPU type(s) as paraplan names them (``+``-joined on a mixed cluster);
    ``unknown`` where the row built no cluster."""
    cluster = getattr(case, "cluster", None)
    return "unknown" if cluster is None else "+".join(cluster.gpu_types)


def _row(case: _Case, **extra: Any) -> dict[str, Any]:
    """A report row for ``case`` before prediction (status skipped until scored)."""
    return {
        "index": case.index, "source_id": case.source_id, "metric": case.metric,
        "measured": _finite(case.measured), "predicted": None, "error_pct": None,
        "status": "skipped", "reason": case.skip_reason, "doubtful": case.doubtful,
        "model": case.model_name, "plan": case.plan.short() if case.plan else None,
        "framework": case.framework, "trainer": case.framework, "gpu": _gpu(case), **extra,
    }


def validate_published(path: str | Path | None,
                       predict: Callable[[PublishedCase], Prediction]) -> dict[str, Any]:
    """Run ``predict`` over every published throughput row and summarize the error.

    ``predict(case)`` returns (predicted seconds per optimizer step or None, reason, feasible).
    Each row reports ``measured``/``predicted`` in its published metric (the predicted step time
    is converted back with the source's formula) while ``error_pct`` =
    100 * (predicted_step - measured_step) / measured_step is taken on step time, the
    convention-free figure (for a tokens/s row the error on tokens/s would be
    -error / (1 + error)). MAPE is over rows with status "ok" only.
    """
    rows: list[dict[str, Any]] = []
    predicted: list[tuple[PublishedCase, float | None]] = []
    for case in load_published_throughput(path):
        row = _row(case, measured_step_time_s=case.measured_step_time_s,
                   predicted_step_time_s=None)
        if case.skip_reason is None and case.measured_step_time_s is not None:
            step, reason, feasible = _call(predict, case)
            _score(row, case.measured_step_time_s, step, reason, feasible)
            if step is not None and math.isfinite(step) and step > 0:
                row["predicted_step_time_s"] = step
                if case.shape is not None:
                    row["predicted"] = metric_from_step_time(case.source_id, case.metric, step,
                                                             case.shape)
        rows.append(row)
        if row["status"] == "ok":
            predicted.append((case, row["predicted_step_time_s"]))
    return {**_summary(rows, "step_time_s"), "pair_order": _pair_order(predicted)}


def _pair_order(predicted: list[tuple[PublishedCase, float | None]]) -> dict[str, Any]:
    """``twins.pair_order`` over the predicted rows, (case, predicted seconds per step) each
    (every two measured plans of one setting: does the model order them as measured?),
    overall and per source."""
    pairs, settings, source = [], {}, {}
    for case, step_s in predicted:
        if case.plan is None or case.cluster is None or case.model is None \
                or not case.num_gpus:
            continue
        settings[case.index], source[case.index] = setting_key(case), case.source_id
        pairs.append({"index": case.index, "status": "ok",
                      "knobs": case_knobs(case),
                      "measured_tokens_per_gpu_s": tokens_per_gpu_s(
                          case, case.measured_step_time_s),
                      "predicted_tokens_per_gpu_s": tokens_per_gpu_s(case, step_s)})
    out = pair_order(pairs, settings, "knobs")
    by_source: dict[str, Any] = {}
    for src in dict.fromkeys(source.values()):
        subset = [p for p in pairs if source[p["index"]] == src]
        mine = pair_order(subset, settings, "knobs")
        if mine["pairs"]:
            by_source[src] = {**{k: v for k, v in mine.items() if k != "disagree"},
                              "pick": pick_regret(subset, settings, "knobs")}
    return {**out, "pick": pick_regret(pairs, settings, "knobs"), "by_source": by_source}


def validate_memory(path: str | Path | None,
                    predict_mem: Callable[[MemoryCase], Prediction]) -> dict[str, Any]:
    """Run ``predict_mem`` over every published memory row; same shape as validate_published.

    ``predict_mem(case)`` returns (predicted value in ``case.metric``'s units or None, reason,
    feasible): GiB per GPU for the ``*_gib`` metrics, percent for
    ``activation_memory_pct_of_tp_baseline``. error_pct = 100 * (predicted - measured) / measured.
    """
    rows = []
    for case in load_published_memory(path):
        row = _row(case, unit=case.unit, scope=case.scope,
                   measured_or_analytical=case.measured_or_analytical)
        if case.skip_reason is None:
            value, reason, feasible = _call(predict_mem, case)
            _score(row, case.measured, value, reason, feasible)
            if value is not None and math.isfinite(value):
                row["predicted"] = value
        rows.append(row)
    return _summary(rows, "metric units (GiB per GPU, or percent of the TP-only baseline)")
