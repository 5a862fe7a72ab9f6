"""Pareto-front figure: throughput against cost per token, coloured by cluster size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def pareto_figure(points: Sequence[dict[str, Any]], title: str = "") -> plt.Figure:
    """Tokens/s (x) against $ per million tokens (y; memory headroom when no price is known),
    one colour per node count, marker size growing with memory headroom (GiB)."""
    fig, ax = plt.subplots(figsize=(9, 5.5))
    priced = all(p.get("dollars_per_million_tokens") is not None for p in points)
    ykey, ylabel = (("dollars_per_million_tokens", "$ per million tokens (on-demand price)")
                    if priced else ("headroom_gib", "memory headroom per GPU (GiB)"))
    nodes = sorted({p["nodes"] for p in points})
    cmap = plt.get_cmap("viridis", max(2, len(nodes)))
    for k, n in enumerate(nodes):
        pts = [p for p in points if p["nodes"] == n]
        ax.scatter([p["tokens_per_s"] for p in pts], [p[ykey] for p in pts],
                   s=[20 + 3 * max(0.0, p["headroom_gib"]) for p in pts], color=cmap(k),
                   alpha=0.8,
                   label=f"{n} node{'s' if n > 1 else ''} ({pts[0]['num_gpus']} GPUs)",
                   edgecolor="black", linewidth=0.4)
    best = max(points, key=lambda p: p["tokens_per_s"])
    ax.annotate(best["plan_short"], (best["tokens_per_s"], best[ykey]), fontsize=7,
                xytext=(-10, 12), textcoords="offset points", ha="right")
    ax.set_xlabel("tokens per second (cluster)")
    ax.set_ylabel(ylabel)
    ax.set_title(title or "Pareto front: throughput vs cost vs memory headroom")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="marker size = headroom", title_fontsize=8)
    fig.tight_layout()
    return fig
