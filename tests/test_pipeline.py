"""Pipeline schedules: closed forms, event simulation, in-flight micro-batches."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.simulator.pipeline import (
    SCHEDULES,
    Event,
    inflight_microbatches,
    pipeline_time,
    simulate_pipeline,
)

# Multiples of 1/8: sums and products stay exact in binary floating point.
dyadic = st.integers(0, 48).map(lambda k: k / 8)
positive = st.integers(1, 48).map(lambda k: k / 8)
FAST = settings(max_examples=60, deadline=None)


def _v(schedule: str, v: int) -> int:
    return v if schedule == "interleaved" else 1


# ---- hand-worked numbers ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "v", "t_w", "total", "bubble"),
    [
        ("gpipe", 1, 0.0, 33.0, 9.0),  # (m+p-1)(f+b) = 11*3
        ("1f1b", 1, 0.0, 33.0, 9.0),
        ("interleaved", 2, 0.0, 28.5, 4.5),  # bubble (p-1)(f+b)/v = 9/2
        ("interleaved", 4, 0.0, 26.25, 2.25),
        ("zb-h1", 1, 1.0, 27.0, 3.0),  # f = B = W = 1: bubble (p-1)(f+B-W) = 3
    ],
)
def test_hand_worked_p4_m8(schedule: str, v: int, t_w: float, total: float, bubble: float):
    pt = pipeline_time(schedule, 4, 8, 1.0, 2.0, v=v, t_w=t_w)
    assert pt.total_s == total and pt.bubble_s == bubble
    assert pt.compute_s == 24.0 and pt.p2p_s == 0.0
    assert pt.bubble_fraction == pytest.approx(bubble / total)
    tl = simulate_pipeline(schedule, [1.0] * 4, [2.0] * 4, 8, v=v, t_w=[t_w] * 4)
    assert tl.total_s == total


def test_1f1b_bubble_fraction_3_over_11():
    assert pipeline_time("1f1b", 4, 8, 1.0, 2.0).bubble_fraction == pytest.approx(3 / 11)


def test_zb_h1_is_a_third_of_1f1b_when_f_b_w_equal():
    # Qi et al. 2023: with T_F = T_B = T_W the ZB-H1 bubble is 1/3 of 1F1B's.
    for p, m in [(4, 8), (8, 32), (6, 6)]:
        zb = pipeline_time("zb-h1", p, m, 1.0, 2.0, t_w=1.0)
        ref = pipeline_time("1f1b", p, m, 1.0, 2.0)
        assert zb.bubble_s == pytest.approx(ref.bubble_s / 3)


def test_p2p_convention_hand_worked():
    # Every F and B op pays one transfer: 1f1b total = (m+p-1)(f+b+2c) = 11 * 3.5.
    pt = pipeline_time("1f1b", 4, 8, 1.0, 2.0, t_p2p=0.25)
    assert (pt.total_s, pt.p2p_s, pt.bubble_s) == (38.5, 5.5, 9.0)
    tl = simulate_pipeline("1f1b", [1.0] * 4, [2.0] * 4, 8, t_p2p=0.25)
    assert tl.total_s == 38.5 and tl.critical_p2p_s == 5.5
    assert tl.p2p_s == [4.0] * 4  # 16 ops * 0.25 on every stage
    assert tl.bubble_s == [38.5 - 24.0 - 4.0] * 4


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_single_stage_has_no_bubble_and_no_p2p(schedule: str):
    v = _v(schedule, 3)
    pt = pipeline_time(schedule, 1, 5, 1.0, 2.0, v=v, t_w=0.5, t_p2p=9.0)
    assert (pt.total_s, pt.bubble_s, pt.p2p_s, pt.bubble_fraction) == (15.0, 0.0, 0.0, 0.0)
    tl = simulate_pipeline(schedule, [1.0], [2.0], 5, v=v, t_w=[0.5], t_p2p=9.0)
    assert tl.total_s == pytest.approx(15.0) and tl.bubble_s[0] == pytest.approx(0.0)


def test_fewer_microbatches_than_stages():
    pt = pipeline_time("1f1b", 8, 2, 1.0, 2.0)
    assert pt.total_s == 27.0 and pt.bubble_fraction == pytest.approx(7 / 9)
    assert simulate_pipeline("1f1b", [1.0] * 8, [2.0] * 8, 2).total_s == 27.0
    # Interleaved with m < p: a pipeline of v*p chunks, n = m + v*p - 1 chunk slots.
    assert pipeline_time("interleaved", 8, 2, 1.0, 2.0, v=2).total_s == 17 * 3 / 2


# ---- closed form vs event simulation ------------------------------------------------------


@FAST
@given(p=st.integers(1, 8), m=st.integers(1, 32))
def test_bubble_fraction_formula_gpipe_1f1b(p: int, m: int):
    for schedule in ("gpipe", "1f1b"):
        pt = pipeline_time(schedule, p, m, 0.75, 1.5)
        assert pt.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@FAST
@given(p=st.integers(1, 8), k=st.integers(1, 4), v=st.integers(2, 4), f=positive, b=positive)
def test_interleaved_bubble_divided_by_v(p: int, k: int, v: int, f: float, b: float):
    pt = pipeline_time("interleaved", p, k * p, f, b, v=v)
    assert pt.bubble_s == pytest.approx((p - 1) * (f + b) / v)


@settings(max_examples=150, deadline=None)
@given(
    schedule=st.sampled_from(SCHEDULES),
    p=st.integers(1, 8),
    m=st.integers(1, 32),
    v=st.integers(1, 4),
    f=dyadic,
    b=dyadic,
    w_frac=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    c=dyadic,
)
def test_simulation_equals_closed_form_on_equal_stages(
    schedule: str, p: int, m: int, v: int, f: float, b: float, w_frac: float, c: float
):
    v = _v(schedule, v)
    w = b * w_frac
    pt = pipeline_time(schedule, p, m, f, b, v=v, t_w=w, t_p2p=c)
    tl = simulate_pipeline(schedule, [f] * p, [b] * p, m, v=v, t_w=[w] * p, t_p2p=c)
    if v in (1, 2, 4):  # chunk times f/v stay dyadic: exact agreement
        assert tl.total_s == pt.total_s
    else:
        assert tl.total_s == pytest.approx(pt.total_s, rel=1e-12)
    assert all(x == pytest.approx(pt.compute_s) for x in tl.busy_s)
    assert pt.total_s == pytest.approx(pt.compute_s + pt.bubble_s + pt.p2p_s)
    zero = pipeline_time(schedule, p, m, f, b, v=v, t_w=w)
    assert pt.p2p_s == pytest.approx(pt.total_s - zero.total_s)
    assert pt.bubble_s == pytest.approx(zero.bubble_s)  # the bubble does not depend on p2p
    assert tl.critical_p2p_s >= pt.p2p_s - 1e-9
    if schedule != "zb-h1" and (v == 1 or m < p or m % p == 0):  # one critical-path shape
        assert tl.critical_p2p_s == pytest.approx(pt.p2p_s)
    if p > 1 and c > 0:
        # At least the fill hops (nothing else can run on later stages before the first
        # forward arrives) and, without W passes, the drain hops too; zb-h1's deferred W passes
        # can absorb part of the drain hops (hypothesis found zb-h1, p=6, m=2: 9 hops of 10).
        hops = (p - 1) if schedule == "zb-h1" else 2 * (p - 1)
        assert pt.p2p_s >= hops * c


# ---- unequal stages -----------------------------------------------------------------------


@st.composite
def unequal(draw: st.DrawFn) -> tuple:
    schedule = draw(st.sampled_from(SCHEDULES))
    p = draw(st.integers(1, 6))
    m = draw(st.integers(1, 16))
    v = _v(schedule, draw(st.integers(1, 3)))
    t_f = draw(st.lists(positive, min_size=p, max_size=p))
    t_b = draw(st.lists(positive, min_size=p, max_size=p))
    t_w = [b * draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])) for b in t_b]
    c = draw(dyadic)
    return schedule, p, m, v, t_f, t_b, t_w, c


@FAST
@given(case=unequal())
def test_unequal_stages_bounds(case: tuple):
    schedule, p, m, v, t_f, t_b, t_w, c = case
    tl = simulate_pipeline(schedule, t_f, t_b, m, v=v, t_w=t_w, t_p2p=c)
    eps = 1e-9 * (1 + tl.total_s)
    assert tl.total_s + eps >= max(tl.busy_s[r] + tl.p2p_s[r] for r in range(p))
    b_in = [b - w for b, w in zip(t_b, t_w, strict=True)] if schedule == "zb-h1" else t_b
    one_mb = sum(t_f) + sum(b_in) + (2 * p * c if p > 1 else 0.0)
    assert tl.total_s + eps >= one_mb
    # Longest path in a fixed DAG is monotone in op times: bracketed by equal-stage forms.
    w_lo, w_hi = (min(t_w), max(t_w)) if schedule == "zb-h1" else (0.0, 0.0)
    lo = pipeline_time(schedule, p, m, min(t_f), min(b_in) + w_lo, v=v, t_w=w_lo, t_p2p=c)
    hi = pipeline_time(schedule, p, m, max(t_f), max(b_in) + w_hi, v=v, t_w=w_hi, t_p2p=c)
    assert lo.total_s - eps <= tl.total_s <= hi.total_s + eps
    assert all(x >= 0 for x in tl.bubble_s)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_slowest_stage_dominates(schedule: str):
    p, m, v = 4, 64, _v(schedule, 2)
    t_f, t_b = [1.0, 1.0, 3.0, 1.0], [2.0, 2.0, 6.0, 2.0]
    t_w = [b / 2 for b in t_b]
    tl = simulate_pipeline(schedule, t_f, t_b, m, v=v, t_w=t_w)
    slow = m * (3.0 + 6.0)
    assert slow <= tl.total_s <= (m + p - 1) * 9.0
    assert tl.total_s / slow < 1.05
    assert max(range(p), key=tl.busy_s.__getitem__) == 2
    assert tl.bubble_s[2] == min(tl.bubble_s)


@FAST
@given(case=unequal())
def test_every_event_respects_dependencies(case: tuple):
    schedule, p, m, v, t_f, t_b, t_w, c = case
    tl = simulate_pipeline(schedule, t_f, t_b, m, v=v, t_w=t_w, t_p2p=c)
    x = c if p > 1 else 0.0
    ops = {(e.kind, e.stage, e.chunk, e.microbatch): e for e in tl.events}
    n_kinds = 3 if schedule == "zb-h1" else 2
    assert len(ops) == len(tl.events) == p * m * (v * 2 if n_kinds == 2 else 3)
    nk = v * p
    eps = 1e-9
    for (kind, r, ch, j), e in ops.items():
        k = ch * p + r
        if kind == "F" and k > 0:
            prev = ops["F", (k - 1) % p, (k - 1) // p, j]
            assert e.start_s + eps >= prev.end_s + x
        elif kind == "B":
            prev = ops["B", (k + 1) % p, (k + 1) // p, j] if k < nk - 1 else ops["F", r, ch, j]
            assert e.start_s + eps >= prev.end_s + x
            assert e.start_s + eps >= ops["F", r, ch, j].end_s
        elif kind == "W":
            assert e.start_s + eps >= ops["B", r, 0, j].end_s
    ends = []
    for r in range(p):  # one op at a time; a stage is blocked while its F/B output is sent
        mine = [e for e in tl.events if e.stage == r]
        assert [e.start_s for e in mine] == sorted(e.start_s for e in mine)
        for a, b in zip(mine, mine[1:], strict=False):
            assert b.start_s + eps >= a.end_s + (0.0 if a.kind == "W" else x)
        ends.append(mine[-1].end_s + (0.0 if mine[-1].kind == "W" else x))
    assert tl.total_s == pytest.approx(max(ends))


def test_per_boundary_p2p():
    t_f, t_b = [1.0] * 4, [2.0] * 4
    same = simulate_pipeline("1f1b", t_f, t_b, 8, t_p2p=[0.25] * 3)
    assert same.total_s == simulate_pipeline("1f1b", t_f, t_b, 8, t_p2p=0.25).total_s
    slow = simulate_pipeline("1f1b", t_f, t_b, 8, t_p2p=[0.25, 1.0, 0.25])
    assert slow.total_s > same.total_s
    # The optional p-th entry is the rank p-1 -> rank 0 link, used by interleaved only.
    base = simulate_pipeline("interleaved", t_f, t_b, 8, v=2, t_p2p=[0.25] * 4)
    wrap = simulate_pipeline("interleaved", t_f, t_b, 8, v=2, t_p2p=[0.25] * 3 + [2.0])
    assert wrap.total_s > base.total_s
    assert simulate_pipeline("1f1b", t_f, t_b, 8, t_p2p=[0.25] * 3 + [2.0]).total_s == \
        same.total_s


# ---- in-flight micro-batches --------------------------------------------------------------


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 3), (1, 5), (6, 6)])
def test_peak_inflight_simple_schedules(p: int, m: int):
    ones = [1.0] * p
    assert simulate_pipeline("1f1b", ones, ones, m).peak_inflight == [
        min(p - i, m) for i in range(p)]
    assert simulate_pipeline("gpipe", ones, ones, m).peak_inflight == [m] * p
    # zb-h1 keeps activations until W: every stage holds min(p, m) (Qi et al. 2023 sec 2.1).
    assert simulate_pipeline("zb-h1", ones, ones, m, t_w=[0.5] * p).peak_inflight == [
        min(p, m)] * p


@settings(max_examples=100, deadline=None)
@given(schedule=st.sampled_from(SCHEDULES), p=st.integers(1, 8), m=st.integers(1, 32),
       v=st.integers(1, 4))
def test_inflight_formula_matches_simulation(schedule: str, p: int, m: int, v: int):
    v = _v(schedule, v)
    tl = simulate_pipeline(schedule, [1.0] * p, [2.0] * p, m, v=v, t_w=[1.0] * p,
                           record_events=False)
    for r in range(p):
        assert inflight_microbatches(schedule, p, m, r, v=v) == tl.peak_inflight[r] / v


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 4), (8, 3)])
def test_interleaved_stage0_matches_korthikanti(p: int, v: int):
    # Narayanan et al. 2021 / Korthikanti et al. 2022: p * (1 + (p-1)/(p*v)) on stage 0.
    got = inflight_microbatches("interleaved", p, 8 * p, 0, v=v)
    assert got == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert inflight_microbatches("interleaved", p, 1, 0, v=v) == 1.0  # capped by m


# ---- misc ---------------------------------------------------------------------------------


def test_events_are_frozen_and_ordered():
    tl = simulate_pipeline("interleaved", [1.0] * 2, [2.0] * 2, 4, v=2)
    assert isinstance(tl.events[0], Event)
    assert {e.chunk for e in tl.events} == {0, 1}
    with pytest.raises(AttributeError):
        tl.events[0].start_s = 1.0  # type: ignore[misc]
    assert simulate_pipeline("1f1b", [1.0], [1.0], 2, record_events=False).events == []


def test_large_pipeline_is_fast():
    t0 = time.perf_counter()
    tl = simulate_pipeline("1f1b", [1.0] * 64, [2.0] * 64, 512, t_p2p=0.01)
    assert time.perf_counter() - t0 < 1.5
    assert tl.total_s == pytest.approx(pipeline_time("1f1b", 64, 512, 1.0, 2.0, t_p2p=0.01).total_s)


@pytest.mark.parametrize(
    "call",
    [
        lambda: pipeline_time("pipedream", 4, 8, 1.0, 2.0),
        lambda: pipeline_time("1f1b", 4, 8, 1.0, 2.0, v=2),
        lambda: pipeline_time("1f1b", 0, 8, 1.0, 2.0),
        lambda: pipeline_time("1f1b", 4, 0, 1.0, 2.0),
        lambda: pipeline_time("1f1b", 4, 8, -1.0, 2.0),
        lambda: pipeline_time("zb-h1", 4, 8, 1.0, 2.0, t_w=3.0),
        lambda: pipeline_time("1f1b", 4, 8, math.nan, 2.0),
        lambda: simulate_pipeline("1f1b", [1.0] * 4, [2.0] * 3, 8),
        lambda: simulate_pipeline("1f1b", [1.0] * 4, [2.0] * 4, 8, t_p2p=[0.1]),
        lambda: simulate_pipeline("zb-h1", [1.0] * 2, [2.0] * 2, 8, t_w=[3.0, 1.0]),
        lambda: inflight_microbatches("1f1b", 4, 8, 4),
    ],
)
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


@FAST
@given(schedule=st.sampled_from(SCHEDULES), p=st.integers(1, 6), m=st.integers(1, 12),
       v=st.integers(1, 3), a=st.lists(positive, min_size=6, max_size=6),
       b=st.lists(positive, min_size=6, max_size=6), c=dyadic)
def test_a_cached_op_program_serves_any_stage_times(schedule, p, m, v, a, b, c) -> None:
    """The op program is compiled once per (schedule, p, m, v) and reused: a simulation
    after another of the same shape gives what it gives on a fresh cache."""
    from paraplan.simulator.pipeline_events import _program

    v = _v(schedule, v)
    sums = [x + y for x, y in zip(a, b, strict=True)]
    first = simulate_pipeline(schedule, a[:p], sums[:p], m, v=v, t_p2p=c)
    again = simulate_pipeline(schedule, b[:p], [2 * x for x in a][:p], m, v=v, t_p2p=c / 2)
    _program.cache_clear()
    fresh = simulate_pipeline(schedule, b[:p], [2 * x for x in a][:p], m, v=v, t_p2p=c / 2)
    assert first.total_s > 0
    assert (again.total_s, again.critical_p2p_s, again.busy_s, again.p2p_s,
            again.peak_inflight, again.events) == \
        (fresh.total_s, fresh.critical_p2p_s, fresh.busy_s, fresh.p2p_s,
         fresh.peak_inflight, fresh.events)
