"""``evaluate_space(top=K)`` times only the plans that can reach the K fastest
(``search.space.prune``): what it leaves untimed could never be in the top, and the searcher
returns the same plans."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from paraplan import TrainingSpec, load_cluster, load_model, simulate
from paraplan.search.exhaustive import exhaustive_search, top_k
from paraplan.search.space import SpaceOptions, build_space, evaluate_space, prune

CASES = (
    ("llama3-8b", "dgx-h100", 2, 128, 4096, {}),
    ("gpt3-2.7b", "dgx-a100-80gb", 2, 256, 2048, {}),
    # MoE with leading dense layers and an MTP module (uneven layer costs), and one with the
    # all-to-all overlap (its unpartnered warm-up passes)
    ("deepseek-moe-16b", "dgx-h100", 2, 128, 4096, {}),
    ("mixtral-8x7b", "dgx-h100", 4, 256, 4096, {"moe_dispatcher": "hierarchical",
                                                 "moe_a2a_overlap": True}),
)


@cache
def _evaluated(i: int, top: int):
    name, cluster, nodes, batch, seq, more = CASES[i]
    model, cl = load_model(name), load_cluster(cluster, nodes=nodes)
    tr = TrainingSpec(global_batch_size=batch, seq_len=seq, **more)
    space = build_space(model, cl, tr, options=SpaceOptions(max_micro_batch=8))
    full = evaluate_space(space, exact_interleaved=False)
    mp = pytest.MonkeyPatch()
    mp.setattr(prune, "FIRST_PASS_PLANS", 1)  # a first pass of 64 top plans: prunes here
    try:
        cut = evaluate_space(space, exact_interleaved=False, top=top)
    finally:
        mp.undo()
    return model, cl, tr, space, full, cut


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("top", [1, 5])
def test_untimed_plans_could_never_reach_the_top(case: int, top: int) -> None:
    model, cl, tr, space, full, cut = _evaluated(case, top)
    assert np.array_equal(full.peak_gib, cut.peak_gib)
    timed = np.isfinite(cut.step_time_s)
    pruned = full.feasible & ~timed
    assert pruned.sum() > len(space) // 10  # the pruning is not vacuous here
    # What it times, it times exactly as the full evaluation does.
    assert np.array_equal(cut.step_time_s[timed], full.step_time_s[timed])
    assert np.array_equal(cut.lower_s[timed], full.lower_s[timed])
    assert np.array_equal(cut.exact[timed], full.exact[timed])
    # The bound it keeps for the others is a lower bound, and none of them could beat the
    # top-th best exact time.
    assert not cut.exact[pruned].any()
    assert np.all(cut.lower_s[pruned] <= full.lower_s[pruned] * (1 + 1e-12))
    kth = np.sort(full.step_time_s[full.feasible & full.exact])[top - 1]
    assert np.all(cut.lower_s[pruned] >= kth * (1 - 1e-12))

    def sim(i: int):
        return simulate(model, cl, tr, space.plan(i))

    def ranked(ev):
        return [(r.extra["plan_short"], r.step_time_s)
                for r in top_k(ev.step_time_s, ev.lower_s, ev.feasible, top, sim)]

    assert ranked(cut) == ranked(full)


@pytest.mark.parametrize("case", [0, 2, 3])
def test_the_bound_holds_against_simulate(case: int) -> None:
    """The average stage's work bounds what ``simulate`` returns, uneven layer splits and
    the MoE overlap's unpartnered passes included."""
    model, cl, tr, space, _, cut = _evaluated(case, 1)
    pruned = np.nonzero(cut.feasible & ~np.isfinite(cut.step_time_s))[0]
    for i in np.random.default_rng(case).choice(pruned, size=12, replace=False).tolist():
        rep = simulate(model, cl, tr, space.plan(i))
        assert rep.step_time_s >= cut.lower_s[i] * (1 - 1e-12)


def test_kth_exact_takes_the_smaller_of_the_found_time_and_the_cutoff() -> None:
    step = np.array([3.0, 1.0, 2.0, np.nan, 0.5])
    exact = np.array([True, True, True, True, False])
    timed = np.ones(5, dtype=bool)
    assert prune.kth_exact(step, exact, timed, 2, None) == pytest.approx(2.0)
    assert prune.kth_exact(step, exact, timed, 2, 1.5) == pytest.approx(1.5)
    assert prune.kth_exact(step, exact, timed, 4, None) == np.inf  # too few exact rows


def test_work_bound_is_the_average_stage_times_the_micro_batches() -> None:
    lc = np.zeros((2, 2, 9))
    lc[0, 0, :2] = (1.0, 2.0)  # dense f, b
    lc[0, 1, :2] = (3.0, 5.0)  # moe f, b
    lc[1] = lc[0] * 10
    bound = prune.work_bound(np.array([4, 8]), np.array([2, 4]), np.array([0, 1]), lc, 3, 5)
    assert bound.tolist() == [4 * (3 * 3 + 5 * 8) / 2, 8 * 10 * (3 * 3 + 5 * 8) / 4]


def test_the_searcher_returns_the_same_plans_pruned_or_not(monkeypatch) -> None:
    model, cl = load_model("mixtral-8x7b"), load_cluster("dgx-h100", nodes=4)
    tr = TrainingSpec(global_batch_size=256, seq_len=4096)
    opts = SpaceOptions(max_micro_batch=8)
    monkeypatch.setattr(prune, "FIRST_PASS_PLANS", 10**9)  # times every plan that fits
    whole = exhaustive_search(model, cl, tr, top=8, options=opts)
    monkeypatch.setattr(prune, "FIRST_PASS_PLANS", 1)
    pruned = exhaustive_search(model, cl, tr, top=8, options=opts)
    assert [(r.extra["plan_short"], r.step_time_s) for r in pruned.reports] == \
        [(r.extra["plan_short"], r.step_time_s) for r in whole.reports]


def test_pruning_alone_adds_no_note_about_estimated_plans(monkeypatch) -> None:
    """Untimed (pruned) rows are not exact, but they are not the interleaved / uneven-split
    estimates the searcher's note is about."""
    from paraplan.search.space import parse_fix

    model, cl = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    tr = TrainingSpec(global_batch_size=64, seq_len=4096)
    opts, fix = SpaceOptions(max_micro_batch=8), parse_fix("schedule=1f1b")
    full = evaluate_space(build_space(model, cl, tr, fix, opts), exact_interleaved=False)
    assert full.exact[full.feasible].all()  # no estimated plans in this space
    monkeypatch.setattr(prune, "FIRST_PASS_PLANS", 1)
    result = exhaustive_search(model, cl, tr, fix=fix, top=3, options=opts)
    assert not any("bound/estimate" in note for note in result.notes)
