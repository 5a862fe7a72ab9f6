"""Today's architectures: MLA, fine-grained and interleaved MoE, multi-token prediction, local
attention and sinks; their trainers, exports and hardware presets."""

from __future__ import annotations

import json
import shlex

import pytest

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, simulate
from paraplan.export import export_context, export_text
from paraplan.search import search
from paraplan.simulator.flops import attention_score_flops
from paraplan.simulator.memory import params_per_stage
from paraplan.simulator.step import even_split
from paraplan.specs import ParallelPlan, SpecError
from paraplan.specs.attention import attended_keys
from paraplan.specs.hf_config import model_from_hf_config
from tests.test_model_params import HF


def test_mla_layer_by_hand():
    # DeepSeek-V3 attention (modeling_deepseek_v3.py): q_a 7168x1536 + q_a norm 1536,
    # q_b 1536 x 128*192, kv_a 7168 x (512+64) + kv_a norm 512, kv_b 512 x 128*256,
    # o 128*128 x 7168.
    m = load_model("deepseek-v3")
    by_hand = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
               + 16384 * 7168)
    assert m.attention_params == by_hand == 187_107_328
    att = m.attention
    assert (att.qk_head, att.v_head, att.latent_width) == (192, 128, 1536 + 512 + 64)
    # Score FLOPs: 2*b*s*s*a*(d_qk + d_v), not 4*b*s^2*a*d.
    assert attention_score_flops(m, 1, 4096) == 2.0 * 4096 * 4096 * 128 * (192 + 128)
    # The replicated down projection is not split by TP; the others are.
    splits = [(p.k_in, p.n_out, p.split) for p in att.projections]
    assert splits[0] == (7168, 1536 + 512 + 64, "none")
    assert {s for *_, s in splits[1:]} == {"column", "row"}


def test_moe_layer_placement():
    mav = load_model("llama4-maverick")  # interleave_moe_layer_step 2: layers 1, 3, 5, ...
    assert mav.num_moe_layers == 24 and mav.num_dense_layers == 24
    assert [mav.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    ds = load_model("deepseek-v3")  # first_k_dense_replace 3
    assert [ds.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert ds.moe_layers_before(10) == 7


def test_local_attention_keys():
    m = load_model("gpt-oss-120b")  # 18 of 36 layers: 128-token sliding window
    model_keys, run_keys = attended_keys(m, 4096)
    assert model_keys == pytest.approx((18 * 4096 + 18 * 128) / 36)
    assert run_keys == pytest.approx((18 * 2048 + 18 * (128 - 128 * 128 / 8192)) / 36)
    scout = load_model("llama4-scout")  # chunks of 8192 on 36 of 48 layers
    assert attended_keys(scout, 4096) == attended_keys(load_model("llama4-maverick"), 4096)
    assert attended_keys(scout, 16384)[0] == pytest.approx((12 * 16384 + 36 * 8192) / 48)


def test_mtp_module_sits_on_the_last_stage():
    m = load_model("deepseek-v3")
    assert m.mtp_params == pytest.approx(11.61e9, rel=0.001)  # README_WEIGHTS: 11.5B + eh_proj
    plan = parse_plan("tp=1,pp=4,ep=8,etp=1,mbs=1")
    layers = [16, 15, 15, 15]
    last_dense, last_exp = params_per_stage(m, plan, layers, 3)
    mid_dense, mid_exp = params_per_stage(m, plan, [16, 15, 15, 15], 2)
    assert last_exp - mid_exp == pytest.approx(m.mtp_expert_params / 8)
    # and its own copy of the word embedding (Megatron-Core builds it where mtp_process)
    head = m.lm_head_params + m.mtp_params - m.mtp_expert_params + m.vocab_size * m.hidden_size
    assert last_dense - mid_dense == pytest.approx(head)


def test_hf_import_refuses_layouts_it_cannot_express():
    base = json.loads((HF / "deepseek-v3.json").read_text())
    with pytest.raises(SpecError, match="moe_layer_freq"):
        model_from_hf_config({**base, "moe_layer_freq": 2})
    qwen = json.loads((HF / "qwen3-30b-a3b.json").read_text())
    with pytest.raises(SpecError, match="mlp_only_layers"):
        model_from_hf_config({**qwen, "mlp_only_layers": [5, 7]})
    assert model_from_hf_config({**qwen, "mlp_only_layers": [0, 1]}).first_dense_layers == 2


def test_trainers_refuse_features_their_model_code_lacks():
    tr = TrainingSpec(global_batch_size=64, seq_len=4096)
    sinks = load_model("llama3-8b").model_copy(update={"attention_sinks": True})
    with pytest.raises(SpecError, match="attention_sinks"):
        search(sinks, load_cluster("dgx-h100", nodes=1), tr, trainer="deepspeed")
    with pytest.raises(SpecError, match="mtp"):  # torchtitan's deepseek_v3 has no MTP
        search(load_model("deepseek-v3"), load_cluster("dgx-h100", nodes=32), tr,
               trainer="torchtitan")
    rep = simulate(load_model("llama4-scout"), load_cluster("dgx-h100", nodes=8), tr,
                   parse_plan("tp=8,pp=1,ep=8,etp=1,mbs=1,sp=1"), trainer="megatron-core")
    assert not rep.feasible and any("chunked_attention" in r for r in rep.reasons)


def test_megatron_export_of_deepseek_and_maverick():
    tr = TrainingSpec(global_batch_size=512, seq_len=4096)
    ds = load_model("deepseek-v3")
    cl = load_cluster("gb200-nvl72", nodes=2)
    plan = parse_plan("tp=1,pp=9,ep=16,etp=1,mbs=1").model_copy(
        update={"layers_per_stage": even_split(61, 9)})
    ctx = export_context(ds, tr, plan, cluster=cl)
    text = export_text("megatron", ctx)
    for flag in ("--multi-latent-attention", "--q-lora-rank 1536", "--kv-lora-rank 512",
                 "--qk-head-dim 128", "--qk-pos-emb-head-dim 64", "--v-head-dim 128",
                 "--mtp-num-layers 1", "--moe-shared-expert-intermediate-size 2048",
                 "--moe-router-num-groups 8", "--moe-router-group-topk 4",
                 "--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm"):
        assert flag in text
    assert "--overlap-moe-expert-parallel-comm" not in text  # the profile's default: off
    overlapped = tr.model_copy(update={"moe_dispatcher": "hierarchical",
                                        "moe_a2a_overlap": True})
    with pytest.raises(Exception, match="vpp > 1"):  # Megatron asserts it
        export_text("megatron", export_context(ds, overlapped, plan, cluster=cl))
    flex = export_text("megatron", export_context(
        ds, overlapped, parse_plan("tp=1,pp=1,ep=16,etp=1,mbs=1,zero=1"),
        cluster=load_cluster("dgx-h100", nodes=2)))
    for flag in ("--moe-token-dispatcher-type flex", "--moe-enable-deepep",
                 "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"):
        assert flag in flex
    layout = next(line for line in text.splitlines() if "--pipeline-model-parallel-layout" in line)
    value = shlex.split(layout)[-1]  # quoted: '|' would end the bash array
    assert value.endswith("mL") and value.count("t") == 61
    oss = export_text("megatron", export_context(
        load_model("gpt-oss-120b"), tr, parse_plan("tp=1,pp=1,ep=8,mbs=1,zero=1"),
        cluster=load_cluster("dgx-h100", nodes=2)))
    for flag in ("--quick-geglu", "--glu-linear-offset 1.0", "--activation-func-clamp-value 7",
                 "--softmax-type learnable", "--window-size 127,0"):
        assert flag in oss
    assert "--swiglu" not in oss  # gpt-oss's GLU is clamped quick-GeLU (examples/gptoss)
    mav = load_model("llama4-maverick")
    ctx = export_context(mav, tr, parse_plan("tp=8,pp=2,ep=8,etp=1,mbs=1,sp=1"),
                         cluster=load_cluster("dgx-h100", nodes=2))
    with pytest.raises(Exception, match="chunked"):
        export_text("megatron", ctx)


def test_best_for_deepseek_v3_on_16_nvl72_racks_runs_on_megatron():
    cl = load_cluster("gb200-nvl72", nodes=16)
    assert cl.num_gpus == 1152 and cl.gpus_per_node == 72
    res = search(load_model("deepseek-v3"), cl, TrainingSpec(global_batch_size=8192,
                                                              seq_len=4096),
                 top=3, trainer="megatron-core")
    plan = ParallelPlan.model_validate(res.best.plan)
    assert res.best.feasible and plan.ep > 1
    ctx = export_context(load_model("deepseek-v3"), TrainingSpec(global_batch_size=8192,
                                                                 seq_len=4096),
                         plan, cluster=cl)
    assert "--multi-latent-attention" in export_text("megatron", ctx)


@pytest.mark.parametrize("cluster", ["dgx-h800", "gb200-nvl72", "hgx-b300", "alps-gh200",
                                     "mi325x-oam", "mi355x-oam"])
def test_new_hardware_presets_price_a_plan(cluster):
    cl = load_cluster(cluster, nodes=2)
    rep = simulate(load_model("llama3-8b"), cl, TrainingSpec(global_batch_size=cl.num_gpus,
                                                             seq_len=4096),
                   parse_plan(f"tp=2,pp=1,mbs=1,sp=1,dp={cl.num_gpus // 2}"))
    assert rep.feasible and rep.step_time_s > 0


def test_torchtitan_export_names_its_model_flavor():
    from paraplan.export.torchtitan import flavor_of

    assert flavor_of(load_model("qwen3-235b-a22b")) == ("qwen3", "235B-A22B")
    assert flavor_of(load_model("gpt-oss-120b")) == ("gpt_oss", "120b")
    assert flavor_of(load_model("llama4-maverick")) == ("llama4", "17bx128e_irope")
    assert flavor_of(load_model("llama3-70b")) == ("llama3", "70B")
    assert flavor_of(load_model("mixtral-8x7b")) is None  # not one of torchtitan's models
    # Same layers and width as Llama 3 8B / 70B, another vocabulary, FFN or heads: no flavor.
    for other in ("llama2-7b", "mistral-7b", "llama2-70b", "llama2-13b"):
        assert flavor_of(load_model(other)) is None
    tr = TrainingSpec(global_batch_size=64, seq_len=4096)
    ctx = export_context(load_model("gpt-oss-20b"), tr, parse_plan("tp=1,ep=8,zero=3,mbs=1"),
                         cluster=load_cluster("dgx-h100", nodes=1))
    text = export_text("torchtitan", ctx)
    assert '[model]\nname = "gpt_oss"\nflavor = "20b"' in text


def test_megatron_launch_round_trips_the_moe_facts():
    from paraplan.importers.megatron import read_megatron

    tr = TrainingSpec(global_batch_size=512, seq_len=4096, moe_dispatcher="hierarchical",
                      moe_a2a_overlap=True)
    ctx = export_context(load_model("deepseek-v3"), tr,
                         parse_plan("tp=1,pp=1,ep=16,etp=1,mbs=1,zero=1"),
                         cluster=load_cluster("dgx-h100", nodes=2))
    imported = read_megatron(export_text("megatron", ctx))
    assert imported.training["moe_dispatcher"] == "hierarchical"
    assert imported.training["moe_a2a_overlap"] is True
    assert imported.plan.ep == 16 and imported.plan.moe_capacity_factor is None
    forced = read_megatron("torchrun pretrain_gpt.py --expert-model-parallel-size 8 "
                           "--moe-token-dispatcher-type alltoall "
                           "--moe-router-force-load-balancing --moe-expert-capacity-factor 1.5"
                           " --moe-pad-expert-input-to-capacity --bf16")
    assert forced.training["moe_dispatcher"] == "alltoall"
    assert forced.training["moe_load_imbalance"] == 1.0
    assert forced.plan.moe_capacity_factor == 1.5
