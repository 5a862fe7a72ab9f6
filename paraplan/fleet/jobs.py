"""One sweep job: a full ``best`` search for one (model, cluster, nodes, batch, sequence,
trainer, precision), turned into tidy rows (one per ranked plan) with cost columns. A job
that cannot be searched (a bad combination, nothing fits) is one row saying why."""

from __future__ import annotations

import math
from typing import Any

from paraplan.search.dispatch import search
from paraplan.search.moe_runs import report_run
from paraplan.specs.errors import SpecError
from paraplan.specs.loaders import load_cluster, load_model
from paraplan.specs.training import TrainingSpec

INPUT_COLUMNS = ("job_id", "model", "cluster", "nodes", "global_batch", "seq_len", "trainer",
                 "precision", "searcher", "top", "tokens_to_train")
RESULT_COLUMNS = ("status", "reason", "rank", "num_gpus", "gpu", "plan", "moe_run", "tp", "pp",
                  "dp", "cp",
                  "ep", "zero_stage", "micro_batch_size", "recompute", "schedule",
                  "virtual_stages", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
                  "mfu", "memory_peak_gb", "usd_per_hour", "usd_per_million_tokens",
                  "time_to_train_days", "cost_to_train_usd")
COLUMNS = INPUT_COLUMNS + RESULT_COLUMNS
"""The results table, in order (one row per job x rank)."""
INT_COLUMNS = ("nodes", "global_batch", "seq_len", "top", "rank", "num_gpus", "tp", "pp", "dp",
               "cp", "ep", "zero_stage", "micro_batch_size", "virtual_stages")
"""Integer columns (nullable: a failed job's row has none)."""


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one job (``grid.expand``'s dicts): plain JSON values, no NaN or infinity.
    Never raises for a bad combination: the row's ``status`` is ``failed`` and ``reason``
    says why in one line."""
    try:
        return [_plain(row) for row in _search_rows(job, {k: job.get(k) for k in INPUT_COLUMNS})]
    except SpecError as exc:
        return failed_rows(job, str(exc))
    except Exception as exc:  # noqa: BLE001 - one broken job must not stop a sweep
        return failed_rows(job, f"internal error ({type(exc).__name__}): {exc}")


def failed_rows(job: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    """The one row of a job that produced no plan (``reason``: its first line)."""
    row = {**{k: job.get(k) for k in INPUT_COLUMNS}, **dict.fromkeys(RESULT_COLUMNS)}
    row.update(status="failed", reason=reason.splitlines()[0] if reason else "failed")
    return [row]


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """Python scalars only (numpy's become theirs), non-finite numbers as None."""
    out = {}
    for k, v in row.items():
        if hasattr(v, "item") and not isinstance(v, (str, bytes)):
            v = v.item()
        out[k] = None if isinstance(v, float) and not math.isfinite(v) else v
    return out


def _search_rows(job: dict[str, Any], base: dict[str, Any]) -> list[dict[str, Any]]:
    model = load_model(job["model"])
    cluster = load_cluster(job["cluster"], nodes=job["nodes"])
    training = TrainingSpec(global_batch_size=job["global_batch"], seq_len=job["seq_len"],
                            precision=job["precision"],
                            tokens_to_train=job.get("tokens_to_train"))
    result = search(model, cluster, training, searcher=job["searcher"], top=job["top"],
                    trainer=job["trainer"])
    n = cluster.num_gpus
    prices = [g.gpu.price_per_hour_usd for g in cluster.node_groups]
    usd_h = (sum(g.num_gpus * g.gpu.price_per_hour_usd for g in cluster.node_groups)
             if all(p is not None for p in prices) else None)
    gpus = "+".join(sorted({g.gpu.name for g in cluster.node_groups}))
    rows = []
    for rank, rep in enumerate(result.reports, start=1):
        plan, tps = rep.plan, float(rep.tokens_per_s or 0.0)
        row = {**base, **dict.fromkeys(RESULT_COLUMNS)}
        row.update(status="ok", reason="", rank=rank, num_gpus=n, gpu=gpus,
                   plan=rep.extra.get("plan_short", ""), moe_run=report_run(rep),
                   step_time_s=rep.step_time_s,
                   tokens_per_s=tps, tokens_per_s_per_gpu=tps / n, mfu=rep.mfu,
                   memory_peak_gb=rep.memory_gb.get("peak"), usd_per_hour=usd_h,
                   dp=rep.extra.get("dp", plan.get("dp")))
        for key in ("tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "recompute",
                    "schedule", "virtual_stages"):
            row[key] = plan.get(key)
        if usd_h is not None and tps > 0:
            row["usd_per_million_tokens"] = usd_h / (tps * 3600.0) * 1e6
        tokens = job.get("tokens_to_train")
        if tokens and tps > 0:
            days = tokens / tps / 86400.0
            row["time_to_train_days"] = days
            row["cost_to_train_usd"] = None if usd_h is None else usd_h * days * 24.0
        rows.append(row)
    return rows
