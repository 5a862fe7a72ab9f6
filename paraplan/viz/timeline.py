"""Pipeline timeline and memory-per-stage figure for one simulated plan (matplotlib).

Reads only a StepReport (as a dict) and re-runs the pipeline event simulation on its
per-stage pass times to draw every forward (F), backward (B) and weight-gradient (W) pass.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from paraplan.simulator.pipeline import simulate_pipeline  # noqa: E402

COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
MEMORY_COLORS = {"weights": "#4C72B0", "grads": "#8172B3", "optimizer": "#937860",
                 "activations": "#DD8452", "other": "#8C8C8C"}


def timeline_figure(report: dict[str, Any], title: str = "") -> plt.Figure:
    """Figure with the pipeline timeline (top) and stacked memory per stage (bottom)."""
    plan = report["plan"]
    t_f, t_b = report["stage_forward_s"], report["stage_backward_s"]
    p, m, v = len(t_f), report["num_microbatches"], plan.get("virtual_stages", 1)
    timeline = simulate_pipeline(plan["schedule"] if p > 1 else "1f1b", t_f, t_b, m, v=v,
                                 t_w=report.get("stage_wgrad_s"),
                                 t_p2p=report.get("pp_p2p_s", 0.0), record_events=True)
    fig, (ax, axm) = plt.subplots(2, 1, figsize=(12, 3 + 0.45 * p + 3),
                                  gridspec_kw={"height_ratios": [max(2, p), 3]})
    for ev in timeline.events:
        ax.broken_barh([(ev.start_s, ev.end_s - ev.start_s)], (ev.stage - 0.4, 0.8),
                       facecolors=COLORS.get(ev.kind, "#999999"), edgecolors="white",
                       linewidth=0.3)
        if m * v <= 32 and ev.end_s - ev.start_s > timeline.total_s / 150:
            ax.text((ev.start_s + ev.end_s) / 2, ev.stage, str(ev.microbatch), ha="center",
                    va="center", fontsize=6, color="white")
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p), [f"stage {i}" for i in range(p)])
    ax.set_xlim(0, timeline.total_s)
    ax.set_xlabel("time within the step (s); white gaps are pipeline bubbles")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for k, c in COLORS.items()
               if any(e.kind == k for e in timeline.events)]
    labels = [{"F": "forward", "B": "backward", "W": "weight grad"}[k] for k in COLORS
              if any(e.kind == k for e in timeline.events)]
    ax.legend(handles, labels, loc="upper right", fontsize=8)
    bubble = report["time_s"]["bubble"]
    ax.set_title(title or f"{plan.get('schedule')} pipeline: {p} stages x {m} micro-batches, "
                 f"bubble {bubble:.3g} s of a {report['step_time_s'] or timeline.total_s:.3g} s "
                 "step")

    breakdown = report["memory_per_stage_breakdown_gb"]
    bottoms = [0.0] * len(breakdown)
    for key, color in MEMORY_COLORS.items():
        vals = [b[key] for b in breakdown]
        axm.bar(range(len(vals)), vals, bottom=bottoms, color=color, label=key)
        bottoms = [x + y for x, y in zip(bottoms, vals, strict=True)]
    cap = report.get("memory_capacity_gb")
    if cap:
        axm.axhline(cap, color="red", linestyle="--", linewidth=1, label=f"capacity {cap:g} GiB")
    axm.set_xticks(range(len(breakdown)), [f"stage {i}" for i in range(len(breakdown))])
    axm.set_ylabel("GiB per GPU")
    axm.legend(fontsize=8, ncol=3, loc="upper right")
    axm.set_title("memory per GPU by pipeline stage")
    fig.tight_layout()
    return fig


def save_figure(fig: plt.Figure, path: str | Path) -> Path:
    """Write ``fig`` atomically (temporary file + rename); the format follows the suffix."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    suffix = target.suffix or ".png"
    fd, tmp = tempfile.mkstemp(prefix=".paraplan-", suffix=suffix, dir=target.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=130)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, target)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
