"""fp8 training runs the transformer blocks' sequence-parallel all-gathers in fp8 where the
trainer quantizes before it gathers (Transformer Engine; torchao's Float8 TP plans): by hand,
in simulate and the search evaluator alike, per trainer and per dated torchtitan row."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, simulate
from paraplan.search.space import SpaceOptions, build_space, evaluate_space, parse_fix
from paraplan.simulator import collectives as coll
from paraplan.simulator.compute import Device
from paraplan.simulator.layer import layer_parts, shared_parts
from paraplan.simulator.volumes import comm_bytes
from paraplan.specs import load_trainer
from paraplan.specs.trainer import trainer_training

MODEL = load_model("llama3-8b")
FP8 = TrainingSpec(global_batch_size=16, seq_len=4096, precision="fp8", fp8_tp_gather=True)
PLAN = parse_plan("tp=8,sp=1,mbs=1")


def _pair(cluster, nbytes_gather: float, nbytes_scatter: float) -> float:
    group = tuple(range(8))
    return (coll.group_collective(cluster.topology, group, "all_gather", nbytes_gather)
            + coll.group_collective(cluster.topology, group, "reduce_scatter", nbytes_scatter))


def test_the_gather_carries_one_byte_per_element_by_hand() -> None:
    cluster = load_cluster("dgx-h100")
    dev = Device.of_training(cluster.node_groups[0].gpu, FP8)
    act = 1 * 4096 * MODEL.hidden_size * 2  # bf16 activations of one micro-batch
    assert FP8.tp_gather_bytes == 1 and FP8.compute_bytes == 2
    quant = shared_parts(MODEL, cluster.topology, FP8, PLAN, dev, moe=False)
    whole = shared_parts(MODEL, cluster.topology, FP8.model_copy(
        update={"fp8_tp_gather": False}), PLAN, dev, moe=False)
    assert quant.tp_s == pytest.approx(_pair(cluster, act / 2, act))
    assert whole.tp_s == pytest.approx(_pair(cluster, act, act))
    assert whole.tp_scatter_share == 0.5 < quant.tp_scatter_share
    # An MoE block's own half gathers 16-bit tokens in its dispatcher.
    moe = shared_parts(MODEL, cluster.topology, FP8, PLAN, dev, moe=True)
    group = tuple(range(8))
    gather = 0.5 * (coll.group_collective(cluster.topology, group, "all_gather", act / 2)
                    + coll.group_collective(cluster.topology, group, "all_gather", act))
    assert moe.tp_s == pytest.approx(
        gather + coll.group_collective(cluster.topology, group, "reduce_scatter", act))
    # Without sequence parallelism TP all-reduces in 16 bits, fp8 or not.
    no_sp = parse_plan("tp=8,sp=0,mbs=1")
    assert shared_parts(MODEL, cluster.topology, FP8, no_sp, dev, moe=False).tp_s == \
        shared_parts(MODEL, cluster.topology, FP8.model_copy(update={"fp8_tp_gather": False}),
                     no_sp, dev, moe=False).tp_s
    # 16-bit runs ignore the flag; block scaling gathers one scale byte per 32 elements.
    assert FP8.model_copy(update={"precision": "bf16"}).tp_gather_bytes == 2
    assert FP8.model_copy(update={"fp8_scaling": "block"}).tp_gather_bytes == 1 + 1 / 32


def test_an_early_stopping_re_run_skips_the_whole_reduce_scatter() -> None:
    """The collective after the down projection is the 16-bit reduce-scatter, more than half
    of an fp8-gathering pair."""
    cluster = load_cluster("dgx-h100")
    train = FP8.model_copy(update={"recompute_early_stop": True, "kernels": "fused"})
    dev = Device.of_training(cluster.node_groups[0].gpu, train)
    plan = PLAN.model_copy(update={"recompute": "full"})
    parts = layer_parts(MODEL, cluster.topology, train, plan, dev, moe=False)
    shared = shared_parts(MODEL, cluster.topology, train, plan, dev, moe=False)
    assert parts.tp_rerun_skip_s == pytest.approx(shared.tp_scatter_share * parts.tp_s)
    assert parts.tp_rerun_skip_s > 0.5 * parts.tp_s


def test_an_op_level_re_run_issues_the_two_fp8_gathers_again() -> None:
    """torchtitan's op-level SAC re-runs the all-gathers in front of attention and the MLP
    (fp8 ones under Float8 TP), not the saved reduce-scatter."""
    from paraplan.simulator.layer import compose_layer_cost

    cluster = load_cluster("dgx-h100")
    dev = Device.of_training(cluster.node_groups[0].gpu, FP8)
    plan = PLAN.model_copy(update={"recompute": "op"})
    for training in (FP8, FP8.model_copy(update={"fp8_tp_gather": False})):
        parts = layer_parts(MODEL, cluster.topology, training, plan, dev, moe=False)
        shared = shared_parts(MODEL, cluster.topology, training, plan, dev, moe=False)
        gathers = 2 * (1 - shared.tp_scatter_share) * parts.tp_s
        assert parts.tp_op_rerun_s == pytest.approx(gathers)
        assert compose_layer_cost(parts, "op").tp == pytest.approx(
            compose_layer_cost(parts, "none").tp + gathers)
    # 16-bit gathers: the pair's traffic; without SP the all-reduce in front of the MLP.
    assert parts.tp_op_rerun_s == pytest.approx(parts.tp_s)
    no_sp = layer_parts(MODEL, cluster.topology, FP8, parse_plan("tp=8,sp=0,mbs=1,rc=op"),
                        dev, moe=False)
    assert no_sp.tp_op_rerun_s == pytest.approx(no_sp.tp_s)


@pytest.mark.parametrize(("name", "rc"), [("llama3-8b", "full"), ("llama3-8b", "op"),
                                          ("mixtral-8x7b", "full")])
def test_simulate_and_the_evaluator_agree(name: str, rc: str) -> None:
    """Dense and MoE layers (the MoE keys average their two gathers), whole-layer re-runs
    that stop early (the reduce-scatter's share) and op-level re-runs (the two gathers)."""
    model = load_model(name)
    cluster = load_cluster("dgx-h100", nodes=2)
    training = FP8.model_copy(update={"recompute_early_stop": True, "kernels": "fused"})
    plan = PLAN.model_copy(update={"recompute": rc})
    with_fp8 = simulate(model, cluster, training, plan, time_if_oom=True)
    bf16_gathers = simulate(model, cluster, training.model_copy(
        update={"fp8_tp_gather": False}), plan, time_if_oom=True)
    assert 0 < with_fp8.time_s["tp_comm"] < bf16_gathers.time_s["tp_comm"]
    space = build_space(model, cluster, training, fix=parse_fix({"sp": 1, "rc": rc}),
                        options=SpaceOptions(max_micro_batch=2))
    ev = evaluate_space(space, times_for_oom=True)
    rows = [i for i in range(len(space)) if space.plan(i).virtual_stages == 1
            and space.plan(i).tp > 1][:40]
    assert len(rows) >= 4
    for i in rows:
        rep = simulate(model, cluster, training, space.plan(i), time_if_oom=True)
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-9)


def test_exact_volumes_count_the_fp8_gathers() -> None:
    plan = parse_plan("tp=8,sp=1,dp=1,mbs=1")
    quant = comm_bytes(MODEL, FP8, plan, 8)
    whole = comm_bytes(MODEL, FP8.model_copy(update={"fp8_tp_gather": False}), plan, 8)
    m = FP8.global_batch_size  # micro-batches of one replica
    shard = 4096 // 8 * MODEL.hidden_size * 2
    # Two regions per layer, gathered forward and backward: half the bytes in fp8; the
    # embedding's and LM head's gathers stay 16-bit; reduce-scatters are unchanged.
    assert whole["all_gather"] - quant["all_gather"] == \
        m * 2 * 2 * MODEL.num_layers * shard / 2
    assert whole["reduce_scatter"] == quant["reduce_scatter"]


def test_trainer_facts() -> None:
    bf16 = TrainingSpec(global_batch_size=8, seq_len=2048)
    fp8 = bf16.model_copy(update={"precision": "fp8"})
    core = load_trainer("megatron-core")
    assert core.runs.fp8_tp_gather
    assert trainer_training(core, fp8).fp8_tp_gather
    assert not trainer_training(core, bf16).fp8_tp_gather
    # torchtitan v0.2.2 looks for a converter named 'float8', renamed by #1701 (2025-09-26).
    assert not trainer_training(load_trainer("torchtitan"), fp8).fp8_tp_gather


def test_dated_torchtitan_rows() -> None:
    """The 2024-12 and 2025-06 fp8 TP rows ran torchao's Float8 TP plans (before #1701)."""
    from paraplan.validate.published import load_published_throughput

    cases = {c.index: c for c in load_published_throughput()}
    for index in (41, 42, 51, 52, 55, 56):
        case = cases[index]
        assert case.training.precision == "fp8" and case.plan.sequence_parallel, index
        assert case.training.fp8_tp_gather, index
    bf16 = cases[49]
    assert bf16.training.precision == "bf16" and bf16.training.tp_gather_bytes == 2


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), sp=st.booleans(), mbs=st.sampled_from([1, 2]),
       pp=st.sampled_from([1, 2]), moe=st.booleans(),
       rc=st.sampled_from(["none", "selective", "full"]))
def test_fp8_gathers_never_slow_a_plan_and_touch_only_fp8_sp(
        tp: int, sp: bool, mbs: int, pp: int, moe: bool, rc: str) -> None:
    model = load_model("mixtral-8x7b") if moe else MODEL
    cluster = load_cluster("dgx-h100", nodes=2)
    ep = ",ep=2" if moe else ""
    plan = parse_plan(f"tp={tp},sp={int(sp and tp > 1)},mbs={mbs},pp={pp},rc={rc}{ep}")
    off = FP8.model_copy(update={"fp8_tp_gather": False})
    on_rep = simulate(model, cluster, FP8, plan, time_if_oom=True)
    off_rep = simulate(model, cluster, off, plan, time_if_oom=True)
    assume(on_rep.step_time_s is not None)  # a legal plan (tp x ep within the cluster, ...)
    if plan.sequence_parallel:
        assert on_rep.step_time_s < off_rep.step_time_s
        assert on_rep.time_s["tp_comm"] <= off_rep.time_s["tp_comm"]
    else:
        assert on_rep.step_time_s == off_rep.step_time_s
    bf16 = FP8.model_copy(update={"precision": "bf16"})
    assert simulate(model, cluster, bf16, plan, time_if_oom=True).step_time_s == simulate(
        model, cluster, bf16.model_copy(update={"fp8_tp_gather": False}), plan,
        time_if_oom=True).step_time_s


@pytest.mark.parametrize(("converter", "recipe", "gathers"), [
    ("quantize.linear.float8", "tensorwise", False), ("float8", "tensorwise", True),
    ("float8", "rowwise", False)])
def test_the_torchtitan_import_reads_which_converter_turns_fp8_tp_on(
        tmp_path, converter: str, recipe: str, gathers: bool) -> None:
    """parallelize.py (v0.2.2 L77-86) turns the Float8 TP plan on for a converter named
    'float8' with tensorwise scaling only."""
    from paraplan.importers import read_trainer_config

    text = (f'[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["{converter}"]\n'
            '[training]\nlocal_batch_size = 1\nseq_len = 8192\nglobal_batch_size = 64\n'
            '[parallelism]\ntensor_parallel_degree = 8\ndata_parallel_shard_degree = 8\n'
            f'[quantize.linear.float8]\nrecipe_name = "{recipe}"\n')
    path = tmp_path / "job.toml"
    path.write_text(text)
    imported = read_trainer_config(path, text)
    assert imported is not None and imported.training["precision"] == "fp8"
    assert imported.training["fp8_tp_gather"] is gathers
