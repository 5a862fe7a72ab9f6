"""What-if sweeps: how step time, MFU and the time breakdown move when one knob changes.

``sweep(model, cluster, training, parameter=..., values=[...])`` varies one of

* ``"inter_node_bandwidth"``: ``values`` are **multipliers** of every link that leaves a node
  (each node group's NIC link, the cluster's ``intra_region_link`` and every WAN
  ``region_links`` entry); 1 is the cluster as given, 0.1 a network ten times slower. Latencies
  stay as they are. The absolute NIC bandwidth of the first node group after scaling is the
  column ``inter_node_bandwidth_GBps`` (GB/s per NIC, one direction).
* ``"num_nodes"``: ``values`` are node counts (clusters of one node type, like ``--nodes``).
* ``"global_batch"``: ``values`` are global batch sizes in sequences.

With ``plan`` the same plan is simulated at every value (rows where it does not fit or is not
legal are kept with ``feasible=False`` and the reason); without, the best plan is searched at
every value. Pure: no plotting, no I/O (``paraplan.viz.sensitivity`` draws the frame).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from paraplan.search.exhaustive import TIME_PARTS
from paraplan.search.moe_runs import report_run
from paraplan.simulator.step import StepReport, simulate
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError, from_validation_error
from paraplan.specs.loaders import load_cluster, load_model
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan, parse_plan
from paraplan.specs.training import TrainingSpec

if TYPE_CHECKING:
    import pandas as pd

PARAMETERS = ("inter_node_bandwidth", "num_nodes", "global_batch")
"""Knobs :func:`sweep` can vary."""

TIME_COLUMNS = tuple(f"{part}_s" for part in TIME_PARTS)
"""Time-part columns of a sweep frame (seconds; as ``SearchResult.to_frame``)."""

COLUMNS = ("parameter", "value", "feasible", "reason", "plan", "moe_run", "searcher", "num_gpus",
           "global_batch", "inter_node_bandwidth_GBps", "step_time_s", "tokens_per_s", "mfu",
           "memory_peak_gb", *TIME_COLUMNS)
"""Columns of a sweep frame, in order."""

Progress = Callable[[int, int], None]
"""Called as ``progress(done, total)`` after each value."""


def _check_values(parameter: str, values: Iterable[Any]) -> list[float | int]:
    """The sweep values as numbers (ints for counts); SpecError names the bad one."""
    given = values
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        values = []  # not a collection of numbers: reported below
    values = list(values)
    if not values:
        raise SpecError(f"sweep of {parameter}: values={given!r} must be a non-empty list of "
                        "numbers", field="values", value=given,
                        allowed="a non-empty list of numbers")
    integer = parameter != "inter_node_bandwidth"
    allowed = ("positive integers" if integer
               else "positive multipliers of the inter-node bandwidth (1 = as given)")
    out: list[float | int] = []
    for i, x in enumerate(values):
        ok = isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(float(x)) \
            and float(x) > 0
        if ok and integer:
            ok = isinstance(x, Integral) or float(x).is_integer()
        if not ok:
            raise SpecError(f"sweep of {parameter}: values[{i}]={x!r} is not allowed; "
                            f"{parameter} takes {allowed}", field=f"values[{i}]", value=x,
                            allowed=allowed)
        out.append(int(x) if integer else float(x))
    return out


def scale_inter_node_bandwidth(cluster: ClusterSpec, factor: float) -> ClusterSpec:
    """``cluster`` with every link that leaves a node ``factor`` times as fast: each node
    group's NIC link, the ``intra_region_link`` and the WAN ``region_links`` (latencies kept).
    """
    groups = [g.model_copy(update={"inter_node_link": g.inter_node_link.model_copy(
        update={"bandwidth_GBps": g.inter_node_link.bandwidth_GBps * factor})})
        for g in cluster.node_groups]
    irl = cluster.intra_region_link
    if irl is not None:
        irl = irl.model_copy(update={"bandwidth_GBps": irl.bandwidth_GBps * factor})
    wan = [r.model_copy(update={"bandwidth_Gbps": r.bandwidth_Gbps * factor})
           for r in cluster.region_links]
    return cluster.model_copy(update={"node_groups": groups, "intra_region_link": irl,
                                      "region_links": wan})


def _variant(cluster: ClusterSpec, training: TrainingSpec, parameter: str,
             value: float | int) -> tuple[ClusterSpec, TrainingSpec]:
    """The (cluster, training) pair at one sweep value."""
    if parameter == "inter_node_bandwidth":
        return scale_inter_node_bandwidth(cluster, float(value)), training
    if parameter == "num_nodes":
        return cluster.with_nodes(int(value)), training
    try:
        # Only the fields the user set stay set (the trainer's facts, the MoE run settings a
        # search chooses, stay free).
        return cluster, TrainingSpec.model_validate(
            {**training.model_dump(include=training.model_fields_set),
             "global_batch_size": int(value)})
    except ValidationError as exc:
        raise from_validation_error(exc, "training") from None


def _row(parameter: str, value: float | int, cluster: ClusterSpec, training: TrainingSpec,
         report: StepReport | None, reason: str, searcher: str | None,
         plan: str) -> dict[str, Any]:
    """One frame row; time columns are NaN where the plan did not run."""
    nan = float("nan")
    ok = report is not None and report.feasible
    row: dict[str, Any] = {
        "parameter": parameter, "value": value, "feasible": ok,
        "reason": "" if ok else reason, "plan": plan,
        "moe_run": None if report is None else report_run(report), "searcher": searcher,
        "num_gpus": cluster.num_gpus, "global_batch": training.global_batch_size,
        "inter_node_bandwidth_GBps": cluster.node_groups[0].inter_node_link.bandwidth_GBps,
        "step_time_s": nan, "tokens_per_s": nan, "mfu": nan, "memory_peak_gb": nan,
    }
    row.update(dict.fromkeys(TIME_COLUMNS, nan))
    if report is not None:
        peak = report.memory_gb.get("peak", 0.0)
        row["memory_peak_gb"] = peak if peak > 0 else nan
    if ok and report is not None:
        row.update(step_time_s=report.step_time_s, tokens_per_s=report.tokens_per_s,
                   mfu=report.mfu)
        row.update({f"{k}_s": report.time_s.get(k, 0.0) for k in TIME_PARTS})
    return row


def sweep(model: ModelSpec | str, cluster: ClusterSpec | str, training: TrainingSpec, *,
          parameter: str, values: Iterable[float | int],
          plan: ParallelPlan | str | dict[str, Any] | None = None,
          searcher: str = "exhaustive", progress: Progress | None = None,
          trainer: Any = None) -> pd.DataFrame:
    """Simulate (``plan`` given) or search (``plan=None``) at every value of one knob.

    Args:
        model: A ModelSpec or a name/path ``load_model`` accepts.
        cluster: A ClusterSpec or a name/path ``load_cluster`` accepts.
        training: The training setup (its ``global_batch_size`` is replaced when sweeping
            ``"global_batch"``).
        parameter: One of :data:`PARAMETERS` (module docstring: what the values mean).
        values: The values (a list, range, numpy array, ...), in the order the rows
            should have.
        plan: A fixed plan (ParallelPlan, inline ``tp=2,pp=2,...`` text or dict), or None to
            search the best plan at each value.
        searcher: The searcher when ``plan`` is None (``paraplan.search.SEARCHERS``).
        progress: Called as ``progress(done, total)`` after each value.
        trainer: A trainer profile (name, path or TrainerSpec): simulate and search as that
            trainer runs plans (``paraplan.search.search``); None prices plans as written.

    Returns:
        One row per value with the columns of :data:`COLUMNS`: ``parameter``, ``value``,
        ``feasible``, ``reason`` (empty when feasible), ``plan`` (short string), ``moe_run``
        (MoE searches: the dispatcher and overlap the plan was ranked under), ``searcher``
        (None for a fixed plan), ``num_gpus``, ``global_batch`` (sequences),
        ``inter_node_bandwidth_GBps`` (first node group's NIC, GB/s), ``step_time_s`` (s),
        ``tokens_per_s`` (cluster), ``mfu`` (fraction), ``memory_peak_gb`` (GiB, worst rank;
        also given for plans that do not fit) and the time parts in seconds (``compute_s``,
        ``bubble_s``, ``tp_comm_s``, ``cp_comm_s``, ``ep_comm_s``, ``pp_comm_s``,
        ``dp_comm_s``, ``optimizer_s``, ``exposed_comm_s``). Values that do not run are NaN.

    Raises:
        SpecError: unknown parameter or searcher, a bad value (names its index, the value and
            what is allowed), a bad plan, or ``num_nodes`` on a cluster of several node types.
    """
    import pandas as pd

    from paraplan.search import SEARCHERS
    from paraplan.search import search as run_search

    if parameter not in PARAMETERS:
        raise SpecError(f"sweep parameter={parameter!r} is not one of {', '.join(PARAMETERS)}",
                        field="parameter", value=parameter, allowed=list(PARAMETERS))
    vals = _check_values(parameter, values)
    if plan is None and searcher not in SEARCHERS:
        raise SpecError(f"unknown searcher {searcher!r}", field="searcher", value=searcher,
                        allowed=list(SEARCHERS))
    spec_model = load_model(model)
    spec_cluster = load_cluster(cluster)
    fixed = None if plan is None else plan if isinstance(plan, ParallelPlan) else parse_plan(plan)
    rows: list[dict[str, Any]] = []
    for done, value in enumerate(vals, start=1):
        c, t = _variant(spec_cluster, training, parameter, value)
        if fixed is not None:
            rep = simulate(spec_model, c, t, fixed, trainer=trainer)
            rows.append(_row(parameter, value, c, t, rep, "; ".join(rep.reasons), None,
                             fixed.short()))
        else:
            try:
                result = run_search(spec_model, c, t, searcher=searcher, top=1, trainer=trainer)
            except SpecError as exc:
                if not str(exc).startswith("no "):  # not "no plan fits / no legal plan"
                    raise
                rows.append(_row(parameter, value, c, t, None, str(exc), searcher, ""))
            else:
                best = result.best
                rows.append(_row(parameter, value, c, t, best,
                                 "no plan found" if best is None else "", result.searcher,
                                 "" if best is None else best.extra.get("plan_short", "")))
        if progress is not None:
            progress(done, len(vals))
    return pd.DataFrame(rows, columns=list(COLUMNS))
