"""Memory per pipeline stage: stacked weights / grads / optimizer / activations / other (GiB)
against each stage's GPU capacity, the worst stage marked (matplotlib).

Reads only a StepReport dict (``memory_per_stage_breakdown_gb``, ``memory_capacity_gb``,
``stage_memory_capacity_gb``, ``worst_stage``). :func:`draw_memory` draws onto a given axes
(the pipeline timeline figure uses it as its lower panel); :func:`memory_figure` is the
stand-alone figure.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

MEMORY_COLORS = {"weights": "#4C72B0", "grads": "#8172B3", "optimizer": "#937860",
                 "activations": "#DD8452", "other": "#8C8C8C"}
"""Colour of each memory kind (the keys of a stage's breakdown, in stacking order)."""


def draw_memory(ax: Axes, report: dict[str, Any], title: str = "") -> None:
    """Stacked bars of memory per GPU by pipeline stage (GiB, 2^30 bytes) on ``ax``.

    A dashed red line marks the GPU capacity (one segment per stage where a mixed cluster gives
    stages different capacities); the worst stage (closest to or furthest beyond its capacity,
    ``report["worst_stage"]``) gets a black outline and a "worst" label with its peak.
    """
    breakdown: list[dict[str, float]] = report.get("memory_per_stage_breakdown_gb") or []
    n = len(breakdown)
    bottoms = [0.0] * n
    for key, color in MEMORY_COLORS.items():
        vals = [float(b.get(key, 0.0)) for b in breakdown]
        ax.bar(range(n), vals, bottom=bottoms, color=color, label=key, width=0.7)
        bottoms = [x + y for x, y in zip(bottoms, vals, strict=True)]
    caps: list[float] = list(report.get("stage_memory_capacity_gb") or [])
    cap = report.get("memory_capacity_gb")
    if len(caps) == n and n and len(set(caps)) > 1:
        for i, c in enumerate(caps):
            ax.hlines(c, i - 0.45, i + 0.45, color="red", linestyle="--", linewidth=1.2,
                      label="GPU capacity" if i == 0 else None)
    elif cap:
        ax.axhline(cap, color="red", linestyle="--", linewidth=1.2,
                   label=f"capacity {cap:g} GiB")
    worst = report.get("worst_stage")
    if worst is None and n:
        worst = max(range(n), key=bottoms.__getitem__)
    if worst is not None and 0 <= worst < n:
        ax.bar([worst], [bottoms[worst]], width=0.7, fill=False, edgecolor="black",
               linewidth=1.8)
        ax.annotate(f"worst: {bottoms[worst]:.1f} GiB", (worst, bottoms[worst]),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8, fontweight="bold")
    top = max([*bottoms, *(caps or [0.0]), cap or 0.0, 1e-9])
    ax.set_ylim(0, top * 1.45)  # headroom for the legend above the capacity line
    step = max(1, n // 16)  # at most ~16 tick labels
    ax.set_xticks(range(0, n, step), [f"stage {i}" for i in range(0, n, step)],
                  fontsize=8 if n > 8 else 10)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel("GiB per GPU")
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    ax.set_title(title or "memory per GPU by pipeline stage")


def memory_figure(report: dict[str, Any], title: str = "") -> plt.Figure:
    """Stand-alone figure of memory per pipeline stage (GiB) against the GPU capacity."""
    n = len(report.get("memory_per_stage_breakdown_gb") or [])
    fig, ax = plt.subplots(figsize=(max(6.0, min(16.0, 3 + 0.6 * n)), 4.5))
    plan = report.get("plan_short") or ""
    draw_memory(ax, report, title or f"memory per GPU by pipeline stage{': ' if plan else ''}"
                f"{plan}")
    fig.tight_layout()
    return fig
