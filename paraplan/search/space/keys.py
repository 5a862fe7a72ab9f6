"""Compact keys of plan-field combinations (``key_index``, ``group_rows``), a priced plan's key
(``plan_key``) and the (alpha, beta) lines of one group's collective (``group_lines``), shared
by the vectorized evaluator's stages and the searchers."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from paraplan.simulator.collectives import collective_lines

if TYPE_CHECKING:
    from paraplan.simulator.step import StepReport

DENSE_KEYS = 1 << 24  # largest code space key_index marks in a table (1 B + 8 B per code)


def key_index(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows of stacked non-negative integer columns (lexicographic) and each row's
    index into them. Each column is first ranked among its own distinct values (a table of
    max + 1 entries), so a row's mixed-radix code runs over the product of the distinct
    counts; while that fits ``DENSE_KEYS`` (and a few times the rows) the unique codes are
    found by marking a table, linear in the rows (no sort), else by ``np.unique`` (of the
    rows themselves where the code would overflow). All give the same rows in one order."""
    n = cols[0].shape[0]
    if n == 0:
        return np.zeros((0, len(cols)), dtype=np.int64), np.zeros(0, dtype=np.int64)
    values, seens = [], []
    for col in cols:
        seen = np.zeros(int(col.max()) + 1, dtype=bool)
        seen[col] = True
        values.append(np.flatnonzero(seen))
        seens.append(seen)
    space = 1
    for v in values:
        space *= len(v)
    if space >= 1 << 62:  # the code would overflow int64: sort the rows themselves
        keys, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        return keys.astype(np.int64), inv.reshape(-1)
    # Mixed radix over the distinct counts, one column at a time (each column's rank table is
    # max + 1 entries; the rows' ranks are gathered into the code and dropped, so the
    # temporaries stay two arrays of the rows whatever the column count). Codes and tables
    # are int32 where the code space allows: half the memory traffic, and np.take rather
    # than fancy indexing (several times faster for gathers from a small table).
    small = space < 1 << 31
    dtype = np.int32 if small else np.int64
    code = np.zeros(n, dtype=dtype)
    for col, seen, v in zip(cols, seens, values, strict=True):
        rank = np.cumsum(seen, dtype=dtype) - 1
        code *= len(v)
        code += np.take(rank, col)
    if space <= min(DENSE_KEYS, 8 * n):  # a table no larger than a few times the rows
        hit = np.zeros(space, dtype=bool)
        hit[code] = True
        uniq = np.flatnonzero(hit)
        inv = np.take(np.cumsum(hit, dtype=dtype) - 1, code).astype(np.int64)
    else:
        uniq, inv = np.unique(code, return_inverse=True)
    digits = []
    rest = uniq
    for v in reversed(values):  # decode each unique code back to the columns' values
        digits.append(v[rest % len(v)])
        rest = rest // len(v)
    return np.stack(digits[::-1], axis=1).astype(np.int64), inv.reshape(-1)


def group_rows(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows grouped by their values in ``cols``: (the distinct rows as ``key_index`` gives
    them, the row indices group after group with each group's rows in their order, and the
    groups' bounds in that order: group g is ``order[bounds[g]:bounds[g + 1]]``), the result
    of a stable sort by ``key_index``'s inverse. Works on the runs of equal rows, so a space
    whose rows come in long runs (a plan space's (pp, vpp): each structural block's grid
    repeats them) is grouped in a few passes over its rows, not sorted."""
    n = cols[0].shape[0]
    if n == 0:
        return (np.zeros((0, len(cols)), dtype=np.int64), np.zeros(0, dtype=np.int64),
                np.zeros(1, dtype=np.int64))
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for col in cols:
        change[1:] |= col[1:] != col[:-1]
    starts = np.flatnonzero(change)
    lengths = np.diff(np.append(starts, n))
    keys, run_group = key_index([col[starts] for col in cols])
    runs = np.argsort(run_group, kind="stable")  # each group's runs in row order
    offsets = np.cumsum(lengths[runs]) - lengths[runs]
    order = np.repeat(starts[runs] - offsets, lengths[runs]) + np.arange(n)
    sizes = np.bincount(run_group, weights=lengths, minlength=len(keys)).astype(np.int64)
    return keys, order, np.concatenate([[0], np.cumsum(sizes)])


def plan_key(report: StepReport) -> str:
    """A report's plan as one string: equal for the same plan, whichever search or run
    setting priced it (how merged rankings and re-split finalists drop duplicates)."""
    return json.dumps(report.plan, sort_keys=True, default=str)


def group_lines(topo, group: tuple[int, ...], kind: str) -> np.ndarray:
    """(3, 2) array of (alpha, beta) lines, padded with (inf, 0); (0, 0) for a group of one."""
    out = np.zeros((3, 2))
    out[:, 0] = np.inf
    lines = collective_lines(topo, group, kind) if len(group) > 1 else [(0.0, 0.0)]
    for i, (a, b) in enumerate(lines):
        out[i] = (a, b)
    return out
