"""A word embedding tied to the output layer under pipeline parallelism: the two ends of the
pipeline all-reduce their copies' gradients after the backward (Megatron-Core
``finalize_model_grads._allreduce_word_embedding_grads``, DeepSpeed ``ReduceTiedGrads``), and
trainers that cannot keep the copies equal refuse such plans."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, simulate
from paraplan.search.space import SpaceOptions, build_space, evaluate_space
from paraplan.search.space.trainer_filter import trainer_mask
from paraplan.simulator.dp_sync import tied_embedding_sync
from paraplan.specs import load_trainer
from paraplan.specs.trainer import trainer_reasons

TRAIN = TrainingSpec(global_batch_size=64, seq_len=2048, grad_reduce_fp32=True)


def test_tied_embedding_all_reduce_by_hand() -> None:
    """gpt3-2.7b (tied) on two DGX H100 nodes, tp=2 pp=2 dp=4: stage 0 is node 0, stage 1 node
    1, so each of the 8 pairs (rank i, rank 8 + i) crosses nodes through its GPU's own NIC.
    A ring of two: each rank sends and receives the whole buffer once, in two latency
    steps: 2 alpha + S / B, with S = vocab / tp x hidden x 4 bytes (fp32 main gradients).
    The step grows by exactly that (the untied model's last stage holds the same weights),
    reported under pp_comm; pp = 1 and untied models pay nothing."""
    model, cluster = load_model("gpt3-2.7b"), load_cluster("dgx-h100", nodes=2)
    assert model.tie_word_embeddings
    plan = parse_plan("tp=2,pp=2,dp=4,mbs=1,zero=1,sp=1")
    pair = cluster.topology.pair(0, 8)
    nbytes = model.vocab_size / 2 * model.hidden_size * 4
    want = 2 * pair.latency_s + nbytes / (pair.bandwidth_GBps * 1e9)
    got = tied_embedding_sync(cluster.topology, model, TRAIN, plan, span=8)
    assert got == pytest.approx(want, rel=1e-12)
    assert 1e-3 < got < 0.1  # 257 MB per rank at 45 GB/s (one 400 Gb/s NIC): ~5.8 ms

    untied = model.model_copy(update={"tie_word_embeddings": False})
    tied_rep, untied_rep = simulate(model, cluster, TRAIN, plan), simulate(untied, cluster,
                                                                          TRAIN, plan)
    assert tied_rep.step_time_s - untied_rep.step_time_s == pytest.approx(got, rel=1e-9)
    assert tied_rep.time_s["pp_comm"] - untied_rep.time_s["pp_comm"] == \
        pytest.approx(got, rel=1e-9)
    # fp16/bf16 main gradients move half the bytes
    half = TRAIN.model_copy(update={"grad_reduce_fp32": False})
    assert tied_embedding_sync(cluster.topology, model, half, plan, span=8) < got
    flat = parse_plan("tp=2,pp=1,dp=8,mbs=1,zero=1,sp=1")
    assert tied_embedding_sync(cluster.topology, model, TRAIN, flat, span=16) == 0.0
    assert tied_embedding_sync(cluster.topology, untied, TRAIN, plan, span=8) == 0.0


@pytest.mark.parametrize("name,cluster_name,seq,mtp,mbs,count", [
    ("gpt3-13b", "dgx-a100-80gb", 2048, 0, 2, 30),       # tied
    ("deepseek-moe-16b", "dgx-h100", 4096, 1, 1, 15),    # untied, with an MTP module
])
def test_evaluator_prices_the_embedding_all_reduce_as_simulate(name, cluster_name, seq, mtp,
                                                                mbs, count) -> None:
    """The search evaluator's step, pp_comm and peak memory are simulate's on pipelined plans
    of a model whose last stage holds an embedding copy (1F1B and interleaved, any ZeRO)."""
    model = load_model(name)
    if mtp:
        model = model.model_copy(update={"num_mtp_layers": mtp})
    assert model.embedding_on_last_stage
    cluster = load_cluster(cluster_name, nodes=4)
    tr = TrainingSpec(global_batch_size=128, seq_len=seq)
    space = build_space(model, cluster, tr, options=SpaceOptions(max_micro_batch=mbs))
    ev = evaluate_space(space, times_for_oom=True, exact_interleaved=True)
    c = space.cols
    rng = np.random.default_rng(5)
    rows = [i for i in rng.permutation(len(space)).tolist()
            if c["pp"][i] > 1 and not c["uneven"][i]][:count]
    assert len(rows) == count
    for i in rows:
        rep = simulate(model, cluster, tr, space.plan(i), time_if_oom=True)
        assert rep.extra["tied_embedding_s"] > 0
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-6)
        assert ev.time["pp_comm"][i] == pytest.approx(rep.time_s["pp_comm"], rel=1e-6)
        assert ev.peak_gib[i] == pytest.approx(rep.memory_gb["peak"], rel=1e-6)


def test_torchtitan_refuses_pipelining_a_tied_model() -> None:
    """torchtitan raises NotImplementedError for weight tying with pipeline parallelism; the
    plan check and the search's trainer mask say so, and only for tied models with pp > 1."""
    titan, megatron = load_trainer("torchtitan"), load_trainer("megatron-core")
    tied, untied = load_model("gpt3-2.7b"), load_model("llama3-8b")
    piped, flat = parse_plan("tp=2,pp=2,zero=1,sp=1"), parse_plan("tp=2,pp=1,zero=3,sp=1")
    assert any("word embedding" in r for r in trainer_reasons(titan, tied, TRAIN, piped))
    assert not any("word embedding" in r for r in trainer_reasons(titan, tied, TRAIN, flat))
    assert not any("word embedding" in r for r in trainer_reasons(titan, untied, TRAIN, piped))
    assert not any("word embedding" in r for r in trainer_reasons(megatron, tied, TRAIN, piped))
    cluster = load_cluster("dgx-h100", nodes=1)
    space = build_space(tied, cluster, TRAIN, options=SpaceOptions(max_micro_batch=2))
    ok, why = trainer_mask(space.cols, titan, tied, TRAIN)
    assert (space.cols["pp"] > 1).any() and not (ok & (space.cols["pp"] > 1)).any()
    assert any("word embedding" in reason for reason in why)
    ok_m, _ = trainer_mask(space.cols, megatron, tied, TRAIN)
    assert (ok_m & (space.cols["pp"] > 1)).any()


def test_mtp_modules_keep_an_embedding_copy_on_the_last_stage() -> None:
    """Megatron-Core builds the word embedding on the stage that runs the MTP modules
    (``pre_process or mtp_process``) and reduces its gradient with the first stage's even when
    the output layer is untied: DeepSeek-V3 with pp > 1 holds the copy (memory) and pays the
    all-reduce (time), simulate and the evaluator alike."""
    from paraplan.simulator.memory import params_per_stage

    dsv3 = load_model("deepseek-v3")
    assert dsv3.num_mtp_layers and not dsv3.tie_word_embeddings and dsv3.embedding_on_last_stage
    without = dsv3.model_copy(update={"num_mtp_layers": 0})
    assert not without.embedding_on_last_stage
    plan = parse_plan("tp=2,pp=4,ep=8,zero=1,sp=1,mbs=1")
    layers = [16, 15, 15, 15]
    copy = dsv3.vocab_size * dsv3.hidden_size / 2
    with_mtp, _ = params_per_stage(dsv3, plan, layers, 3)
    bare, _ = params_per_stage(without, plan, layers, 3)
    assert with_mtp - bare == pytest.approx(dsv3.mtp_dense_params / 2 + copy)
    cluster = load_cluster("dgx-h100", nodes=32)
    assert tied_embedding_sync(cluster.topology, dsv3, TRAIN, plan, span=64) > 0
    assert tied_embedding_sync(cluster.topology, without, TRAIN, plan, span=64) == 0


def test_simulate_names_the_embedding_all_reduce() -> None:
    from tests.test_cli import run

    args = ("--model", "gpt3-13b", "--cluster", "dgx-a100-80gb", "--nodes", "4",
            "--global-batch", "128", "--seq-len", "2048")
    res = run("simulate", *args, "--plan", "tp=2,pp=4,dp=4,zero=1,sp=1,mbs=1")
    assert res.returncode == 0, res.stderr
    assert "of which embedding all-reduce" in res.stdout
    flat = run("simulate", *args, "--plan", "tp=2,pp=1,dp=16,zero=1,sp=1,mbs=1")
    assert flat.returncode == 0 and "embedding all-reduce" not in flat.stdout
