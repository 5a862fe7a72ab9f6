"""simulator/volumes.py: exact payload bytes per collective, against hand-worked counts."""

from __future__ import annotations

import pytest

from paraplan import ModelSpec, ParallelPlan, TrainingSpec
from paraplan.simulator.volumes import comm_bytes, rank_params

# GPT-2-style: h=8, 2 heads of 4, ffn 16, vocab 32, 2 layers, learned positions (seq 4).
MODEL = ModelSpec(name="t", num_layers=2, hidden_size=8, num_attention_heads=2,
                  ffn_hidden_size=16, vocab_size=32, position_embedding="learned",
                  max_position_embeddings=4, use_bias=True)
FP32 = TrainingSpec(global_batch_size=4, seq_len=4, precision="fp32", optimizer="sgd")


def test_dp_all_reduces_four_bytes_per_parameter() -> None:
    out = comm_bytes(MODEL, FP32, ParallelPlan(dp=2, micro_batch_size=1), 2)
    assert out["all_reduce"] == 4 * MODEL.num_params
    assert sum(out.values()) == out["all_reduce"]


def test_zero1_pads_to_the_group_size() -> None:
    # 4 ranks: P is padded up to a multiple of 4; all-gather moves the 1/4 shard.
    out = comm_bytes(MODEL, FP32, ParallelPlan(dp=4, zero_stage=1), 4)
    padded = -(-MODEL.num_params // 4) * 4
    assert out["reduce_scatter"] == 4 * padded
    assert out["all_gather"] == 4 * padded // 4
    assert out["all_reduce"] == 0


def test_tp_counts_megatron_all_reduces_by_hand() -> None:
    # tp=2, one micro-batch of b*s = 4 tokens of width 8 (128 bytes in fp32):
    # 2 layers x 4 all-reduces + embedding + LM head = 10; cross-entropy 3 x 4 tokens x 4 B.
    training = TrainingSpec(global_batch_size=1, seq_len=4, precision="fp32")
    out = comm_bytes(MODEL, training, ParallelPlan(tp=2, micro_batch_size=1), 2)
    assert out["all_reduce"] == 10 * 128 + 3 * 4 * 4


def test_sequence_parallel_turns_all_reduces_into_gather_and_scatter() -> None:
    training = TrainingSpec(global_batch_size=1, seq_len=4, precision="fp32")
    out = comm_bytes(MODEL, training, ParallelPlan(tp=2, sequence_parallel=True), 2)
    assert out["reduce_scatter"] == 10 * 128  # full tensors
    assert out["all_gather"] == 10 * 64  # the shard each rank contributes
    replicated = rank_params(MODEL, ParallelPlan(tp=2), [2], 0).tp_replicated
    # norms (4 x 8 per layer), o/fc2 biases (8 + 8 per layer), positions 4 x 8, final norm 16
    assert replicated == 2 * (32 + 16) + 32 + 16
    assert out["all_reduce"] == 3 * 4 * 4 + 4 * replicated


def test_pipeline_sends_each_activation_once_each_way() -> None:
    plan = ParallelPlan(pp=2, micro_batch_size=1)
    first, last = (comm_bytes(MODEL, FP32, plan, 2, rank=r) for r in (0, 1))
    assert first["p2p_send"] == last["p2p_send"] == 4 * 4 * 8 * 4  # m=4 micro-batches


def test_moe_all_to_all_scales_with_capacity_factor() -> None:
    moe = MODEL.model_copy(update={"num_experts": 4, "moe_top_k": 2})
    dropless = comm_bytes(moe, FP32, ParallelPlan(dp=2, ep=2), 2)["all_to_all"]
    padded = comm_bytes(moe, FP32, ParallelPlan(dp=2, ep=2, moe_capacity_factor=2), 2)
    # per MoE layer and micro-batch: 4 x (T k h) x 4 B plus 4 int64 counts; 2 layers, m=2.
    tokens = 4 * 2 * 8 * 4
    assert dropless == 2 * 2 * (4 * tokens + 8 * 4)
    assert padded["all_to_all"] == 2 * 2 * (4 * 2 * tokens + 8 * 4)


@pytest.mark.parametrize("update", [{"cp": 2}, {"zero_stage": 3}, {"recompute": "full"},
                                    {"etp": 2}])
def test_plans_it_cannot_count_are_refused_by_name(update) -> None:
    plan = ParallelPlan(dp=1, **update)
    field = next(iter(update))
    with pytest.raises(ValueError, match=field):
        comm_bytes(MODEL, FP32, plan, 4)
