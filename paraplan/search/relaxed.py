"""Relaxed synchronization as a search dimension: ``paraplan best --relaxed``.

The searchers rank plans for fixed values of the relaxed-synchronization knobs
(``simulator.compression``). This module runs the chosen searcher once per point of a small
grid of knob settings (dense every step; DiLoCo every 10 and 100 steps; PowerSGD rank 4;
8- and 4-bit gradients; 8- and 4-bit pipeline activations; DiLoCo 100 with 4-bit
activations) and ranks all their plans together, so a slow network can pick the knob that
pays off. It is opt-in because the model prices bytes only: the extra steps compression or
local SGD may need to reach the same loss are not modelled, and every result says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from paraplan.search.exhaustive import SearchResult
from paraplan.simulator.compression import NOT_MODELLED
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.training import TrainingSpec

RELAXED_GRID: tuple[dict[str, Any], ...] = (
    {},
    {"dp_sync_interval": 10},
    {"dp_sync_interval": 100},
    {"grad_compression": "powersgd", "compression_rank": 4},
    {"grad_compression": "quantize", "compression_bits": 8},
    {"grad_compression": "quantize", "compression_bits": 4},
    {"activation_compression_bits": 8},
    {"activation_compression_bits": 4},
    {"dp_sync_interval": 100, "activation_compression_bits": 4},
)


def describe(knobs: dict[str, Any]) -> str:
    """Short words for one grid point ("dense" for none)."""
    if not knobs:
        return "dense, every step"
    return ", ".join(f"{k}={v}" for k, v in knobs.items())


def relaxed_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *,
                   searcher: str = "auto", top: int = 10, fix: dict[str, Any] | None = None,
                   seed: int = 0, grid: tuple[dict[str, Any], ...] = RELAXED_GRID,
                   progress: Callable[[str], None] | None = None,
                   trainer: Any = None) -> SearchResult:
    """Search every knob setting of ``grid`` (pins in ``fix`` win: a grid point that sets a
    pinned field differently is skipped) and rank all plans together.

    The result's ``extra["relaxed"]`` lists, per grid point, its best step time and its
    speedup over the dense search; ``baseline_step_time_s`` is the dense search's.
    ``trainer`` (a profile that allows relaxed synchronization, e.g. generic) as in ``search``.

    Raises:
        SpecError: no grid point has a plan that fits.
    """
    from paraplan.search.dispatch import search
    from paraplan.search.space import parse_fix

    pins = parse_fix(fix)
    say = progress or (lambda _m: None)
    started = time.perf_counter()
    results: list[tuple[dict[str, Any], SearchResult | None, str | None]] = []
    for knobs in grid:
        if any(k in pins and pins[k] != v for k, v in knobs.items()):
            continue
        say(f"relaxed search: {describe(knobs)}")
        try:
            res = search(model, cluster, training, searcher=searcher, top=top,
                         fix={**pins, **knobs}, seed=seed, trainer=trainer)
            results.append((knobs, res, None))
        except SpecError as exc:
            results.append((knobs, None, str(exc)))
    found = [(k, r) for k, r, _ in results if r is not None and r.reports]
    if not found:
        errors = list(dict.fromkeys(e for _, _, e in results if e))
        if len(errors) == 1:  # the same reason everywhere (a wrong searcher, nothing fits)
            raise SpecError(errors[0], field="relaxed")
        reasons = "; ".join(f"{describe(k)}: {e}" for k, _, e in results if e)
        raise SpecError(f"no knob setting has a plan that fits ({reasons})", field="relaxed")
    dense = next((r for k, r in found if not k), None)
    dense_best = dense.best.step_time_s if dense is not None and dense.best else None
    reports, seen = [], set()
    for _, r in found:
        reports += [rep for rep in r.reports if rep.feasible]
    reports.sort(key=lambda rep: rep.step_time_s)
    ranked = []
    for rep in reports:
        key = str(sorted(rep.plan.items()))
        if key not in seen:
            seen.add(key)
            ranked.append(rep)
    per_knob = []
    for knobs, r, err in results:
        best = r.best.step_time_s if r is not None and r.best is not None else None
        per_knob.append({"knobs": knobs, "label": describe(knobs), "best_step_time_s": best,
                         "best_plan": r.best.extra.get("plan_short") if best else None,
                         "speedup_vs_dense": (dense_best / best) if best and dense_best
                         else None, "error": err})
    first = found[0][1]
    return SearchResult(
        searcher=f"{first.searcher}+relaxed",
        plans_evaluated=sum(r.plans_evaluated for _, r in found),
        search_time_s=time.perf_counter() - started,
        reports=ranked[:top],
        baseline_step_time_s=dense.baseline_step_time_s if dense is not None else None,
        considered=sum(r.considered for _, r in found),
        notes=[f"relaxed synchronization searched over {len(per_knob)} knob settings; "
               + NOT_MODELLED],
        extra={"relaxed": per_knob},
    )
