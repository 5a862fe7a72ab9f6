"""Sensitivity figure of a what-if sweep (:func:`paraplan.sweep.sweep` frame, matplotlib).

Top: step time (s, left axis) and MFU (%, right axis) against the swept value; values where
the plan does not run are marked with a red cross. Bottom: where the step time goes at each
value, stacked (compute, bubble, TP/CP/EP/PP/DP communication, optimizer; seconds), with the
plan written under the value wherever the searched plan changes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from paraplan.specs.errors import SpecError  # noqa: E402

if TYPE_CHECKING:
    import pandas as pd

PART_COLORS = {"compute": "#4C72B0", "bubble": "#CCCCCC", "tp_comm": "#DD8452",
               "cp_comm": "#C44E52", "ep_comm": "#8172B3", "pp_comm": "#937860",
               "dp_comm": "#55A868", "optimizer": "#DA8BC3"}
"""Colour of each stacked time part (the ``<part>_s`` columns of a sweep frame)."""

_LABELS = {"inter_node_bandwidth": "inter-node bandwidth (x the cluster's)",
           "num_nodes": "nodes", "global_batch": "global batch (sequences)"}


def sensitivity_figure(frame: pd.DataFrame, title: str = "") -> plt.Figure:
    """Step time and MFU against the swept value, and the stacked time breakdown (seconds).

    Raises:
        SpecError: the frame is empty or lacks the sweep columns.
    """
    need = {"parameter", "value", "feasible", "step_time_s", "mfu", "plan"} \
        | {f"{k}_s" for k in PART_COLORS}
    missing = sorted(need - set(getattr(frame, "columns", [])))
    if len(frame) == 0 or missing:
        raise SpecError("sensitivity_figure needs a non-empty paraplan.sweep frame"
                        + (f"; missing columns {missing}" if missing else ""), field="frame",
                        allowed=sorted(need))
    parameter = str(frame["parameter"].iloc[0])
    xs = [float(x) for x in frame["value"]]
    ok = [bool(f) for f in frame["feasible"]]
    steps = [float(s) for s in frame["step_time_s"]]
    mfus = [100 * float(m) for m in frame["mfu"]]
    fig, (ax, axb) = plt.subplots(2, 1, figsize=(10, 8), gridspec_kw={"height_ratios": [1, 1]})

    positive = [x for x in xs if x > 0]
    if positive and max(positive) / min(positive) >= 20:
        ax.set_xscale("log")
    fx = [x for x, f in zip(xs, ok, strict=True) if f]
    ax.plot(fx, [s for s, f in zip(steps, ok, strict=True) if f], "o-", color="#4C72B0",
            label="step time")
    ax.set_ylabel("step time (s)", color="#4C72B0")
    ax.set_xlabel(_LABELS.get(parameter, parameter))
    ax.grid(alpha=0.3)
    axr = ax.twinx()
    axr.plot(fx, [m for m, f in zip(mfus, ok, strict=True) if f], "s--", color="#DD8452",
             label="MFU")
    axr.set_ylabel("MFU (%)", color="#DD8452")
    bad = [x for x, f in zip(xs, ok, strict=True) if not f]
    if bad:
        ax.plot(bad, [0.0] * len(bad), "x", color="red", markersize=10, mew=2,
                label="does not run", clip_on=False)
    lines = ax.get_legend_handles_labels()
    lines_r = axr.get_legend_handles_labels()
    ax.legend(lines[0] + lines_r[0], lines[1] + lines_r[1], fontsize=8, loc="best")
    finite = [v for v in steps if math.isfinite(v)] or [1.0]
    ax.set_ylim(0, max(finite) * 1.3)
    axr.set_ylim(0, max([m for m in mfus if math.isfinite(m)] or [1.0]) * 1.3)
    plans = {p for p, f in zip(frame["plan"], ok, strict=True) if f}
    fixed = len(plans) == 1 and frame.get("searcher") is not None \
        and frame["searcher"].isna().all()
    ax.set_title(title or f"what if: {parameter}"
                 + (f" (fixed plan {next(iter(plans))})" if fixed else " (best plan per value)"))

    pos = range(len(xs))
    bottoms = [0.0] * len(xs)
    for part, color in PART_COLORS.items():
        vals = [float(v) if f and not math.isnan(float(v)) else 0.0
                for v, f in zip(frame[f"{part}_s"], ok, strict=True)]
        if any(vals):
            axb.bar(pos, vals, bottom=bottoms, color=color, width=0.7,
                    label=part.replace("_comm", " comm"))
            bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ticks, prev = [], None
    for i, (x, plan, f) in enumerate(zip(xs, frame["plan"], ok, strict=True)):
        label = f"{x:g}"
        if not f:
            axb.text(i, 0, " does not run", rotation=90, ha="center", va="bottom",
                     fontsize=8, color="red")
        elif plan != prev and not fixed:  # the searched plan changes here: name it
            label += "\n" + "\n".join(str(plan).split())
        prev = plan if f else prev
        ticks.append(label)
    axb.set_xticks(list(pos), ticks, fontsize=7 if not fixed else 10)
    axb.set_xlabel(_LABELS.get(parameter, parameter))
    axb.set_ylabel("seconds per step")
    axb.set_ylim(0, max([*bottoms, 1e-12]) * 1.2)
    axb.legend(fontsize=8, ncol=4, loc="upper left")
    axb.set_title("where the step time goes")
    fig.tight_layout()
    return fig
