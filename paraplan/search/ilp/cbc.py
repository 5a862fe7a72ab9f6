"""PuLP + CBC plumbing: variables, one solve with a time limit, its status, bound and gap."""

from __future__ import annotations

import os
import re
import tempfile
import time
import warnings

import pulp

from paraplan.search.ilp.results import SolveRecord

MS = 1e3
"""ILP time unit: coefficients are milliseconds (seconds x 1e3)."""
MIN_SOLVE_S = 1.0
"""Smallest CBC time limit handed to one solve, seconds."""



_BOUND_RE = re.compile(r"(?:Lower bound|best possible)[:\s]+(-?[0-9.eE+]+)")


def lp_var(prob: pulp.LpProblem, name: str, low: float | None = None, up: float | None = None,
         cat: str = "Continuous") -> pulp.LpVariable:
    """A variable of ``prob`` (PuLP >= 3.3's ``add_variable``; ``LpVariable`` before)."""
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat=cat)  # pragma: no cover - old PuLP


def solve_cbc(prob: pulp.LpProblem, time_limit_s: float, formulation: str,
         choice: str) -> SolveRecord:
    """Solve ``prob`` with CBC (subprocess) and read status, objective, bound and gap."""
    with tempfile.TemporaryDirectory(prefix="paraplan-ilp-") as tmp:
        log = os.path.join(tmp, "cbc.log")
        start = time.perf_counter()
        with warnings.catch_warnings():  # PuLP 3.3 flags PULP_CBC_CMD for its 4.0
            warnings.simplefilter("ignore", DeprecationWarning)
            # Root cuts mostly re-derive the fluid bound here; off, CBC is 3-5x faster.
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(MIN_SOLVE_S, time_limit_s),
                                       logPath=log, cuts=False)
            prob.solve(solver)
        wall = time.perf_counter() - start
        try:
            with open(log, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            text = ""
    stopped = "Stopped on time" in text or "Stopped on iteration" in text
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if prob.status == pulp.LpStatusInfeasible or "infeasible" in text.split("Result -")[-1][:80]:
        return SolveRecord(formulation, choice, "infeasible", None, None, None, wall)
    if not has_solution:
        return SolveRecord(formulation, choice, "no_solution", None, None, None, wall)
    obj = float(pulp.value(prob.objective) or 0.0)
    if prob.sol_status == pulp.LpSolutionOptimal and not stopped:
        return SolveRecord(formulation, choice, "optimal", obj, obj, 0.0, wall)
    found = _BOUND_RE.findall(text)
    bound = float(found[-1]) if found else None
    gap = None if bound is None else max(0.0, (obj - bound) / abs(obj) if obj else 0.0)
    return SolveRecord(formulation, choice, "time_limit", obj, bound, gap, wall)
