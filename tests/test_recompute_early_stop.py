"""What recomputation re-runs, as the trainers' code does it: an early-stopping checkpoint
(PyTorch's non-reentrant checkpoint from torch 2.1) does not re-run the MLP's down projection,
and torchtitan's op-level policy re-runs every second matmul in forward order. By hand, in
simulate and the search evaluator alike, per trainer and against the published tables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, simulate
from paraplan.search.space import SpaceOptions, build_space, evaluate_space, parse_fix
from paraplan.simulator.compute import Device, gemm_time
from paraplan.simulator.layer_terms import layer_times, op_rerun_gemm_time, rerun_skip_time
from paraplan.simulator.selective_ac import op_sac_matmuls
from paraplan.specs import load_trainer
from paraplan.specs.trainer import trainer_training
from paraplan.validate.predict import predict_step_time
from paraplan.validate.published import load_published_throughput

MODEL = load_model("llama3-8b")
TRAIN = TrainingSpec(global_batch_size=16, seq_len=4096, recompute_early_stop=True)


def test_skip_is_the_down_projection_by_hand() -> None:
    dev = Device.of(load_cluster("dgx-h100").node_groups[0].gpu, "bf16")
    plan = parse_plan("tp=2,mbs=2")
    skip = rerun_skip_time(MODEL, TRAIN, plan, dev, moe=False)
    # w2: 2 x 4096 tokens, 14336 / 2 inputs per rank, 4096 outputs.
    assert skip == pytest.approx(gemm_time(dev, 8192, 4096, 14336 / 2)) and skip > 0
    lt = layer_times(MODEL, TRAIN, plan, dev, moe=False)
    assert lt.rerun_skip_s == skip and 0 < skip < lt.gemm_fwd_s / 2
    # Nothing is skipped by a reentrant checkpoint, where dropout's mask is saved after the
    # GEMM, or in an MoE block (the combine saves the expert outputs).
    assert rerun_skip_time(MODEL, TRAIN.model_copy(update={"recompute_early_stop": False}),
                           plan, dev, moe=False) == 0.0
    assert rerun_skip_time(MODEL, TRAIN.model_copy(update={"dropout": True}), plan, dev,
                           moe=False) == 0.0
    assert rerun_skip_time(MODEL, TRAIN, plan, dev, moe=True) == 0.0


def test_simulate_re_runs_all_but_the_down_projection() -> None:
    cluster = load_cluster("dgx-h100")
    dev = Device.of(cluster.node_groups[0].gpu, "bf16")
    plan = parse_plan("dp=8,zero=1,mbs=1,rc=full")
    off = TRAIN.model_copy(update={"recompute_early_stop": False})
    on_rep, off_rep = simulate(MODEL, cluster, TRAIN, plan), simulate(MODEL, cluster, off, plan)
    m = on_rep.extra["num_microbatches"]
    skip = gemm_time(dev, 4096, 4096, 14336)
    # at the GPU's sustained pace (the report's slowest_part_pace), every layer, micro-batch
    want = m * MODEL.num_layers * skip / on_rep.extra["slowest_part_pace"]["h100-sxm"]
    assert off_rep.time_s["compute"] - on_rep.time_s["compute"] == pytest.approx(want, rel=1e-9)
    # Without recomputation there is nothing to skip.
    none = plan.model_copy(update={"recompute": "none"})
    assert simulate(MODEL, cluster, TRAIN, none).step_time_s == \
        simulate(MODEL, cluster, off, none).step_time_s


@pytest.mark.parametrize("rc", ["full", "op"])
def test_evaluator_prices_it_as_simulate(rc: str) -> None:
    cluster = load_cluster("dgx-h100")
    space = build_space(MODEL, cluster, TRAIN, fix=parse_fix({"rc": rc}),
                        options=SpaceOptions(max_micro_batch=2))
    ev = evaluate_space(space, times_for_oom=True)
    # Interleaved plans whose layers do not split evenly over the chunks are ranked by an
    # estimate and simulated when they can reach the top; the rest are priced exactly.
    rows = [i for i in range(len(space)) if space.plan(i).virtual_stages == 1]
    assert len(rows) >= 8
    assert max(space.plan(i).tp for i in rows) > 1 and max(space.plan(i).pp for i in rows) > 1
    for i in rows:
        rep = simulate(MODEL, cluster, TRAIN, space.plan(i), time_if_oom=True)
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-9)


@pytest.mark.parametrize("sp", [False, True])
def test_early_stop_skips_the_tp_collective_after_the_mlp(sp: bool) -> None:
    """The all-reduce (SP: the reduce-scatter) after the down projection is not issued again
    by a re-run that stops before that GEMM; the other collectives of the re-run are."""
    from paraplan.simulator.layer import compose_layer_cost, layer_parts

    cluster = load_cluster("dgx-h100")
    dev = Device.of(cluster.node_groups[0].gpu, "bf16")
    plan = parse_plan(f"tp=4,sp={int(sp)},mbs=1")
    on = layer_parts(MODEL, cluster.topology, TRAIN, plan, dev, moe=False)
    off = layer_parts(MODEL, cluster.topology,
                      TRAIN.model_copy(update={"recompute_early_stop": False}), plan, dev,
                      moe=False)
    assert on.tp_s == off.tp_s > 0 and off.tp_rerun_skip_s == 0.0
    assert on.tp_rerun_skip_s == pytest.approx(0.5 * on.tp_s if sp else on.tp_s)
    none = compose_layer_cost(on, "none")
    assert compose_layer_cost(on, "full").tp == pytest.approx(
        none.tp + 2 * on.tp_s - on.tp_rerun_skip_s)
    assert compose_layer_cost(off, "full").tp == pytest.approx(none.tp + 2 * off.tp_s)


def test_hardware_flops_leave_out_the_down_projection() -> None:
    from paraplan.simulator.flops import hardware_flops_per_step

    whole = hardware_flops_per_step(MODEL, 16, 4096, "full")
    early = hardware_flops_per_step(MODEL, 16, 4096, "full", skip_down_proj=True)
    assert whole - early == pytest.approx(32 * 2.0 * 16 * 4096 * 4096 * 14336)
    cluster = load_cluster("dgx-h100")
    plan = parse_plan("dp=8,zero=1,mbs=1,rc=full")
    rep = simulate(MODEL, cluster, TRAIN, plan)
    assert rep.hfu == pytest.approx(early / rep.step_time_s / 8
                                    / cluster.node_groups[0].gpu.peak_flops("bf16"))


def test_trainer_facts() -> None:
    # llm-foundry v0.3.0 on torch 2.1 (the MPT tables' 2023-10 sweep): non-reentrant.
    assert load_trainer("llm-foundry").runs.recompute_early_stop
    # Megatron's and DeepSpeed's own reentrant checkpointing re-run the whole layer;
    # torchtitan passes early_stop=False since 2025-08-29 (#1580; v0.2.2 is the profile).
    for name in ("megatron-core", "megatron-lm-2021", "deepspeed", "torchtitan"):
        assert not load_trainer(name).runs.recompute_early_stop, name
    # Its eager fp8 runs use Transformer Engine's linears, custom autograd Functions that
    # save after their GEMM: the re-run cannot stop before the down projection there.
    foundry = load_trainer("llm-foundry")
    assert trainer_training(foundry, TrainingSpec(global_batch_size=8, seq_len=2048)
                            ).recompute_early_stop
    assert not trainer_training(foundry, TrainingSpec(global_batch_size=8, seq_len=2048,
                                                      precision="fp8")).recompute_early_stop
    # Compiled blocks re-run only what the backward needs: torchtitan compiles its fp8 runs.
    titan = load_trainer("torchtitan")
    assert not trainer_training(titan, TrainingSpec(global_batch_size=8, seq_len=2048)
                                ).recompute_early_stop
    assert trainer_training(titan, TrainingSpec(global_batch_size=8, seq_len=2048,
                                                precision="fp8")).recompute_early_stop


def test_mpt_tables_by_software() -> None:
    """MosaicML's A100 40GB table ran torch 1.13 (whole blocks re-run); the A100 80GB table's
    October 2023 re-run ran torch 2.1 (early stop). Its recomputing MPT-7b rows then land
    within 4% of the published throughput (they were 5-11% too slow with the whole forward
    re-run), while its non-recomputing 2,048-token row was already within 1%."""
    cases = {c.index: c for c in load_published_throughput()
             if c.source_id == "mosaicml_llmfoundry_mpt" and c.model_name == "MPT-7b"}
    a80 = [c for c in cases.values() if c.cluster.node_groups[0].gpu.name == "a100-sxm-80gb"]
    a40 = [c for c in cases.values() if c.cluster.node_groups[0].gpu.name == "a100-sxm-40gb"]
    assert a80 and a40
    assert all(c.training.recompute_early_stop for c in a80)
    assert not any(c.training.recompute_early_stop for c in a40)
    rc = [c for c in a80 if c.plan.recompute == "full"]
    assert len(rc) == 6
    for c in rc:
        pred, _, ok = predict_step_time(c)
        assert ok and abs(pred / c.measured_step_time_s - 1) < 0.04, c.index
        whole = c.training.model_copy(update={"recompute_early_stop": False})
        rep = simulate(c.model, c.cluster, whole, c.plan, time_if_oom=True)
        assert rep.step_time_s / c.measured_step_time_s - 1 > 0.04, c.index


def test_op_level_checkpointing_re_runs_every_second_matmul_by_hand() -> None:
    """torchtitan's op-level policy keeps the odd-numbered matmul outputs of a block in
    forward order (wq, wk, wv, wo, w1, w3, w2) and re-runs wk, wo and w3."""
    dev = Device.of(load_cluster("dgx-h100").node_groups[0].gpu, "bf16")
    plan = parse_plan("tp=2,mbs=1,rc=op")
    calls = op_sac_matmuls(MODEL, plan, moe=False)
    assert [c[2] for c in calls] == [True, False, True, False, True, False, True]
    assert [c[3] for c in calls] == [False, False, False, True, False, False, True]
    tok = 4096
    want = (gemm_time(dev, tok, 1024 / 2, 4096) + gemm_time(dev, tok, 4096, 4096 / 2)
            + gemm_time(dev, tok, 14336 / 2, 4096))
    assert op_rerun_gemm_time(MODEL, TRAIN, plan, dev, moe=False) == pytest.approx(want)
    lt = layer_times(MODEL, TRAIN, plan, dev, moe=False)
    assert lt.op_rerun_gemm_s == pytest.approx(want) and want < 0.45 * lt.gemm_fwd_s
    # Under sequence parallelism the row-parallel matmuls write full-width partial sums
    # and the two reduce-scatter outputs are kept too: 4096 (input) / 4 + 4096 (attention
    # output) / 4 + q 1024 + v 256 + w1 3584 + w2 4096 + 2 x 4096 / 4 = 13,056 elements.
    from paraplan.simulator.memory import op_checkpoint_elements
    sp_plan = parse_plan("tp=4,sp=1,mbs=1,rc=op")
    assert op_checkpoint_elements(MODEL, TRAIN, sp_plan, moe=False) == pytest.approx(13056)
    # Biased linears run addmm, which the policy does not count: the half rule.
    assert op_sac_matmuls(load_model("gpt3-xl"), plan, moe=False) is None
    # MoE blocks and MLA: the order is not known, half of the GEMMs (shared and routed).
    assert op_sac_matmuls(MODEL, plan, moe=True) is None
    assert op_sac_matmuls(load_model("deepseek-v3"), plan, moe=False) is None
    moe = load_model("mixtral-8x7b")
    mt = layer_times(moe, TRAIN, plan, dev, moe=True)
    assert mt.op_rerun_gemm_s == pytest.approx(0.5 * mt.gemm_fwd_s)


def test_torchtitan_checkpointing_modes_agree_with_its_own_rows() -> None:
    """torchtitan's Llama 2 13B rows on 64 A100s (the same run without checkpointing, with
    every other layer checkpointed and with op-level SAC, 2024): the model's error is within
    1.5 points across the three, as the three modes' costs are priced from the code."""
    cases = [c for c in load_published_throughput()
             if c.source_id == "torchtitan" and c.model_name == "Llama2-13B"]
    errors = {}
    for c in cases:
        pred, _, ok = predict_step_time(c)
        assert ok
        errors[c.plan.recompute] = pred / c.measured_step_time_s - 1
    assert set(errors) == {"none", "layer", "op"}
    assert max(errors.values()) - min(errors.values()) < 0.015, errors


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), sp=st.booleans(), mbs=st.sampled_from([1, 2]),
       pp=st.sampled_from([1, 2]),
       rc=st.sampled_from(["none", "selective", "op", "full", "layer"]))
def test_early_stop_never_slows_a_plan_and_only_moves_whole_layer_recompute(
        tp: int, sp: bool, mbs: int, pp: int, rc: str) -> None:
    cluster = load_cluster("dgx-h100")
    plan = parse_plan(f"tp={tp},sp={int(sp and tp > 1)},mbs={mbs},pp={pp},rc={rc}")
    off = TRAIN.model_copy(update={"recompute_early_stop": False})
    on_rep = simulate(MODEL, cluster, TRAIN, plan, time_if_oom=True)
    off_rep = simulate(MODEL, cluster, off, plan, time_if_oom=True)
    if rc in ("full", "layer"):
        assert on_rep.step_time_s < off_rep.step_time_s
        assert on_rep.hfu is not None and off_rep.hfu is not None
    else:
        assert on_rep.step_time_s == off_rep.step_time_s
