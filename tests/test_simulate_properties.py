"""Property tests: invariants of simulate() over random plans."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan import ParallelPlan, TrainingSpec, load_cluster, load_model
from paraplan.simulator.step import TIME_KEYS, simulate

CASES = [("llama3-8b", "dgx-h100", 4), ("gpt3-xl", "dgx-a100-80gb", 2),
         ("mixtral-8x7b", "dgx-h100", 4), ("llama2-13b", "pcie-rtx4090x8", 2)]
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

plans = st.builds(
    ParallelPlan,
    tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
    cp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2, 8]),
    sequence_parallel=st.booleans(), zero_stage=st.sampled_from([0, 1, 2, 3]),
    micro_batch_size=st.sampled_from([1, 2]),
    schedule=st.sampled_from(["gpipe", "1f1b", "zb-h1"]),
    recompute=st.sampled_from(["none", "selective", "op", "full", "layer"]),
)


@PROPS
@given(plans, st.sampled_from(CASES), st.sampled_from([64, 256]),
       st.sampled_from([2048, 4096]))
def test_reports_are_consistent(plan, case, gbs, seq):
    name, cluster, nodes = case
    rep = simulate(load_model(name), load_cluster(cluster, nodes=nodes),
                   TrainingSpec(global_batch_size=gbs, seq_len=seq,
                                precision="bf16" if "4090" not in cluster else "fp16"),
                   plan, time_if_oom=True)
    if rep.step_time_s is None:
        assert not rep.feasible and rep.reasons
        return
    parts = sum(rep.time_s[k] for k in TIME_KEYS if k != "exposed_comm")
    assert parts == pytest.approx(rep.step_time_s, rel=1e-6)
    assert all(v >= 0 for v in rep.time_s.values())
    assert 0 < rep.mfu <= rep.hfu <= 1.0
    mem = rep.memory_gb
    assert mem["peak"] == pytest.approx(sum(mem[k] for k in ("weights", "grads", "optimizer",
                                                               "activations", "other")))
    assert max(rep.memory_per_stage_gb) == pytest.approx(mem["peak"])
    assert rep.feasible == (mem["peak"] <= rep.extra["memory_capacity_gb"])


@PROPS
@given(plans.filter(lambda p: p.ep == 1 and p.cp == 1), st.sampled_from([0, 1, 2]))
def test_higher_zero_stage_never_needs_more_state_memory(plan, stage):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=4)
    tr = TrainingSpec(global_batch_size=128, seq_len=2048)
    lo = simulate(model, cluster, tr, plan.model_copy(update={"zero_stage": stage}),
                  time_if_oom=True)
    hi = simulate(model, cluster, tr, plan.model_copy(update={"zero_stage": stage + 1}),
                  time_if_oom=True)
    if lo.step_time_s is None:
        return
    for key in ("weights", "grads", "optimizer"):
        assert hi.memory_gb[key] <= lo.memory_gb[key] + 1e-9


@settings(max_examples=80, deadline=None)
@given(plans, st.sampled_from(["llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-20b"]),
       st.sampled_from([1, 2, 3, 8]), st.booleans(), st.sampled_from(["bf16", "fp8"]))
def test_layer_activation_bytes_are_linear_in_the_micro_batch(plan, name, mbs, moe, precision):
    """The search prices a layer's activations at one sequence and scales by the micro-batch
    (``search.space.evaluate._activation_table``): that needs every term to be linear in it,
    reading neither ``micro_batch`` nor the plan's micro-batch size otherwise."""
    from paraplan.simulator.memory import layer_activation_bytes

    model = load_model(name)
    moe = moe and model.is_moe
    tr = TrainingSpec(global_batch_size=64, seq_len=4096, precision=precision,
                      flash_attention=plan.tp != 8)
    one = layer_activation_bytes(model, tr, plan.model_copy(update={"micro_batch_size": 1}), 1,
                                 moe=moe)
    many = layer_activation_bytes(model, tr, plan.model_copy(update={"micro_batch_size": mbs}),
                                  mbs, moe=moe)
    assert many == pytest.approx(mbs * one, rel=1e-12)
