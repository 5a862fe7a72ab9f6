"""Pipeline timeline and memory-per-stage figure for one simulated plan (matplotlib).

Reads only a StepReport (as a dict) and re-runs the pipeline event simulation on its
per-stage pass times to draw every forward (F), backward (B) and weight-gradient (W) pass.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from paraplan.specs.errors import SpecError  # noqa: E402
from paraplan.viz.events import report_timeline  # noqa: E402
from paraplan.viz.memory import draw_memory  # noqa: E402

COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
"""Colour of each pass kind: forward, backward (input grad), weight grad."""
P2P_COLOR = "#B0B0B0"
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
"""File types ``save_figure`` writes (matplotlib picks the format by suffix)."""


def timeline_figure(report: dict[str, Any], title: str = "") -> plt.Figure:
    """Figure with the pipeline timeline (top; seconds) and stacked memory per stage (bottom;
    GiB, see :func:`paraplan.viz.memory.draw_memory`)."""
    plan = report["plan"]
    timeline = report_timeline(report)
    p, m = len(report["stage_forward_s"]), report["num_microbatches"]
    v = plan.get("virtual_stages", 1)
    fig, (ax, axm) = plt.subplots(2, 1, figsize=(12, 3 + 0.45 * p + 3),
                                  gridspec_kw={"height_ratios": [max(2, p), 3]})
    t_p2p = float(report.get("pp_p2p_s") or 0.0) if p > 1 else 0.0
    for stage in range(p):  # one artist per stage and kind: fast for thousands of events
        mine = [ev for ev in timeline.events if ev.stage == stage]
        for kind, color in COLORS.items():
            spans = [(ev.start_s, ev.end_s - ev.start_s) for ev in mine if ev.kind == kind]
            if spans:
                ax.broken_barh(spans, (stage - 0.4, 0.8), facecolors=color,
                               edgecolors="white", linewidth=0.3)
        if t_p2p > 0:  # the blocking send after every F/B op (pipeline module docstring)
            ax.broken_barh([(ev.end_s, t_p2p) for ev in mine if ev.kind != "W"],
                           (stage - 0.25, 0.5), facecolors=P2P_COLOR, linewidth=0)
    if m * v <= 32:
        for ev in timeline.events:
            if ev.end_s - ev.start_s > timeline.total_s / 150:
                ax.text((ev.start_s + ev.end_s) / 2, ev.stage, str(ev.microbatch),
                        ha="center", va="center", fontsize=6, color="white")
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p), [f"stage {i}" for i in range(p)])
    ax.set_xlim(0, timeline.total_s)
    ax.set_xlabel("time within the step (s); white gaps are pipeline bubbles")
    kinds = {e.kind for e in timeline.events}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for k, c in COLORS.items() if k in kinds]
    labels = [{"F": "forward", "B": "backward", "W": "weight grad"}[k] for k in COLORS
              if k in kinds]
    if t_p2p > 0:
        handles.append(plt.Rectangle((0, 0), 1, 1, color=P2P_COLOR))
        labels.append("p2p send")
    ax.legend(handles, labels, loc="upper right", fontsize=8)
    bubble = report["time_s"]["bubble"]
    ax.set_title(title or f"{plan.get('schedule')} pipeline: {p} stages x {m} micro-batches, "
                 f"bubble {bubble:.3g} s of a {report['step_time_s'] or timeline.total_s:.3g} s "
                 "step")

    draw_memory(axm, report)
    fig.tight_layout()
    return fig


def check_figure_path(path: str | Path, field: str = "--plot") -> Path:
    """``path`` as a Path if it ends in a figure suffix (:data:`FIGURE_SUFFIXES`).

    Raises:
        SpecError: another suffix, or the path is an existing directory (names ``field``).
    """
    target = Path(path)
    if target.suffix.lower() not in FIGURE_SUFFIXES:
        raise SpecError(f"{field}={str(path)!r} must end in .png, .svg or .pdf", field=field,
                        value=str(path), allowed=list(FIGURE_SUFFIXES))
    if target.is_dir():
        raise SpecError(f"{field}={str(path)!r} is a directory; give a file name", field=field,
                        value=str(path))
    return target


def save_figure(fig: plt.Figure, path: str | Path, *, field: str = "--plot") -> Path:
    """Write ``fig`` atomically (``export.files.write_atomic``); the format follows the suffix.

    Raises:
        SpecError: the file or its directory cannot be written (names ``field``).
    """
    from paraplan.export.files import check_target, write_atomic

    target = check_target(path, field)
    suffix = (target.suffix or ".png").lstrip(".").lower()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=130, format=suffix)
    except ValueError as exc:
        raise SpecError(f"cannot write {field} {str(target)!r}: {exc}", field=field,
                        value=str(target)) from None
    finally:
        plt.close(fig)
    return write_atomic(target, buf.getvalue(), field=field)
