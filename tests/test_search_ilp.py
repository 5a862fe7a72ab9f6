"""paraplan.search.ilp: heterogeneous ILP search vs the slowest-type baseline, brute force and
simulate."""

from __future__ import annotations

import itertools
import math

import pytest

from paraplan import (
    ClusterSpec,
    ParallelPlan,
    SpecError,
    TrainingSpec,
    load_cluster,
    load_model,
    simulate,
)
from paraplan.search.ilp import (
    FORMULATIONS,
    IlpResult,
    ilp_search,
    pipeline_cluster,
    solve_pipeline_ilp,
)
from paraplan.specs.loaders import cluster_from_dict
from tests.search_helpers import compositions, stage_times, with_memory


def node(gpu: str, nodes: int, intra: str, inter: str, nics: int = 1) -> dict:
    return {"gpu": gpu, "gpus_per_node": 8, "num_nodes": nodes, "intra_node_link": intra,
            "inter_node_link": inter, "nics_per_node": nics}


A100 = node("a100-sxm-40gb", 2, "nvlink3", "ib-hdr", 8)
V100 = node("v100-sxm2-16gb", 4, "nvlink2", "eth-100g")
RTX = node("rtx4090", 2, "pcie4", "eth-100g")
FP16 = {"seq_len": 2048, "precision": "fp16"}  # V100s have no bf16








def amp(report) -> tuple[float, float]:
    """(bottleneck, AMP latency with transfers) of a simulated plan, seconds."""
    t = stage_times(report)
    m, p2p = report.extra["num_microbatches"], report.extra["pp_p2p_s"]
    return max(t), (m - 1) * (max(t) + 2 * p2p) + sum(x + 2 * p2p for x in t)


@pytest.fixture(scope="module")
def mixed() -> ClusterSpec:
    """16 A100-40GB (IB) + 32 V100-16GB + 16 RTX 4090 (100 GbE), 64 GPUs."""
    return cluster_from_dict({"name": "a100-v100-4090", "node_groups": [A100, V100, RTX]})


@pytest.fixture(scope="module")
def gpt27(mixed) -> tuple:
    model = load_model("gpt3-2.7b")
    training = TrainingSpec(global_batch_size=512, **FP16)
    calls: list[tuple[int, int]] = []
    # A generous time limit: the search completes in seconds, and a loaded CI machine must not
    # turn "complete" into a wall-clock race (the project's rule: no wall-clock assertions).
    result = ilp_search(model, mixed, training, time_limit_s=600,
                        progress=lambda d, t: calls.append((d, t)))
    return model, training, result, calls


# ---- (a) beats the all-slowest-type baseline -------------------------------------------------


def test_ilp_beats_the_slowest_type_baseline_on_a_three_type_cluster(gpt27, mixed):
    model, training, result, _ = gpt27
    assert isinstance(result, IlpResult)
    best = result.reports[0]
    assert best.feasible and result.baseline_step_time_s is not None
    ratio = result.baseline_step_time_s / best.step_time_s
    print(f"\ngpt3-2.7b on 16xA100+32xV100+16x4090: ILP {best.step_time_s:.3f} s "
          f"({result.formulation}, {result.plans[0].short()}) vs slowest-type baseline "
          f"{result.baseline_step_time_s:.3f} s ({result.baseline_plan.short()}): "
          f"{ratio:.2f}x; {result.plans_evaluated} solves, {result.solve_time_s:.2f} s CBC, "
          f"{result.search_time_s:.2f} s total, {result.pruned}/{result.choices} pruned")
    assert best.step_time_s < result.baseline_step_time_s
    assert ratio == pytest.approx(result.speedup_vs_baseline)
    assert ratio > 1.2
    # The baseline is an even split on the original rank order, as simulate reports it.
    base = simulate(model, mixed, training, result.baseline_plan)
    assert base.step_time_s == pytest.approx(result.baseline_step_time_s, rel=1e-12)
    assert result.baseline_plan.dp * result.baseline_plan.tp * result.baseline_plan.pp == 64


def test_result_reports_formulation_status_gap_and_solver_time(gpt27):
    _, _, result, calls = gpt27
    assert result.formulation in FORMULATIONS
    assert result.formulation == result.candidates[0].formulation
    assert result.solver_status == "optimal" and result.gap == 0.0
    assert result.plans_evaluated == len(result.solves) >= 1
    assert result.solve_time_s == pytest.approx(sum(s.time_s for s in result.solves))
    for s in result.solves:
        assert s.status in ("optimal", "time_limit", "infeasible", "cutoff", "no_solution")
        if s.status == "optimal":
            assert s.gap == 0.0 and s.bound == s.objective
    assert result.complete and result.pruned > 0
    steps = [r.step_time_s for r in result.reports]
    assert steps == sorted(steps)
    assert len(result.reports) == len(result.plans) == len(result.clusters) \
        == len(result.candidates) <= 5
    assert calls[-1] == (result.choices, result.choices)
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(calls))


def test_pipeline_plans_run_on_a_reordered_cluster_with_one_type_per_stage(gpt27, mixed):
    model, training, result, _ = gpt27
    pipes = [c for c in result.candidates if c.formulation == "pipeline"]
    assert pipes
    for cand in pipes:
        plan, cluster, rep = cand.plan, cand.cluster, cand.report
        assert plan.layers_per_stage is not None and sum(plan.layers_per_stage) == 32
        assert cluster.num_gpus == plan.dp * plan.tp * plan.pp * plan.cp
        assert cluster.num_gpus + sum(cand.idle_gpus.values()) == mixed.num_gpus
        assert rep.extra["stage_gpu_types"] == [[g] for g in cand.stage_gpu_types]
        runs = [g for g, _ in itertools.groupby(cand.stage_gpu_types)]
        assert len(runs) == len(set(runs))  # each type one contiguous run of stages
        again = simulate(model, cluster, training, plan)
        assert again.step_time_s == rep.step_time_s
    # The fast, large A100s take more layers than the other types' stages.
    top = pipes[0]
    a100 = [n for n, g in zip(top.plan.layers_per_stage, top.stage_gpu_types, strict=True)
            if g.startswith("a100")]
    other = [n for n, g in zip(top.plan.layers_per_stage, top.stage_gpu_types, strict=True)
             if not g.startswith("a100")]
    assert a100 and min(a100) > max(other)


# ---- (c) ILP stage times and memory agree with simulate --------------------------------------


def check_candidates_against_simulate(result: IlpResult) -> int:
    checked = 0
    for cand in result.candidates:
        if cand.formulation != "pipeline":
            continue
        sim = stage_times(cand.report)
        assert sim == pytest.approx(cand.ilp_stage_times_s, rel=1e-6)
        checked += 1
    return checked


def test_ilp_stage_times_agree_with_simulate(gpt27):
    assert check_candidates_against_simulate(gpt27[2]) >= 1


def test_ilp_stage_times_agree_with_simulate_when_tp_links_differ_by_type(mixed):
    """TP > 1: simulate prices each stage's TP collectives on its own links, as the ILP does."""
    model = load_model("llama2-7b")
    training = TrainingSpec(global_batch_size=256, **FP16)
    result = ilp_search(model, mixed, training, fix={"tp": 2, "pp": 8, "dp": 4})
    assert check_candidates_against_simulate(result) >= 1
    plan = ParallelPlan(tp=4, pp=4, dp=4, micro_batch_size=1, zero_stage=2,
                        sequence_parallel=True)
    sol = solve_pipeline_ilp(model, mixed, training, plan)
    rep = simulate(model, sol.cluster, training, sol.plan)
    assert rep.feasible, rep.reasons
    assert stage_times(rep) == pytest.approx(sol.stage_times_s, rel=1e-6)
    assert rep.memory_per_stage_gb == pytest.approx(sol.stage_memory_gb, rel=1e-9)
    assert rep.extra["pp_p2p_s"] == pytest.approx(sol.p2p_s, rel=1e-9)
    assert max(rep.memory_per_stage_gb) <= 40


# ---- (b) exact against brute force ------------------------------------------------------------


HOMOGENEOUS = [
    # model, cluster preset, nodes, global batch, plan
    ("gpt3-350m", "dgx-a100-40gb", 1, 64, "tp=2,dp=1,pp=4,mbs=2"),
    ("gpt3-760m", "aws-p3.16xlarge", 2, 64, "tp=4,dp=1,pp=4,mbs=1,rc=op"),
    ("llama2-7b", "dgx-a100-80gb", 3, 32, "tp=8,dp=1,pp=3,mbs=1,rc=selective,zero=1"),
]


@pytest.mark.parametrize(("name", "preset", "nodes", "batch", "text"), HOMOGENEOUS)
def test_split_matches_brute_force_on_homogeneous_clusters(name, preset, nodes, batch, text):
    from paraplan.specs.plan import parse_plan

    model = load_model(name)
    plan = parse_plan(text)
    training = TrainingSpec(global_batch_size=batch, seq_len=2048, precision="fp16")
    roomy = with_memory(load_cluster(preset, nodes=nodes), 1e4)
    splits = []
    for lps in compositions(model.num_layers, plan.pp):
        rep = simulate(model, roomy, training, plan.model_copy(update={"layers_per_stage": lps}))
        splits.append((lps, *amp(rep), max(rep.memory_per_stage_gb)))
    fastest = min(splits, key=lambda s: s[2])
    lowest = min(s[3] for s in splits)
    assert fastest[3] - lowest > 0.05  # room for a memory cap that binds
    cap = (fastest[3] + lowest) / 2
    tight = with_memory(load_cluster(preset, nodes=nodes), cap)
    feasible = [s for s in splits if s[3] <= cap]
    bf_bottleneck = min(s[1] for s in feasible)
    bf_objective = min(s[2] for s in feasible)
    sol = solve_pipeline_ilp(model, tight, training, plan)
    assert sol.solve.status == "optimal" and sol.solve.gap == 0.0
    assert abs(sol.bottleneck_s - bf_bottleneck) <= 1e-9 * bf_bottleneck
    assert abs(sol.objective_s - bf_objective) <= 1e-9 * bf_objective
    assert sol.bottleneck_s > fastest[1]  # the cap bound
    rep = simulate(model, sol.cluster, training, sol.plan)
    assert rep.feasible and max(rep.memory_per_stage_gb) <= cap
    assert stage_times(rep) == pytest.approx(sol.stage_times_s, rel=1e-6)


def test_types_and_split_match_brute_force_on_a_two_type_cluster():
    """16 A100-80GB + 16 V100-32GB, tp=2 dp=4 pp=3: every contiguous type order and split."""
    a100 = node("a100-sxm-80gb", 2, "nvlink3", "ib-hdr", 8)
    v100 = node("v100-sxm2-32gb", 2, "nvlink2", "ib-edr", 4)
    cluster = cluster_from_dict({"name": "av", "node_groups": [a100, v100]})
    model = load_model("gpt3-350m")
    training = TrainingSpec(global_batch_size=64, **FP16)
    plan = ParallelPlan(tp=2, dp=4, pp=3, micro_batch_size=1, sequence_parallel=True)
    short = {"a100-sxm-80gb": a100, "v100-sxm2-32gb": v100}
    best = (math.inf, math.inf, None)
    for types in itertools.product(short, repeat=3):
        runs = [g for g, _ in itertools.groupby(types)]
        if len(runs) != len(set(runs)) or max(types.count(g) for g in short) > 2:
            continue
        # Built by hand: whole nodes (one stage = 8 GPUs = one node) in stage order.
        groups = [{**short[g], "num_nodes": types.count(g)} for g in runs]
        real = cluster_from_dict({"name": "real", "node_groups": groups})
        for lps in compositions(model.num_layers, 3):
            rep = simulate(model, real, training,
                           plan.model_copy(update={"layers_per_stage": lps}))
            if rep.feasible:
                bottleneck, objective = amp(rep)
                best = min(best, (objective, bottleneck, (types, lps)))
    sol = solve_pipeline_ilp(model, cluster, training, plan)
    assert abs(sol.objective_s - best[0]) <= 1e-9 * best[0]
    rep = simulate(model, sol.cluster, training, sol.plan)
    assert stage_times(rep) == pytest.approx(sol.stage_times_s, rel=1e-6)
    assert amp(rep)[1] == pytest.approx(best[0], rel=1e-9)
    assert sum(sol.idle_gpus.values()) == 8


# ---- data-heterogeneous formulation ------------------------------------------------------------


def test_data_formulation_wins_for_a_small_model_on_two_fast_types():
    cluster = cluster_from_dict({"name": "h100-a100", "node_groups": [
        node("a100-sxm-80gb", 2, "nvlink3", "ib-hdr", 8),
        node("h100-sxm", 2, "nvlink4", "ib-ndr", 8)]})
    model = load_model("gpt3-760m")
    training = TrainingSpec(global_batch_size=256, seq_len=2048)
    result = ilp_search(model, cluster, training)
    assert result.formulation == "data"
    best = result.candidates[0]
    assert result.reports[0].step_time_s < result.baseline_step_time_s
    assert sum(g.global_batch for g in best.groups) == 256
    h100 = next(g for g in best.groups if g.gpu == "h100-sxm")
    a100 = next(g for g in best.groups if g.gpu == "a100-sxm-80gb")
    assert min(h100.microbatches_per_replica) > max(a100.microbatches_per_replica)
    assert best.report.extra["formulation"] == "data"
    assert best.report.step_time_s >= max(g["compute_end_s"]
                                          for g in best.report.extra["groups"])
    assert best.cluster.num_gpus == sum(g.replicas for g in best.groups) * best.plan.tp \
        * best.plan.pp
    assert best.solve.formulation == "data" and best.solve.status == "optimal"


def test_data_formulation_with_one_type_reproduces_simulate():
    """Pinning dp to one type's replicas: the composed step is that type's simulate."""
    cluster = cluster_from_dict({"name": "h100-a100", "node_groups": [
        node("a100-sxm-80gb", 1, "nvlink3", "ib-hdr", 8),
        node("h100-sxm", 2, "nvlink4", "ib-ndr", 8)]})
    model = load_model("gpt3-350m")
    training = TrainingSpec(global_batch_size=64, seq_len=2048)
    result = ilp_search(model, cluster, training,
                        fix={"tp": 1, "pp": 1, "dp": 16, "micro_batch_size": 4})
    data = [c for c in result.candidates if c.formulation == "data"]
    assert data and [g.gpu for g in data[0].groups] == ["h100-sxm"]
    group = data[0].groups[0]
    assert data[0].report.step_time_s == pytest.approx(group.report.step_time_s, rel=1e-12)


# ---- (d) infeasible ---------------------------------------------------------------------------


def test_model_too_big_for_the_cluster_raises_a_plain_english_spec_error():
    small = cluster_from_dict({"name": "tiny-mixed", "node_groups": [
        node("v100-sxm2-16gb", 1, "nvlink2", "eth-100g"),
        node("rtx4090", 1, "pcie4", "eth-100g")]})
    training = TrainingSpec(global_batch_size=64, **FP16)
    with pytest.raises(SpecError, match=r"no plan fits gpt3-175b on cluster 'tiny-mixed'") \
            as err:
        ilp_search(load_model("gpt3-175b"), small, training)
    text = str(err.value)
    assert "GPU memory" in text and "8x v100-sxm2-16gb" in text and "96 layers" in text
    assert "Traceback" not in text


def test_bad_inputs_raise_spec_errors(mixed):
    model = load_model("gpt3-2.7b")
    training = TrainingSpec(global_batch_size=512, **FP16)
    with pytest.raises(SpecError, match="1f1b"):
        ilp_search(model, mixed, training, fix={"schedule": "interleaved"})
    with pytest.raises(SpecError, match="cannot pin"):
        ilp_search(model, mixed, training, fix={"layers_per_stage": [8, 8, 8, 8]})
    with pytest.raises(SpecError, match="no legal layout"):
        ilp_search(model, mixed, training, fix={"tp": 3})
    with pytest.raises(SpecError, match="precision=bf16 is not supported by v100"):
        ilp_search(model, mixed, TrainingSpec(global_batch_size=512, seq_len=2048))


# ---- (e) fix pins -----------------------------------------------------------------------------


def test_fix_pins_the_structural_choice(mixed):
    model = load_model("gpt3-2.7b")
    training = TrainingSpec(global_batch_size=512, **FP16)
    fix = {"tp": 2, "pp": 8, "recompute": "full", "micro_batch_size": 2, "zero_stage": 1}
    result = ilp_search(model, mixed, training, fix=fix)
    assert result.plans
    for plan, rep in zip(result.plans, result.reports, strict=True):
        assert (plan.tp, plan.pp, plan.recompute, plan.micro_batch_size, plan.zero_stage) == (
            2, 8, "full", 2, 1)
        assert rep.plan["recompute"] == "full"
    assert check_candidates_against_simulate(result) >= 1


def test_fix_aliases_and_dp(mixed):
    model = load_model("gpt3-2.7b")
    training = TrainingSpec(global_batch_size=512, **FP16)
    result = ilp_search(model, mixed, training, fix={"mbs": 1, "dp": 8, "rc": "none"},
                        top=3)
    assert 1 <= len(result.plans) <= 3
    for cand in result.candidates:
        assert cand.plan.micro_batch_size == 1 and cand.plan.recompute == "none"
        assert cand.plan.dp == 8
        if cand.formulation == "data":
            assert sum(g.replicas for g in cand.groups) == 8


# ---- the cluster a plan runs on ---------------------------------------------------------------


def test_pipeline_cluster_lays_stages_on_their_types_with_partial_nodes(mixed):
    real = pipeline_cluster(mixed, ["rtx4090", "a100-sxm-40gb", "a100-sxm-40gb",
                                    "a100-sxm-40gb"], 4)
    assert real.num_gpus == 16
    kinds = [(g.gpu.name, g.gpus_per_node, g.num_nodes) for g in real.node_groups]
    assert kinds == [("rtx4090", 4, 1), ("a100-sxm-40gb", 8, 1), ("a100-sxm-40gb", 4, 1)]
    assert real.node_groups[2].nics_per_node == 4  # its share of the node's 8 NICs
    group = real.topology.group_of_gpu
    assert [real.node_groups[int(group[4 * k])].gpu.name for k in range(4)] == [
        "rtx4090", "a100-sxm-40gb", "a100-sxm-40gb", "a100-sxm-40gb"]
    with pytest.raises(SpecError, match="two separate runs"):
        pipeline_cluster(mixed, ["rtx4090", "a100-sxm-40gb", "rtx4090"], 8)
    with pytest.raises(SpecError, match="the cluster has 16"):
        pipeline_cluster(mixed, ["rtx4090"] * 3, 8)


def test_data_ilp_enumeration_matches_cbc():
    """exact_shares finds CBC's optimum of the data ILP (same T), on random lines."""
    import numpy as np

    from paraplan.search.ilp.cbc import MS, solve_cbc
    from paraplan.search.ilp.data_ilp import data_problem, exact_shares

    rng = np.random.default_rng(7)
    for trial in range(12):
        types = ["a", "b", "c"][: 1 + trial % 3]
        line = {g: (float(rng.uniform(0.01, 0.3)), float(rng.uniform(0.0, 2.0))) for g in types}
        count = {g: int(rng.integers(1, 5)) for g in types}
        M = int(rng.integers(sum(count.values()), 40))
        dp = count[types[0]] if trial % 4 == 3 else None
        found = exact_shares(line, count, M, dp)
        prob, shares_of = data_problem(line, count, M, dp)
        rec = solve_cbc(prob, 10.0, "data", "test")
        assert found is not None and rec.status == "optimal"
        level, shares = found
        assert MS * level == pytest.approx(rec.objective, rel=1e-6, abs=1e-6)
        assert sum(sum(v) for v in shares.values()) == M == sum(map(sum, shares_of().values()))
        for g, ns in shares.items():
            assert len(ns) == count[g] and min(ns) >= 1 and max(ns) - min(ns) <= 1
            assert line[g][0] * max(ns) + line[g][1] <= level * (1 + 1e-9)


def test_ilp_returns_only_what_the_trainer_runs_and_so_does_its_baseline():
    """The pipeline ILP splits layers freely; for nanotron, which splits them evenly, the
    even split stands in (it crashed the search's runnable-plan guard before), and the
    baseline (the best even-split rank-order plan) is one the trainer can run, so it is
    never faster than the best plan (with deepspeed it was: an rc=op, sp plan DeepSpeed
    cannot express)."""
    from paraplan.search import search
    from paraplan.specs.loaders import load_trainer
    from paraplan.specs.trainer import trainer_reasons

    model, tr = load_model("llama3-70b"), TrainingSpec(global_batch_size=256, seq_len=8192)
    for name in ("nanotron", "deepspeed"):
        trainer = load_trainer(name)
        res = search(model, load_cluster("dgx-h100", nodes=8), tr, top=3, searcher="ilp",
                     trainer=trainer)
        for rep in res.reports:
            plan = ParallelPlan(**{k: v for k, v in rep.plan.items()
                                   if k in ParallelPlan.model_fields})
            m = 256 // (plan.resolved_dp(64) * plan.micro_batch_size)
            assert not trainer_reasons(trainer, model, tr, plan, m), (name, rep.plan)
        assert res.best.step_time_s <= res.baseline_step_time_s * (1 + 1e-12)


def test_the_ilp_answer_is_no_slower_than_its_adjacent_stage_swaps():
    """The pipeline ILP's objective is blind to the order of same-type stages' layer counts;
    the searcher re-times adjacent swaps, so none of them beats what it returns."""
    from paraplan.search import search

    m = load_model("gpt3-760m")
    c = load_cluster("aws-p3.16xlarge", nodes=4)
    tr = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")
    best = search(m, c, tr, searcher="ilp", top=1, fix="schedule=1f1b,vpp=1,pp=4").best
    plan = ParallelPlan(**best.plan)
    layers = list(plan.layers_per_stage or [])
    assert len(layers) > 2 and len(set(layers)) > 1  # an uneven split with something to swap
    for k in range(len(layers) - 1):
        swapped = layers.copy()
        swapped[k], swapped[k + 1] = swapped[k + 1], swapped[k]
        rep = simulate(m, c, tr, plan.model_copy(update={"layers_per_stage": swapped}))
        assert not rep.feasible or rep.step_time_s >= best.step_time_s * (1 - 1e-12)
    # The candidate's ILP stage times describe the split it returns, not the ILP's order.
    result = ilp_search(m, c, tr, fix={"schedule": "1f1b", "virtual_stages": 1})
    assert check_candidates_against_simulate(result) >= 1


@pytest.mark.parametrize("sync,zero", [("overlapped", 1), ("after_schedule", 1),
                                       ("cascade", 1), ("overlapped", 2)])
def test_union_dp_time_with_one_type_is_what_simulate_charges(sync, zero):
    """The data formulation's DP rule on one type's own data-parallel ranks is simulate's,
    including pipelined stages whose FSDP gradient chains wait in full
    (``TrainingSpec.pp_grad_sync``) and ZeRO-2's reduce-scatter of every micro-batch's
    gradients (8 micro-batches here)."""
    from paraplan.search.ilp.context import Ctx, _GpuType
    from paraplan.search.ilp.data_ilp import _union_dp_time
    from paraplan.search.ilp.results import DataGroup

    cluster = load_cluster("dgx-h100", nodes=2)
    model = load_model("llama2-7b")
    training = TrainingSpec(global_batch_size=32, seq_len=2048, pp_grad_sync=sync)
    plan = ParallelPlan(tp=2, pp=2, dp=4, zero_stage=zero, micro_batch_size=1)
    rep = simulate(model, cluster, training, plan)
    assert rep.extra["num_microbatches"] == 8
    gpu = cluster.gpu
    ctx = Ctx(model=model, cluster=cluster, training=training, constants={},
              types={gpu.name: _GpuType(gpu.name, gpu, 16, 8, 0)})
    group = DataGroup(gpu.name, 4, [8] * 4, 32, rep, plan, cluster)
    union = tuple(2 * i for i in range(4))  # stage 0's data-parallel ranks (tp fastest)
    assert _union_dp_time(ctx, group, cluster, union) == pytest.approx(
        rep.time_s["dp_comm"], rel=1e-9)


@pytest.mark.parametrize("regather", [False, True])
def test_data_formulation_keeps_zero2_only_where_its_union_rule_prices_it(mixed, regather):
    """The data formulation prices DeepSpeed-style ZeRO-2 (a reduce-scatter per micro-batch)
    across types, but not FSDP's per-layer gathers: where ZeRO-2 re-gathers every micro-batch
    (``TrainingSpec.zero2_regather``, FSDP's SHARD_GRAD_OP) it offers ZeRO-1 only (the default
    zero_stages offer no ZeRO-0)."""
    from paraplan.search.ilp.choices import enumerate_choices
    from paraplan.search.ilp.context import make_context

    training = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16",
                            zero2_regather=regather)
    ctx = make_context(load_model("gpt3-2.7b"), mixed, training, {})
    stages = {ch.zero for ch in enumerate_choices(ctx, {}) if ch.formulation == "data"}
    assert stages == ({1} if regather else {1, 2})
