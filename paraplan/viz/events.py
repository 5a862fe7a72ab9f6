"""The pipeline events of a simulated step, re-derived from its StepReport dict (no plotting;
shared by the timeline figure and the Chrome trace)."""

from __future__ import annotations

from typing import Any

from paraplan.simulator.pipeline import Timeline, simulate_pipeline
from paraplan.specs.errors import SpecError


def report_timeline(report: dict[str, Any]) -> Timeline:
    """Re-run the pipeline event simulation of a feasible StepReport dict, with events.

    Uses the report's per-stage pass times (``stage_forward_s``, ``stage_backward_s``,
    ``stage_wgrad_s``, seconds), ``num_microbatches``, the plan's schedule and virtual stages
    and the one-transfer time ``pp_p2p_s`` (seconds).

    Raises:
        SpecError: the report has no per-stage times (an infeasible plan).
    """
    if not report.get("feasible") or not report.get("stage_forward_s"):
        raise SpecError("a pipeline timeline needs a feasible plan; this one is not: "
                        + "; ".join(report.get("reasons") or ["no per-stage times"]),
                        field="plan", value=report.get("plan_short"))
    plan = report["plan"]
    t_f, t_b = report["stage_forward_s"], report["stage_backward_s"]
    p, m = len(t_f), report["num_microbatches"]
    schedule = plan["schedule"] if p > 1 else "1f1b"
    v = plan.get("virtual_stages", 1) if schedule == "interleaved" else 1
    return simulate_pipeline(schedule, t_f, t_b, m, v=v, t_w=report.get("stage_wgrad_s"),
                             t_p2p=report.get("pp_p2p_s", 0.0), record_events=True)
