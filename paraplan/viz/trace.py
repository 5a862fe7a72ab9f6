"""Chrome trace / Perfetto JSON of one simulated step (open in ui.perfetto.dev or
chrome://tracing).

Process 0 ("pipeline") has one thread per pipeline stage ("stage i"): a complete ("X") event
per forward / backward / weight-gradient pass named like ``F mb3`` (``F mb3 c1`` for model
chunk 1 of an interleaved schedule), followed on the same thread by its blocking p2p send
(``send F mb3``, category ``p2p``) when the plan has pipeline parallelism. Gaps on a stage's
thread are its pipeline bubble. Process 1 ("step") has one thread showing the pipeline span,
then the exposed data-parallel synchronisation, the tied-embedding gradient all-reduce (tied
models under PP) and the optimizer step, so the whole step is
visible. Timestamps and durations are microseconds (the format's unit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paraplan.specs.safe_io import dumps_json
from paraplan.viz.events import report_timeline

PIPELINE_PID = 0
"""Process id of the per-stage pipeline threads."""
STEP_PID = 1
"""Process id of the whole-step summary thread."""
_US = 1e6  # microseconds per second
_PASS_NAMES = {"F": "forward", "B": "backward", "W": "weight grad"}


def _meta(pid: int, tid: int | None, name: str, value: str | int) -> dict[str, Any]:
    """A metadata ("M") event: process/thread names and sort order."""
    ev: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": {}}
    if tid is not None:
        ev["tid"] = tid
    ev["args"]["sort_index" if name.endswith("sort_index") else "name"] = value
    return ev


def chrome_trace(report: dict[str, Any]) -> dict[str, Any]:
    """The Chrome trace (``{"traceEvents": [...], "displayTimeUnit": "ms"}``) of a feasible
    StepReport dict; ``ts``/``dur`` are microseconds from the first forward's start.

    Raises:
        SpecError: the report is infeasible (it has no timeline).
    """
    timeline = report_timeline(report)
    plan = report["plan"]
    p = len(report["stage_forward_s"])
    interleaved = plan.get("schedule") == "interleaved" and plan.get("virtual_stages", 1) > 1
    t_p2p = float(report.get("pp_p2p_s") or 0.0) if p > 1 else 0.0
    events: list[dict[str, Any]] = [
        _meta(PIPELINE_PID, None, "process_name", "pipeline"),
        _meta(PIPELINE_PID, None, "process_sort_index", 0),
        _meta(STEP_PID, None, "process_name", "step"),
        _meta(STEP_PID, None, "process_sort_index", 1),
        _meta(STEP_PID, 0, "thread_name", "step phases"),
    ]
    for stage in range(p):
        events.append(_meta(PIPELINE_PID, stage, "thread_name", f"stage {stage}"))
        events.append(_meta(PIPELINE_PID, stage, "thread_sort_index", stage))
    for ev in timeline.events:
        name = f"{ev.kind} mb{ev.microbatch}" + (f" c{ev.chunk}" if interleaved else "")
        args = {"microbatch": ev.microbatch, "kind": _PASS_NAMES.get(ev.kind, ev.kind),
                "stage": ev.stage, "chunk": ev.chunk, "start_s": ev.start_s,
                "duration_s": ev.end_s - ev.start_s}
        events.append({"name": name, "cat": "compute", "ph": "X", "pid": PIPELINE_PID,
                       "tid": ev.stage, "ts": ev.start_s * _US,
                       "dur": (ev.end_s - ev.start_s) * _US, "args": args})
        if t_p2p > 0 and ev.kind != "W":
            events.append({"name": f"send {name}", "cat": "p2p", "ph": "X",
                           "pid": PIPELINE_PID, "tid": ev.stage, "ts": ev.end_s * _US,
                           "dur": t_p2p * _US,
                           "args": {"microbatch": ev.microbatch, "kind": "p2p",
                                    "after": ev.kind, "duration_s": t_p2p}})
    span = timeline.total_s
    bubbles = [round(b, 9) for b in timeline.bubble_s]
    time_s = report.get("time_s", {})
    phases = [("pipeline", span, {"bubble_s_per_stage": bubbles,
                                  "num_microbatches": report["num_microbatches"],
                                  "schedule": plan.get("schedule")}),
              ("dp sync (exposed)", float(time_s.get("dp_comm", 0.0)), {}),
              ("tied embedding all-reduce", float(report.get("tied_embedding_s", 0.0)), {}),
              ("optimizer", float(time_s.get("optimizer", 0.0)), {})]
    t = 0.0
    for name, dur, args in phases:
        if dur > 0:
            events.append({"name": name, "cat": "step", "ph": "X", "pid": STEP_PID, "tid": 0,
                           "ts": t * _US, "dur": dur * _US, "args": {"duration_s": dur, **args}})
            t += dur
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"plan": report.get("plan_short"),
                          "step_time_s": report.get("step_time_s"),
                          "pipeline_span_s": span, "p2p_s": t_p2p}}


def write_chrome_trace(report: dict[str, Any], path: str | Path, *,
                       field: str = "--trace") -> Path:
    """Write :func:`chrome_trace` of ``report`` as JSON to ``path`` atomically.

    Raises:
        SpecError: infeasible report, or the file cannot be written (names ``field``).
    """
    from paraplan.export.files import write_atomic

    return write_atomic(path, dumps_json(chrome_trace(report)) + "\n", field=field)
