"""Trainer configs read back into plans: export then import gives the same plan and the same
predicted step time, for all four trainers on interleaved, CP, EP and uneven plans; a user's
own config (written by hand) is read too; bad configs are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, simulate
from paraplan.export import export_context, export_text
from paraplan.importers import ImportError_, read_trainer_config
from paraplan.simulator.step import plan_chunks
from paraplan.specs import load_trainer
from paraplan.specs.trainer import apply_trainer
from tests.test_cli import run

SUFFIX = {"megatron": ".sh", "torchtitan": ".toml", "deepspeed": ".json", "nanotron": ".yaml"}
TRAINER = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
           "nanotron": "nanotron"}
# (format, model, cluster, nodes, global batch, seq, plan)
CASES = [
    ("megatron", "llama3-70b", "dgx-h100", 32, 1024, 8192,
     "tp=8,pp=4,vpp=5,schedule=interleaved,sp=1,rc=full,mbs=1"),
    ("megatron", "mixtral-8x7b", "dgx-h100", 4, 256, 4096, "tp=2,pp=2,ep=8,zero=1,sp=1,mbs=1"),
    ("megatron", "llama2-7b", "dgx-a100-80gb", 3, 96, 4096, "tp=2,pp=4,mbs=1,layers=7/9/9/7"),
    ("megatron", "llama2-7b", "dgx-a100-80gb", 3, 96, 4096, "tp=2,pp=3,mbs=1,layers=10/11/11"),
    ("megatron", "llama3-8b", "dgx-h100", 2, 64, 16384, "tp=2,cp=4,sp=1,zero=3,mbs=1,rc=selective"),
    ("torchtitan", "llama3-70b", "dgx-h100", 32, 1024, 8192,
     "tp=8,pp=4,vpp=5,schedule=interleaved,sp=1,rc=full,mbs=1,zero=1"),
    ("torchtitan", "mixtral-8x7b", "dgx-h100", 4, 256, 4096, "tp=2,ep=8,zero=3,sp=1,mbs=1,rc=op"),
    ("torchtitan", "llama2-7b", "dgx-a100-80gb", 3, 96, 4096,
     "tp=2,sp=1,pp=4,mbs=1,layers=7/9/9/7,zero=1"),
    ("torchtitan", "llama3-8b", "dgx-h100", 2, 64, 16384, "tp=2,cp=4,sp=1,zero=2,mbs=1"),
    ("torchtitan", "llama3-8b", "dgx-h100", 1, 32, 8192, "zero=3,mbs=2,rc=layer"),
    ("deepspeed", "llama3-8b", "dgx-h100", 2, 128, 4096, "tp=2,pp=2,mbs=1,rc=full"),
    ("deepspeed", "llama3-8b", "dgx-h100", 2, 128, 4096, "zero=3,mbs=2"),
    ("nanotron", "llama3-8b", "dgx-h100", 2, 128, 4096, "tp=2,sp=1,pp=2,zero=1,mbs=1,rc=full"),
    ("nanotron", "llama3-8b", "dgx-h100", 2, 64, 16384, "tp=4,mbs=1,schedule=gpipe,pp=2"),
]
STRUCTURE = ("tp", "pp", "cp", "ep", "expert_tp", "sequence_parallel", "zero_stage",
             "micro_batch_size", "schedule", "virtual_stages", "recompute", "tp_comm_overlap",
             "overlap_grad_reduce", "overlap_p2p_comm")


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[6]}" for c in CASES])
def test_export_then_import_gives_the_same_plan_and_step_time(case, tmp_path: Path):
    fmt, model_name, cluster_name, nodes, gbs, seq, text = case
    model, cluster = load_model(model_name), load_cluster(cluster_name, nodes=nodes)
    trainer = load_trainer(TRAINER[fmt])
    training, plan = apply_trainer(trainer, TrainingSpec(global_batch_size=gbs, seq_len=seq),
                                   parse_plan(text))
    ctx = export_context(model, training, plan, cluster=cluster)
    before = simulate(model, cluster, training, plan, trainer=trainer)
    assert before.feasible or before.step_time_s is None, before.reasons
    path = tmp_path / f"run{SUFFIX[fmt]}"
    path.write_text(export_text(fmt, ctx))
    imported = read_trainer_config(path, path.read_text())
    assert imported is not None and imported.trainer == trainer.name
    back = imported.plan
    for field in STRUCTURE:
        assert getattr(back, field) == getattr(ctx.plan, field), (field, text)
    assert back.resolved_dp(cluster.num_gpus) == ctx.dp
    assert plan_chunks(model, back) == plan_chunks(model, ctx.plan)
    again = training.model_copy(update={k: v for k, v in imported.training.items()
                                        if k not in ("global_batch_size", "seq_len")})
    assert imported.training.get("global_batch_size", gbs) == gbs
    assert imported.training.get("seq_len", seq) == seq
    assert imported.training.get("precision", training.precision) == training.precision
    after = simulate(model, cluster, again, back, trainer=trainer)
    assert after.step_time_s == before.step_time_s and after.memory_gb == before.memory_gb


@pytest.mark.parametrize(("scaling", "flag"), [("delayed", None),
                                               ("current", "--fp8-recipe tensorwise"),
                                               ("block", "--fp8-recipe blockwise")])
def test_megatron_fp8_recipe_round_trips(scaling, flag, tmp_path: Path):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=1)
    training, plan = apply_trainer(load_trainer("megatron-core"), TrainingSpec(
        global_batch_size=16, seq_len=4096, precision="fp8", fp8_scaling=scaling),
        parse_plan("tp=2,sp=1,mbs=1"))
    text = export_text("megatron", export_context(model, training, plan, cluster=cluster))
    assert ("--fp8-recipe" not in text) if flag is None else (flag in text)
    path = tmp_path / "run.sh"
    path.write_text(text)
    imported = read_trainer_config(path, text)
    assert imported is not None and imported.training["fp8_scaling"] == scaling


def test_a_users_own_megatron_launch_is_priced_as_written(tmp_path: Path):
    # No overlap flags and Megatron's default dropout: slower than the same plan as exported.
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/bash\nGPT_ARGS=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32)\n"
        "torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
        " --sequence-parallel --micro-batch-size 1 --global-batch-size 128 --seq-length 4096 "
        "--recompute-granularity full --bf16  # a comment\n")
    imported = read_trainer_config(script, script.read_text())
    assert imported is not None and imported.trainer == "megatron-core"
    p = imported.plan
    assert (p.tp, p.pp, p.sequence_parallel, p.recompute) == (2, 2, True, "full")
    assert not p.tp_comm_overlap and not p.overlap_grad_reduce
    assert imported.training["dropout"] and imported.model["num_layers"] == 32
    args = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2", "--global-batch",
            "128", "--seq-len", "4096", "--format", "json")
    own = json.loads(run("simulate", "--plan", str(script), *args).stdout)
    tuned = json.loads(run("simulate", "--plan", "tp=2,pp=2,sp=1,mbs=1,rc=full", *args).stdout)
    assert own["trainer"] == "megatron-core" and own["step_time_s"] > tuned["step_time_s"]
    res = run("simulate", "--plan", str(script), *args[:-2], "--seq-len", "8192")
    assert res.returncode == 2 and "seq_len=4096" in res.stderr
    res = run("simulate", "--plan", str(script), "--model", "llama3-70b", *args[2:])
    assert res.returncode == 2 and "num_layers=32" in res.stderr


def test_the_flex_dispatchers_sms_round_trip_through_a_megatron_launch(tmp_path: Path):
    """``moe_dispatcher_sms`` is exported as core_v0.15.3's --moe-deepep-num-sms and read back
    from it (or from the later --moe-flex-dispatcher-num-sms); a bad count is a clear error."""
    model, cl = load_model("mixtral-8x7b"), load_cluster("dgx-h100", nodes=4)
    tr, plan = apply_trainer(load_trainer("megatron-core"), TrainingSpec(
        global_batch_size=256, seq_len=4096, moe_dispatcher="hierarchical",
        moe_a2a_overlap=True, moe_dispatcher_sms=32), parse_plan("tp=1,pp=1,ep=8,zero=1,mbs=1"))
    assert tr.moe_dispatcher_sms == 32
    text = export_text("megatron", export_context(model, tr, plan, cluster=cl))
    assert "--moe-deepep-num-sms 32" in text
    script = tmp_path / "run.sh"
    script.write_text(text)
    assert read_trainer_config(script, text).training["moe_dispatcher_sms"] == 32
    later = text.replace("--moe-deepep-num-sms 32", "--moe-flex-dispatcher-num-sms 24")
    assert read_trainer_config(script, later).training["moe_dispatcher_sms"] == 24
    for bad in ("many", "\u00b2", "0", "4096"):
        with pytest.raises(ImportError_, match="--moe-deepep-num-sms"):
            read_trainer_config(script, text.replace("--moe-deepep-num-sms 32",
                                                     f"--moe-deepep-num-sms {bad}"))
    default = export_text("megatron", export_context(
        model, tr.model_copy(update={"moe_dispatcher_sms": None}), plan, cluster=cl))
    assert "--moe-deepep-num-sms" not in default


@pytest.mark.parametrize(("name", "text", "needle"), [
    ("a.toml", "[training]\nseq_len = 1\n[parallelism]\ntensor_parallel_degree = true\n",
     "must be an integer"),
    ("a.toml", "[training]\n[parallelism]\n[activation_checkpoint]\nmode = \"selective\"\n"
     "selective_ac_option = \"3\"\n", "n = 2 only"),
    ("a.json", json.dumps({"zero_optimization": {"stage": 7}}), "must be 0-3"),
    ("a.sh", "MEGATRON_ARGS=(--fp8-format hybrid --fp8-recipe custom)",
     "--fp8-recipe 'custom' is not one paraplan models"),
    ("a.yaml", "parallelism: {dp: 1, tp: 1}\ntokens: {micro_batch_size: 1}\n", "has no 'pp'"),
    ("a.sh", "MEGATRON_ARGS=(--tensor-model-parallel-size 2 --use-megatron-fsdp "
     "--data-parallel-sharding-strategy sideways)", "is unknown"),
])
def test_bad_trainer_configs_are_clear_errors(name, text, needle, tmp_path: Path):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ImportError_, match=needle):
        read_trainer_config(path, text)


def test_other_files_are_not_trainer_configs(tmp_path: Path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"tp": 2}))
    assert read_trainer_config(path, path.read_text()) is None


def test_gradient_path_flags_are_read_and_written(tmp_path: Path) -> None:
    """Bucket sizes and accumulation: Megatron's --ddp-bucket-size and
    --no-gradient-accumulation-fusion, DeepSpeed's reduce_bucket_size (5e8 as JSON writes it)
    and grad_accum_dtype (bf16 with ZeRO: the ZeRO optimizer, eager bf16 accumulation and a
    partitioned reduce); each round-trips through the exporters and changes the price."""
    from paraplan.importers.deepspeed import read_deepspeed
    from paraplan.importers.megatron import read_megatron

    text = ("--tensor-model-parallel-size 2 --bf16 --overlap-grad-reduce "
            "--ddp-bucket-size 100000000 --no-gradient-accumulation-fusion")
    meg = read_megatron(text).training
    assert meg["ddp_bucket_size"] == 100_000_000 and meg["grad_accumulation"] == "eager"
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    trainer = load_trainer("megatron-core")
    tr, plan = apply_trainer(trainer, TrainingSpec(global_batch_size=128, seq_len=4096,
                                                   **meg), parse_plan("tp=2,zero=1,mbs=1"))
    back = read_trainer_config(tmp_path / "run.sh", export_text(
        "megatron", export_context(model, tr, plan, cluster=cluster)))
    assert back.training["ddp_bucket_size"] == 100_000_000
    assert back.training["grad_accumulation"] == "eager"
    fused = simulate(model, cluster, tr.model_copy(update={"grad_accumulation": None}), plan,
                     trainer=trainer)
    assert simulate(model, cluster, tr, plan, trainer=trainer).step_time_s > fused.step_time_s

    ds = read_deepspeed({"bf16": {"enabled": True},
                         "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}}).training
    assert ds["ddp_bucket_size"] == 500_000_000
    assert ds["grad_accumulation"] == "eager" and ds["zero1_grad_all_reduce"] is False
    assert "grad_accumulation" not in read_deepspeed(
        {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
         "zero_optimization": {"stage": 1}}).training
    with pytest.raises(ImportError_, match="grad_accum_dtype"):
        read_deepspeed({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "int8"},
                        "zero_optimization": {"stage": 1}})


def test_torchtitan_rotate_method_is_read() -> None:
    from paraplan.importers.torchtitan import read_torchtitan

    base = {"training": {"global_batch_size": 8, "seq_len": 8192},
            "parallelism": {"context_parallel_degree": 4, "data_parallel_shard_degree": 2}}
    assert read_torchtitan(base).training["cp_kv_exchange"] == "allgather"  # its default
    base["parallelism"]["context_parallel_rotate_method"] = "alltoall"
    assert read_torchtitan(base).training["cp_kv_exchange"] == "ring"
    base["parallelism"]["context_parallel_rotate_method"] = "p2p"
    with pytest.raises(ImportError_, match="context_parallel_rotate_method"):
        read_torchtitan(base)


def test_deepspeed_bf16_accumulation_round_trips(tmp_path: Path) -> None:
    """A bf16 ZeRO-1 config without data_types runs DeepSpeed's ZeRO optimizer (bf16
    accumulation, partitioned reduce); exporting what was read writes grad_accum_dtype bf16,
    so reading it back prices the same run. DeepSpeed's dtype spellings are all accepted."""
    from paraplan.importers.deepspeed import read_deepspeed

    imported = read_deepspeed({"bf16": {"enabled": True}, "train_batch_size": 128,
                               "train_micro_batch_size_per_gpu": 1,
                               "zero_optimization": {"stage": 1}})
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    trainer = load_trainer("deepspeed")
    tr, plan = apply_trainer(trainer, TrainingSpec(seq_len=4096, **imported.training),
                             imported.plan)
    before = simulate(model, cluster, tr, plan, trainer=trainer)
    text = export_text("deepspeed", export_context(model, tr, plan, cluster=cluster))
    assert json.loads(text)["data_types"] == {"grad_accum_dtype": "bf16"}
    back = read_trainer_config(tmp_path / "ds.json", text)
    again = tr.model_copy(update=back.training)
    after = simulate(model, cluster, again, back.plan, trainer=trainer)
    assert after.step_time_s == before.step_time_s and after.memory_gb == before.memory_gb
    for spelling, kind in (("float32", None), ("torch.bfloat16", "eager"), ("half", "eager")):
        got = read_deepspeed({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
                              "data_types": {"grad_accum_dtype": spelling}}).training
        assert got.get("grad_accumulation") == kind, spelling
    for bad in ({"grad_accum_dtype": ["fp32"]}, {"grad_accum_dtype": "int8"}):
        with pytest.raises(ImportError_, match="grad_accum_dtype"):
            read_deepspeed({"bf16": {"enabled": True}, "data_types": bad,
                            "zero_optimization": {"stage": 1}})
    with pytest.raises(ImportError_, match="reduce_bucket_size"):
        read_deepspeed({"zero_optimization": {"stage": 1, "reduce_bucket_size": 10**13}})
    from paraplan.importers.torchtitan import read_torchtitan
    with pytest.raises(ImportError_, match="rotate_method"):
        read_torchtitan({"training": {}, "parallelism": {
            "context_parallel_degree": 2, "context_parallel_rotate_method": ["allgather"]}})


def test_megatron_script_with_a_layout_is_valid_bash_and_its_mtp_reads_back(tmp_path: Path):
    """An uneven split is written as --pipeline-model-parallel-layout 'Et..|..|..mL', quoted
    (an unquoted '|' ends the bash array: `bash -n` failed), the MoE layer pattern quoted
    (an unquoted [0,1,..] is a glob); the m (MTP) segment on the last chunk reads back."""
    import shutil
    import subprocess

    model, cluster = load_model("deepseek-v3"), load_cluster("dgx-h800", nodes=32)
    trainer = load_trainer("megatron-core")
    training, plan = apply_trainer(trainer, TrainingSpec(global_batch_size=2048, seq_len=4096),
                                   parse_plan("tp=4,pp=8,cp=2,ep=32,etp=1,sp=1,zero=1,mbs=1,"
                                              "layers=9/7/8/8/8/8/8/5"))
    path = tmp_path / "run.sh"
    path.write_text(export_text("megatron", export_context(model, training, plan,
                                                           cluster=cluster)))
    text = path.read_text()
    assert "--pipeline-model-parallel-layout 'E" in text and "mL'" in text
    assert "--moe-layer-freq '[0,0,0,1," in text
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    back = read_trainer_config(path, text).plan
    assert back.layers_per_stage == [9, 7, 8, 8, 8, 8, 8, 5]
    before = simulate(model, cluster, training, plan, trainer=trainer)
    assert simulate(model, cluster, training, back, trainer=trainer).step_time_s == \
        before.step_time_s


def test_a_plan_without_dp_prices_like_the_same_plan_with_it():
    """dp is derived from the GPUs when left out (imported Megatron and DeepSpeed configs
    leave it out); gradient buckets were sized by the data-parallel group, which also holds
    the context-parallel ranks, so cp > 1 priced differently (3.3916 s against 3.4185 s)."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=8)
    training = TrainingSpec(global_batch_size=256, seq_len=8192)
    a = simulate(model, cluster, training, parse_plan("tp=1,cp=2,zero=1,mbs=1"))
    b = simulate(model, cluster, training, parse_plan("tp=1,cp=2,zero=1,mbs=1,dp=32"))
    assert a.step_time_s == b.step_time_s and a.time_s == b.time_s


def test_moe_run_flags_that_contradict_the_config_are_an_error(tmp_path: Path):
    """A Megatron config states its dispatcher and all-to-all overlap; a --moe-dispatcher
    that says otherwise used to be dropped silently (the file won). Now it is a one-line
    error naming the flag (exit 2); the same value is accepted."""
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100", nodes=4)
    trainer = load_trainer("megatron-core")
    training, plan = apply_trainer(trainer, TrainingSpec(
        global_batch_size=256, seq_len=4096, moe_dispatcher="hierarchical",
        moe_a2a_overlap=True), parse_plan("tp=2,pp=2,vpp=2,ep=8,zero=1,sp=1,mbs=1"))
    path = tmp_path / "run.sh"
    path.write_text(export_text("megatron", export_context(model, training, plan,
                                                           cluster=cluster)))
    base = ("simulate", "-m", "mixtral-8x7b", "-c", "dgx-h100", "-n", "4", "-b", "256",
            "-s", "4096", "--plan", str(path))
    bad = run(*base, "--moe-dispatcher", "alltoall")
    assert bad.returncode == 2 and "--moe-dispatcher" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert run(*base, "--moe-dispatcher", "hierarchical").returncode == 0


@pytest.mark.parametrize("fmt", ["torchtitan", "deepspeed", "nanotron"])
def test_a_config_without_suffix_is_recognised_by_its_content(fmt: str, tmp_path: Path):
    """`best --export torchtitan --out run` writes a file with no suffix; reading it back
    picked the format by suffix and read the TOML as YAML ("not valid YAML at line 7")."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    trainer = load_trainer(TRAINER[fmt])
    text = {"torchtitan": "zero=3,mbs=2", "deepspeed": "zero=3,mbs=2",
            "nanotron": "tp=2,sp=1,pp=2,zero=1,mbs=1,rc=full"}[fmt]
    training, plan = apply_trainer(trainer, TrainingSpec(global_batch_size=128, seq_len=4096),
                                   parse_plan(text))
    path = tmp_path / "run"
    path.write_text(export_text(fmt, export_context(model, training, plan, cluster=cluster)))
    imported = read_trainer_config(path, path.read_text())
    assert imported is not None and imported.trainer == trainer.name
    assert imported.plan.zero_stage == plan.zero_stage and imported.plan.tp == plan.tp
    assert read_trainer_config(tmp_path / "notes", "just some words: here\n") is None


def test_bf16_optimizer_state_and_gradient_reduction_round_trip(tmp_path: Path):
    # Megatron's precision-aware optimizer with bf16 moments is written and read back (and
    # --grad-reduce-in-bf16 read); the memory they save is the one the optimizer keeps.
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=1)
    training, plan = apply_trainer(load_trainer("megatron-core"), TrainingSpec(
        global_batch_size=16, seq_len=4096, moments_dtype="bf16", grad_reduce_fp32=False),
        parse_plan("tp=2,sp=1,mbs=1,zero=1"))
    text = export_text("megatron", export_context(model, training, plan, cluster=cluster))
    for flag in ("--use-precision-aware-optimizer", "--exp-avg-dtype bf16",
                 "--exp-avg-sq-dtype bf16"):
        assert flag in text
    text = text.replace("  --bf16", "  --bf16\n  --grad-reduce-in-bf16")
    path = tmp_path / "run.sh"
    path.write_text(text)
    imported = read_trainer_config(path, text)
    assert imported is not None
    assert imported.training["moments_dtype"] == "bf16"
    assert imported.training["grad_reduce_fp32"] is False
    # The default run writes none of them.
    base, _ = apply_trainer(load_trainer("megatron-core"), TrainingSpec(
        global_batch_size=16, seq_len=4096), plan)
    plain = export_text("megatron", export_context(model, base, plan, cluster=cluster))
    assert "--exp-avg-dtype" not in plain
    half = simulate(model, cluster, training, plan).memory_gb
    full = simulate(model, cluster, base, plan).memory_gb
    # 4 of the 12 bytes per parameter of a ZeRO-1 shard over dp=4, and 2 of the 4 gradient
    # bytes: the 8B model's parameters on a tp=2 rank.
    params = model.num_params / 2
    assert full["optimizer"] - half["optimizer"] == pytest.approx(params * 4 / 4 / 2**30,
                                                                  rel=0.02)
    assert full["grads"] - half["grads"] == pytest.approx(params * 2 / 2**30, rel=0.02)


@pytest.mark.parametrize(("flags", "needle"), [
    ("--use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8",
     "--exp-avg-dtype 'fp8' is not modelled"),
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16", "--exp-avg-sq-dtype 'fp32'"),
    ("--use-precision-aware-optimizer --main-params-dtype fp16", "--main-params-dtype 'fp16'"),
])
def test_unmodelled_optimizer_dtypes_are_named(flags, needle, tmp_path: Path):
    text = f"MEGATRON_ARGS=(--tensor-model-parallel-size 2 --bf16 {flags})"
    path = tmp_path / "run.sh"
    path.write_text(text)
    with pytest.raises(ImportError_, match=needle):
        read_trainer_config(path, text)


def test_an_odd_deepep_sm_count_is_not_exported():
    """DeepEP takes only even SM counts (deep_ep/buffer.py ``Buffer.set_num_sms``)."""
    from paraplan.export.common import ExportError

    model, cl = load_model("mixtral-8x7b"), load_cluster("dgx-h100", nodes=4)
    tr, plan = apply_trainer(load_trainer("megatron-core"), TrainingSpec(
        global_batch_size=256, seq_len=4096, moe_dispatcher="hierarchical",
        moe_dispatcher_sms=33), parse_plan("tp=1,pp=1,ep=8,zero=1,mbs=1"))
    with pytest.raises(ExportError, match="even SM count"):
        export_text("megatron", export_context(model, tr, plan, cluster=cl))
