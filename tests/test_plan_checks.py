"""Each legality rule, named for the rule it checks; messages name field, value and a fix."""

from __future__ import annotations

import pytest

from paraplan import TrainingSpec, check_plan, load_cluster, load_model, parse_plan
from paraplan.specs import SpecError
from paraplan.specs.checks import validate_plan


def reasons(model="llama3-70b", cluster="dgx-h100", nodes=4, plan="tp=8,pp=4", gbs=64, seq=4096,
            precision="bf16"):
    return check_plan(load_model(model), load_cluster(cluster, nodes=nodes),
                      TrainingSpec(global_batch_size=gbs, seq_len=seq, precision=precision),
                      parse_plan(plan))


def test_valid_plan_has_no_reasons():
    assert reasons() == []
    assert reasons(model="mixtral-8x7b", plan="tp=2,pp=4,ep=4,sp=1") == []


def test_validation_invalid_world_size():
    (r,) = reasons(plan="tp=8,pp=4,dp=2")
    assert "dp*tp*pp*cp = 2*8*4*1 = 64 does not equal the cluster's 32 GPUs; use dp=1" in r


def test_validation_mp_does_not_divide_gpus():
    (r,) = reasons(plan="tp=8,pp=3", model="gpt3-xl", gbs=48)
    assert "tp*pp*cp = 24 does not divide the cluster's 32 GPUs" in r


def test_tp_must_divide_heads():
    r = reasons(model="llama3-8b", nodes=3, plan="tp=3,pp=1", gbs=48)
    assert any("tp=3 does not divide num_attention_heads=32; use tp in {1, 2, 4, 8}" in x
               for x in r)


def test_tp_must_divide_kv_heads():
    r = reasons(model="llama3-70b", nodes=2, plan="tp=16,pp=1,allow_cross_node_tp=1")
    assert any("tp=16 does not divide num_kv_heads=8" in x for x in r)


def test_tp_within_node():
    r = reasons(model="gpt3-175b", nodes=4, plan="tp=16,pp=2")
    assert any("tp=16 exceeds the 8 GPUs per node" in x for x in r)


def test_layers_vs_pp_times_vpp():
    r = reasons(model="llama3-70b", plan="tp=8,pp=4,vpp=3,schedule=interleaved")
    assert any("pp*virtual_stages = 4*3 = 12 does not divide num_layers=80" in x for x in r)


def test_explicit_layer_split_must_sum():
    r = reasons(plan="tp=8,pp=4,layers=20/20/20/19")
    assert any("layers_per_stage sums to 79 but the model has num_layers=80" in x for x in r)
    assert reasons(plan="tp=8,pp=4,layers=19/21/21/19") == []


def test_interleaving_needs_pp_and_schedule():
    r = reasons(plan="tp=8,pp=1,vpp=2,schedule=interleaved")
    assert any("needs pp > 1" in x for x in r)
    r = reasons(plan="tp=8,pp=4,schedule=interleaved")
    assert any("schedule=interleaved needs virtual_stages >= 2" in x for x in r)


def test_experts_vs_ep():
    r = reasons(model="mixtral-8x7b", plan="tp=2,pp=4,ep=3")
    assert any("ep=3 does not divide num_experts=8; use ep in {1, 2, 4, 8}" in x for x in r)
    r = reasons(model="llama3-8b", plan="tp=8,pp=4,ep=2")
    assert any("ep=2 but llama3-8b has no experts" in x for x in r)


def test_global_batch_vs_dp_times_mbs():
    r = reasons(plan="tp=8,pp=1,mbs=3", gbs=64)
    assert any("global_batch_size=64 is not divisible by micro_batch_size*dp = 3*4 = 12" in x
               and "use micro_batch_size in {1, 2, 4, 8, 16}" in x for x in r)


def test_sequence_vs_2cp():
    r = reasons(plan="tp=8,pp=1,cp=4", seq=4100)
    assert any("cp=4 needs seq_len divisible by 2*cp=8" in x for x in r)


def test_sequence_parallel_needs_tp():
    r = reasons(plan="tp=1,pp=4,sp=1", gbs=64)
    assert any("sequence_parallel=true needs tp > 1" in x for x in r)


def test_precision_supported_by_gpu():
    r = reasons(model="gpt3-xl", cluster="aws-p3.16xlarge", nodes=8, plan="tp=1,pp=1",
                gbs=1024, precision="bf16")
    assert any("precision=bf16 is not supported by v100-sxm2-16gb" in x and "use precision=fp16"
               in x for x in r)


def test_every_violation_is_reported_at_once():
    r = reasons(model="llama3-70b", plan="tp=3,pp=3,sp=1,mbs=5", seq=4097)
    assert len(r) >= 3


def test_validate_plan_raises_spec_error():
    with pytest.raises(SpecError, match="tp=3 does not divide"):
        validate_plan(load_model("llama3-8b"), load_cluster("dgx-h100", nodes=3),
                      TrainingSpec(global_batch_size=48, seq_len=2048), parse_plan("tp=3"))


def test_parse_plan_forms():
    p = parse_plan("tp=8, pp=4, mbs=2, vpp=2, schedule=interleaved, sp, zero=1, rc=selective")
    assert (p.tp, p.pp, p.micro_batch_size, p.virtual_stages, p.zero_stage) == (8, 4, 2, 2, 1)
    assert p.sequence_parallel and p.recompute == "selective"
    assert parse_plan('{"plan": {"tp": 2}}').tp == 2
    with pytest.raises(SpecError, match=r"plan\.recompute='some'"):
        parse_plan("rc=some")
    with pytest.raises(SpecError, match=r"plan\.tpp: unknown key"):
        parse_plan("tpp=2")
    with pytest.raises(SpecError, match="not key=value"):
        parse_plan("tp8")


def test_only_the_embedding_and_loss_chunks_of_an_interleaved_split_may_be_empty():
    """Megatron-Core counts the embedding and the loss as a pipeline layer each
    (account_for_*_in_pipeline_split): Llama 3.1 405B's recipe at pp=16, vpp=8 runs 128 chunks,
    [embedding] + 126 x [1 layer] + [loss]. Its first and last chunk hold no decoder layer;
    a middle chunk, a non-interleaved stage or a whole rank may not be empty."""
    from paraplan import simulate

    model, cl = load_model("llama3-405b"), load_cluster("gb200-nvl72", nodes=4)  # 288 GPUs
    tr = TrainingSpec(global_batch_size=288, seq_len=4096, precision="bf16")
    recipe = [0] + [1] * 126 + [0]
    plan = parse_plan("tp=2,pp=16,vpp=8,schedule=interleaved,sp=1")
    ok = plan.model_copy(update={"layers_per_stage": recipe})
    assert check_plan(model, cl, tr, ok) == []
    report = simulate(model, cl, tr, ok, time_if_oom=True)
    assert report.step_time_s is not None and report.step_time_s > 0
    middle = recipe[:5] + [0, 2] + recipe[7:]
    assert any("empty stage" in r for r in check_plan(
        model, cl, tr, plan.model_copy(update={"layers_per_stage": middle})))
    flat = parse_plan("tp=4,pp=16,sp=1").model_copy(
        update={"layers_per_stage": [0] + [9] * 14 + [0]})
    assert flat.layers_per_stage is not None and sum(flat.layers_per_stage) == 126
    assert any("empty stage" in r for r in check_plan(model, cl, tr, flat))
