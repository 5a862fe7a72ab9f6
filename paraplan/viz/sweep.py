"""Figures of a sweep's results table (``paraplan sweep``): cost against time to train across
the grid with its Pareto front, and the best tokens/s per GPU type against GPU count."""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

if TYPE_CHECKING:
    import pandas as pd


def _best(frame: pd.DataFrame) -> pd.DataFrame:
    """Each job's #1 plan (rows of searches that found one)."""
    ok = frame[(frame["status"] == "ok") & (frame["rank"] == 1)]
    return ok.reset_index(drop=True)


def cost_time_figure(frame: pd.DataFrame, title: str = "") -> plt.Figure:
    """$ to train (y) against days to train (x) of every job's best plan, one colour per GPU
    type; the Pareto front (no job both cheaper and faster) is the line. Needs the grid's
    ``tokens_to_train``; without it (or without prices) $ per million tokens against
    tokens/s is drawn instead."""
    best = _best(frame)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    timed = best["time_to_train_days"].notna().any() and best["cost_to_train_usd"].notna().any()
    if timed:
        xkey, ykey = "time_to_train_days", "cost_to_train_usd"
        xlabel, ylabel = "days to train", "$ to train (on-demand price)"
    else:
        xkey, ykey = "tokens_per_s", "usd_per_million_tokens"
        xlabel, ylabel = "tokens per second (cluster)", "$ per million tokens"
    best = best.dropna(subset=[xkey, ykey])
    for gpu, pts in best.groupby("gpu"):
        ax.scatter(pts[xkey], pts[ykey], label=str(gpu), alpha=0.8, edgecolor="black",
                   linewidth=0.4)
    if len(best):
        front, cheapest = [], float("inf")
        # Faster is better for days, slower for tokens/s: sort so the front runs left to right.
        for _, row in best.sort_values(xkey, ascending=timed).iterrows():
            if row[ykey] < cheapest:
                cheapest = row[ykey]
                front.append((row[xkey], row[ykey]))
        ax.plot(*zip(*front, strict=True), color="black", linewidth=1, marker="+", ms=12,
                label="Pareto front")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title or "every job's best plan: cost against time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def scaling_figure(frame: pd.DataFrame, title: str = "") -> plt.Figure:
    """The best tokens/s per GPU (y) each GPU type reaches at each GPU count (x), one line per
    (GPU type, model)."""
    best = _best(frame)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for (gpu, model), pts in best.groupby(["gpu", "model"]):
        top = pts.groupby("num_gpus")["tokens_per_s_per_gpu"].max().sort_index()
        ax.plot(top.index, top.values, marker="o", label=f"{model} on {gpu}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("best tokens/s per GPU")
    ax.set_title(title or "best throughput per GPU type against GPU count")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
