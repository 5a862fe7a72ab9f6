"""paraplan.search.dp: layer-split DP and per-layer recompute knapsack vs brute force/simulate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paraplan import (
    ModelSpec,
    ParallelPlan,
    SpecError,
    TrainingSpec,
    load_cluster,
    load_model,
    parse_plan,
    simulate,
)
from paraplan.search.dp import (
    RECOMPUTE_UNIT_BYTES,
    min_bottleneck_partition,
    min_cost_cover,
    optimal_layer_split,
    per_layer_recompute,
)
from paraplan.simulator.memory import ALLOCATOR_FRAGMENTATION, layer_activations
from paraplan.simulator.pipeline import inflight_microbatches
from paraplan.specs.loaders import cluster_from_dict
from tests.search_helpers import compositions, stage_times, with_memory

GIB = 2.0**30








def mini_moe() -> ModelSpec:
    """DeepSeekMoE-16B shape cut to 10 layers, the first 3 dense (cheap brute force)."""
    base = load_model("deepseek-moe-16b")
    return ModelSpec(**{**base.model_dump(), "name": "mini-moe", "num_layers": 10,
                        "first_dense_layers": 3})


MIXED = {"name": "mixed", "node_groups": [
    {"gpu": "a100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 1,
     "intra_node_link": "nvlink3", "inter_node_link": "ib-hdr", "nics_per_node": 8},
    {"gpu": "v100-sxm2-32gb", "gpus_per_node": 8, "num_nodes": 1,
     "intra_node_link": "nvlink2", "inter_node_link": "ib-hdr", "nics_per_node": 8},
]}


# ---- (a) the partition DP vs brute force on per-layer cost vectors -----------------------------


@pytest.mark.parametrize("seed", range(12))
def test_partition_dp_matches_brute_force_over_all_compositions(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(12, 17))
    p = int(rng.integers(2, 5))
    # Stage-dependent per-layer costs (a mixed cluster), a heavy tail layer block (MoE-like),
    # an LM head on the last stage and a random "out of memory" cap on layer counts.
    per_layer = rng.uniform(0.5, 2.0, size=(p, n))
    per_layer[:, int(rng.integers(0, n)):] *= rng.uniform(1.0, 3.0)
    head = float(rng.uniform(0.0, 6.0))
    max_layers = [int(rng.integers(n // p + 1, n + 1)) for _ in range(p)]
    mats = []
    for r in range(p):
        prefix = np.concatenate([[0.0], np.cumsum(per_layer[r])])
        cost = prefix[None, :] - prefix[:, None] + (head if r == p - 1 else 0.0)
        count = np.arange(n + 1)[None, :] - np.arange(n + 1)[:, None]
        mats.append(np.where(count <= max_layers[r], cost, np.inf))

    def value(split: list[int]) -> float:
        bounds = np.concatenate([[0], np.cumsum(split)])
        return max(float(mats[r][bounds[r], bounds[r + 1]]) for r in range(p))

    brute = min(value(s) for s in compositions(n, p))
    split, bottleneck = min_bottleneck_partition(mats)
    assert sum(split) == n and min(split) >= 1 and len(split) == p
    assert bottleneck == pytest.approx(brute, rel=1e-12)
    assert value(split) == pytest.approx(bottleneck, rel=1e-12)


def test_partition_dp_reports_infeasible_as_inf_and_rejects_too_many_stages():
    mats = [np.full((5, 5), np.inf)] * 2
    _, bottleneck = min_bottleneck_partition(mats)
    assert bottleneck == math.inf
    with pytest.raises(ValueError, match="cannot each get"):
        min_bottleneck_partition([np.zeros((3, 3))] * 3)


# ---- (b) optimal_layer_split agrees with simulate -----------------------------------------------


def check_against_simulate(model, cluster, training, split):
    report = simulate(model, cluster, training, split.plan)
    assert report.feasible, report.reasons
    assert report.extra["layers_per_stage"] == split.layers_per_stage
    sim = stage_times(report)
    assert max(sim) == pytest.approx(split.bottleneck_s, rel=1e-9)
    assert sim == pytest.approx(split.stage_times_s, rel=1e-9)
    assert report.memory_per_stage_gb == pytest.approx(split.stage_memory_gb, rel=1e-9)
    return report


def test_llama3_8b_pp3_uneven_split_matches_simulate():
    model = load_model("llama3-8b")  # 32 layers: pp=3 has no even split
    cluster = load_cluster("dgx-a100-80gb", nodes=3)
    training = TrainingSpec(global_batch_size=32, seq_len=2048)
    plan = parse_plan("tp=8,pp=3,mbs=1")
    assert not simulate(model, cluster, training, plan).feasible  # needs layers_per_stage
    split = optimal_layer_split(model, cluster, training, plan)
    assert sum(split.layers_per_stage) == 32 and len(split.layers_per_stage) == 3
    assert split.layers_per_stage[-1] == min(split.layers_per_stage)  # the LM head's stage
    check_against_simulate(model, cluster, training, split)


@pytest.mark.parametrize(("name", "plan_text"), [("llama3-8b", "tp=2,pp=4,mbs=1"),
                                                 ("gpt3-350m", "tp=1,pp=4,mbs=1")])
def test_dp_moves_layers_off_the_lm_head_stage_and_beats_the_even_split(name, plan_text):
    model = load_model(name)
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    training = TrainingSpec(global_batch_size=32, seq_len=2048)
    plan = parse_plan(plan_text)
    even = simulate(model, cluster, training, plan)
    assert even.feasible
    split = optimal_layer_split(model, cluster, training, plan)
    per = model.num_layers // plan.pp
    assert split.layers_per_stage[-1] < per
    assert split.bottleneck_s < max(stage_times(even))
    report = check_against_simulate(model, cluster, training, split)
    assert report.step_time_s <= even.step_time_s
    # The even split given explicitly goes through the same event simulation: still slower.
    explicit = simulate(model, cluster, training,
                        plan.model_copy(update={"layers_per_stage": [per] * plan.pp}))
    assert report.step_time_s <= explicit.step_time_s


@pytest.mark.parametrize("options", [
    {"tp": 2, "cp": 2, "pp": 2},
    {"tp": 4, "pp": 2, "sequence_parallel": True, "tp_comm_overlap": True,
     "recompute": "selective"},
    {"tp": 1, "pp": 4, "recompute": "op", "schedule": "gpipe", "micro_batch_size": 2},
    {"tp": 2, "pp": 4, "zero_stage": 3, "schedule": "zb-h1", "recompute": "full"},
])
def test_stage_times_and_memory_match_simulate_across_plan_options(options):
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch_size=32, seq_len=4096)
    split = optimal_layer_split(model, cluster, training, ParallelPlan(**options))
    check_against_simulate(model, cluster, training, split)


def test_moe_dense_first_layers_split_is_exact_against_simulate_brute_force():
    model = mini_moe()  # 3 dense + 7 MoE layers: per-layer costs differ
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    training = TrainingSpec(global_batch_size=32, seq_len=2048)
    plan = parse_plan("tp=1,pp=4,ep=2,mbs=1")
    split = optimal_layer_split(model, cluster, training, plan)
    check_against_simulate(model, cluster, training, split)
    best = math.inf
    for lps in compositions(model.num_layers, plan.pp):
        rep = simulate(model, cluster, training, plan.model_copy(update={"layers_per_stage": lps}))
        if rep.feasible:
            best = min(best, max(stage_times(rep)))
    assert split.bottleneck_s == pytest.approx(best, rel=1e-9)


def test_mixed_cluster_gives_the_slow_gpu_stage_fewer_layers():
    cluster = cluster_from_dict(MIXED)
    model = load_model("gpt3-6.7b")
    training = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16",
                            flash_attention=False)
    plan = parse_plan("tp=4,pp=4,mbs=1,rc=full")
    split = optimal_layer_split(model, cluster, training, plan)
    assert split.stage_memory_capacity_gb == [80, 80, 32, 32]
    lps = split.layers_per_stage
    assert lps[0] + lps[1] > lps[2] + lps[3]  # A100 stages take more of the model
    report = check_against_simulate(model, cluster, training, split)
    assert report.extra["stage_gpu_types"][3] == ["v100-sxm2-32gb"]
    even = simulate(model, cluster, training, plan)
    assert report.step_time_s < even.step_time_s


# ---- (c) memory cap --------------------------------------------------------------------------


def test_memory_cap_forces_a_slower_split_that_fits():
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-a100-40gb", nodes=1)
    training = TrainingSpec(global_batch_size=32, seq_len=4096)
    plan = parse_plan("tp=2,pp=4,mbs=2")
    fastest = optimal_layer_split(model, with_memory(cluster, 1e4), training, plan)
    assert max(fastest.stage_memory_gb) > 40  # the time-optimal split does not fit ...
    oom = simulate(model, cluster, training, fastest.plan)
    assert not oom.feasible and "out of memory" in oom.reasons[0]
    split = optimal_layer_split(model, cluster, training, plan)
    assert max(split.stage_memory_gb) <= 40  # ... the DP's does, and is slower
    assert split.bottleneck_s > fastest.bottleneck_s
    check_against_simulate(model, cluster, training, split)


def test_memory_cap_exact_against_simulate_brute_force():
    base = load_model("llama3-8b")  # cut to 12 layers: 165 splits over pp=4
    model = ModelSpec(**{**base.model_dump(), "name": "llama-12", "num_layers": 12})
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    training = TrainingSpec(global_batch_size=32, seq_len=4096)
    plan = parse_plan("tp=2,pp=4,mbs=2")
    fastest = optimal_layer_split(model, cluster, training, plan)
    lowest = min(max(simulate(model, cluster, training, plan.model_copy(
        update={"layers_per_stage": lps}), time_if_oom=True).memory_per_stage_gb)
        for lps in compositions(model.num_layers, plan.pp))
    assert max(fastest.stage_memory_gb) - lowest > 1  # room for a cap in between
    tight = with_memory(cluster, (max(fastest.stage_memory_gb) + lowest) / 2)
    split = optimal_layer_split(model, tight, training, plan)
    assert split.bottleneck_s > fastest.bottleneck_s
    best = math.inf
    for lps in compositions(model.num_layers, plan.pp):
        rep = simulate(model, tight, training, plan.model_copy(update={"layers_per_stage": lps}))
        if rep.feasible:
            best = min(best, max(stage_times(rep)))
    assert split.bottleneck_s == pytest.approx(best, rel=1e-9)
    check_against_simulate(model, tight, training, split)


def test_no_split_fits_raises_spec_error_naming_stage_and_shortfall():
    model = load_model("llama3-8b")
    cluster = with_memory(load_cluster("dgx-a100-80gb", nodes=1), 8)
    training = TrainingSpec(global_batch_size=32, seq_len=2048)
    with pytest.raises(SpecError, match=r"stage \d needs .* GiB short"):
        optimal_layer_split(model, cluster, training, parse_plan("tp=2,pp=4,mbs=1"))


def test_interleaved_plans_are_rejected():
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    training = TrainingSpec(global_batch_size=32, seq_len=2048)
    with pytest.raises(ValueError, match="virtual_stages"):
        optimal_layer_split(model, cluster, training,
                            parse_plan("tp=2,pp=4,vpp=2,schedule=interleaved"))


# ---- (2) per-layer recompute knapsack -------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_knapsack_matches_brute_force_over_subsets(seed):
    rng = np.random.default_rng(seed)
    n = 10
    costs = [float(c) for c in rng.uniform(0.1, 1.0, n)]
    savings = [int(s) for s in rng.integers(0, 8, n)]
    need = int(rng.integers(0, sum(savings) + 3))
    best = math.inf
    for mask in range(1 << n):
        chosen = [i for i in range(n) if mask >> i & 1]
        if sum(savings[i] for i in chosen) >= need:
            best = min(best, sum(costs[i] for i in chosen))
    res = min_cost_cover(costs, savings, need)
    if best == math.inf:
        assert res is None
    else:
        chosen, cost = res
        assert sum(savings[i] for i in chosen) >= need
        assert cost == pytest.approx(best, rel=1e-12)
        assert cost == pytest.approx(sum(costs[i] for i in chosen), rel=1e-12)


def recompute_setup():
    model = mini_moe()
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    training = TrainingSpec(global_batch_size=32, seq_len=4096)
    plan = parse_plan("tp=1,pp=2,ep=2,mbs=2")
    return model, cluster, training, plan


def test_recompute_extremes_reproduce_simulate_none_and_full():
    model, cluster, training, plan = recompute_setup()
    none = simulate(model, cluster, training, plan.model_copy(update={"recompute": "none"}))
    full = simulate(model, cluster, training, plan.model_copy(update={"recompute": "full"}))
    free = per_layer_recompute(model, cluster, training, plan, memory_budget_gb=1e6)
    assert free.recompute_layers_per_stage == [0, 0]
    assert free.stage_times_s == pytest.approx(stage_times(none), rel=1e-9)
    assert free.stage_memory_gb == pytest.approx(none.memory_per_stage_gb, rel=1e-9)
    # Per-stage budgets just above each stage's all-recompute memory force every layer to be
    # recomputed (one layer fewer would overshoot).
    tight = per_layer_recompute(model, cluster, training, plan,
                                memory_budget_gb=[g + 1e-3 for g in full.memory_per_stage_gb])
    assert tight.recompute_layers_per_stage == tight.layers_per_stage
    assert tight.stage_times_s == pytest.approx(stage_times(full), rel=1e-9)
    assert tight.stage_memory_gb == pytest.approx(full.memory_per_stage_gb, rel=1e-9)


def test_recompute_budget_between_none_and_full_gives_a_result_in_between():
    model, cluster, training, plan = recompute_setup()
    none = simulate(model, cluster, training, plan.model_copy(update={"recompute": "none"}))
    full = simulate(model, cluster, training, plan.model_copy(update={"recompute": "full"}))
    lo, hi = max(full.memory_per_stage_gb), max(none.memory_per_stage_gb)
    assert hi - lo > 2
    budget = (lo + hi) / 2
    choice = per_layer_recompute(model, cluster, training, plan, memory_budget_gb=budget)
    assert choice.unit_bytes == RECOMPUTE_UNIT_BYTES
    assert max(choice.stage_memory_gb) <= budget
    assert 0 < sum(choice.recompute_layers_per_stage) < model.num_layers
    assert max(stage_times(none)) < choice.bottleneck_s < max(stage_times(full))
    for r in range(plan.pp):
        assert full.memory_per_stage_gb[r] - 1e-9 <= choice.stage_memory_gb[r]
        assert stage_times(none)[r] - 1e-12 <= choice.stage_times_s[r]
        assert choice.stage_times_s[r] <= stage_times(full)[r] + 1e-12


def test_recompute_matches_exact_brute_force_up_to_the_memory_quantum():
    """Brute force over every (dense, MoE) recompute count per stage, in exact bytes.

    Per-layer extra time comes from simulate (a split with an all-dense and an all-MoE
    stage, none vs full); per-layer memory from the simulator's activation terms. The
    knapsack rounds conservatively, so its answer is never better than the exact optimum
    under the budget and never worse than the exact optimum under a budget one quantum per
    layer tighter.
    """
    model, cluster, training, plan = recompute_setup()
    plan = plan.model_copy(update={"layers_per_stage": [5, 5]})  # stage 0: 3 dense + 2 MoE
    none_plan = plan.model_copy(update={"recompute": "none"})
    full_plan = plan.model_copy(update={"recompute": "full"})
    none = simulate(model, cluster, training, none_plan)
    full = simulate(model, cluster, training, full_plan)
    t_none, m_none, m_full = stage_times(none), none.memory_per_stage_gb, full.memory_per_stage_gb

    pure = {"layers_per_stage": [3, 7]}  # stage 0 all dense, stage 1 all MoE
    a = stage_times(simulate(model, cluster, training, none_plan.model_copy(update=pure)))
    b = stage_times(simulate(model, cluster, training, full_plan.model_copy(update=pure)))
    dt_dense, dt_moe = (b[0] - a[0]) / 3, (b[1] - a[1]) / 7

    keep = (1 + ALLOCATOR_FRAGMENTATION) / GIB
    la_none = layer_activations(model, training, none_plan)
    la_full = layer_activations(model, training, full_plan)
    save_dense = keep * (la_none.dense - la_full.dense)
    save_moe = keep * (la_none.moe - la_full.moe)
    working = keep * la_full.working
    m = training.global_batch_size // (none.extra["dp"] * plan.micro_batch_size)
    inflight = [inflight_microbatches(plan.schedule, plan.pp, m, r) for r in range(plan.pp)]
    unit = RECOMPUTE_UNIT_BYTES / GIB
    shapes = [(3, 2), (0, 5)]  # (dense, MoE) layers per stage

    def mem(r: int, kd: int, km: int) -> float:
        if kd + km == 0:
            return m_none[r]
        return m_none[r] - inflight[r] * (kd * save_dense + km * save_moe) + working

    for r, (nd, nm) in enumerate(shapes):  # the model reproduces simulate's full recompute
        assert mem(r, nd, nm) == pytest.approx(m_full[r], rel=1e-9)

    for budget in np.linspace(max(m_full) + 0.01, max(m_none) - 0.01, 6):
        choice = per_layer_recompute(model, cluster, training, plan, memory_budget_gb=budget)
        assert choice.layers_per_stage == [5, 5]
        for r, (nd, nm) in enumerate(shapes):
            loose = strict = math.inf
            for kd in range(nd + 1):
                for km in range(nm + 1):
                    t = t_none[r] + kd * dt_dense + km * dt_moe
                    if mem(r, kd, km) <= budget:
                        loose = min(loose, t)
                    if mem(r, kd, km) <= budget - (nd + nm) * unit:
                        strict = min(strict, t)
            picked = choice.recompute_layers[r]
            kd = sum(1 for i in picked if i < model.first_dense_layers)
            km = len(picked) - kd
            assert choice.stage_memory_gb[r] == pytest.approx(mem(r, kd, km), rel=1e-9)
            assert choice.stage_memory_gb[r] <= budget
            assert choice.stage_times_s[r] == pytest.approx(
                t_none[r] + kd * dt_dense + km * dt_moe, rel=1e-9)
            assert loose * (1 - 1e-9) <= choice.stage_times_s[r] <= strict * (1 + 1e-9)


def test_recompute_reports_a_stage_that_cannot_fit():
    model, cluster, training, plan = recompute_setup()
    with pytest.raises(SpecError, match="even with all .* recomputed"):
        per_layer_recompute(model, cluster, training, plan, memory_budget_gb=1.0)


def test_dp_searcher_is_never_slower_than_exhaustive() -> None:
    from paraplan import search

    model, cl = load_model("llama3-8b"), load_cluster("dgx-a100-80gb", nodes=3)
    tr = TrainingSpec(global_batch_size=48, seq_len=4096)
    for fix in ("pp=3", "pp=3,tp=8,rc=full", None):
        ex = search(model, cl, tr, searcher="exhaustive", top=3, fix=fix)
        dp = search(model, cl, tr, searcher="dp", top=3, fix=fix)
        assert dp.searcher == "dp" and dp.reports
        assert dp.best.step_time_s <= ex.best.step_time_s * (1 + 1e-12)
        assert dp.baseline_step_time_s >= dp.best.step_time_s
