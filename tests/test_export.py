"""Exporters: every key a trainer config gets is one that trainer's pinned source defines
(key lists recorded in tests/data/trainer_keys/), each trainer's own rules hold on what was
written, refusals name the field, the plan JSON loads back, and the CLI works end to end."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, simulate
from paraplan.export import (
    EXPORTERS,
    FORMATS,
    ExportError,
    export_context,
    export_text,
    plan_document,
    read_plan_document,
)
from paraplan.specs.checks import check_plan
from tests.test_cli import CMD

KEYS = Path(__file__).parent / "data" / "trainer_keys"

# (name, model, cluster, nodes, global batch, seq, plan): the three plans (dense 70B
# with interleaving, MoE with EP, uneven pipeline split) and a plain plan every trainer takes
# (sharded optimizer states: torchtitan runs DDP only alone and mixed precision with TP/PP only
# under FSDP).
PLANS = {
    "dense70b-interleaved": ("llama3-70b", "dgx-h100", 32, 1024, 8192,
                             "tp=8,pp=4,vpp=5,schedule=interleaved,sp=1,rc=full,mbs=1,zero=1"),
    "moe-ep": ("mixtral-8x7b", "dgx-h100", 4, 256, 4096,
               "tp=2,pp=1,ep=8,zero=3,sp=1,mbs=1,rc=full"),
    "moe-ep-pp": ("mixtral-8x7b", "dgx-h100", 4, 256, 4096,
                  "tp=2,pp=2,ep=8,zero=1,sp=1,mbs=1,rc=full"),
    "uneven-first-last": ("llama2-7b", "dgx-a100-80gb", 3, 96, 4096,
                          "tp=2,pp=4,mbs=1,layers=7/9/9/7,rc=full,zero=1"),
    "uneven-layout": ("llama2-7b", "dgx-a100-80gb", 3, 96, 4096,
                      "tp=2,pp=3,mbs=1,layers=10/11/11,rc=full,zero=1"),
    "plain": ("llama3-8b", "dgx-h100", 2, 128, 4096, "tp=2,pp=2,mbs=1,rc=full,zero=1"),
}
# What each trainer must accept (the rest must be refused with a named field).
ACCEPTS = {
    "megatron": set(PLANS),
    "torchtitan": {"dense70b-interleaved", "moe-ep", "moe-ep-pp", "uneven-first-last",
                   "uneven-layout", "plain"},
    "deepspeed": {"plain"},
    "nanotron": {"plain"},
}


def context(name: str):
    model, cluster, nodes, gbs, seq, plan = PLANS[name]
    m, c = load_model(model), load_cluster(cluster, nodes=nodes)
    t, p = TrainingSpec(global_batch_size=gbs, seq_len=seq), parse_plan(plan)
    return export_context(m, t, p, cluster=c), simulate(m, c, t, p).to_dict()


def recorded(name: str) -> set[str]:
    """Keys recorded from the trainer's source (comments and blank lines dropped)."""
    out = set()
    for line in (KEYS / name).read_text(encoding="utf-8").splitlines():
        key = line.split("#", 1)[0].strip()
        if key:
            out.add(key)
    assert out, f"{name} lists no keys"
    return out


def dotted(data: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every key of nested mappings (intermediate tables included)."""
    out = set()
    if isinstance(data, dict):
        for k, v in data.items():
            path = f"{prefix}{k}"
            out.add(path)
            out |= dotted(v, path + ".")
    return out


def megatron_flags(text: str) -> dict[str, list[str]]:
    body = text.split("MEGATRON_ARGS=(", 1)[1].rsplit(")", 1)[0]
    flags: dict[str, list[str]] = {}
    current = None
    for tok in shlex.split(body):
        if tok.startswith("--"):
            current = tok
            flags[current] = []
        else:
            assert current is not None, tok
            flags[current].append(tok)
    return flags


# ---- every key is the trainer's, and the trainer's rules hold on the written file --------------
@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_flags_are_core_v015_flags_and_rules_hold(name: str) -> None:
    ctx, report = context(name)
    flags = megatron_flags(export_text("megatron", ctx, report=report))
    assert set(flags) <= recorded("megatron_core_v0.15.txt")
    assert "--virtual-pipeline-model-parallel-size" not in flags  # gone in v0.15
    one = {k: int(v[0]) for k, v in flags.items() if len(v) == 1 and v[0].isdigit()}
    tp, pp, cp = (one[f"--{k}"] for k in ("tensor-model-parallel-size",
                                          "pipeline-model-parallel-size",
                                          "context-parallel-size"))
    world = ctx.world_size
    assert world % (tp * pp * cp) == 0
    dp = world // (tp * pp * cp)
    assert one["--global-batch-size"] % (one["--micro-batch-size"] * dp) == 0
    assert one["--num-attention-heads"] % tp == 0
    groups = one.get("--num-query-groups", one["--num-attention-heads"])
    assert groups % tp == 0 or tp % groups == 0
    if "--sequence-parallel" in flags:
        assert tp > 1
    if "--num-layers-per-virtual-pipeline-stage" in flags:
        per = one["--num-layers-per-virtual-pipeline-stage"]
        assert pp > 1 and one["--num-layers"] % (pp * per) == 0
    if "--expert-model-parallel-size" in flags:
        etp = one["--expert-tensor-parallel-size"]
        assert world % (etp * one["--expert-model-parallel-size"] * pp) == 0
    # The written split is the plan's split, layer for layer.
    layers = ctx.chunk_layers
    if "--decoder-first-pipeline-num-layers" in flags:
        first, last = one["--decoder-first-pipeline-num-layers"], one[
            "--decoder-last-pipeline-num-layers"]
        middle = (one["--num-layers"] - first - last) // (pp - 2) if pp > 2 else 0
        assert [first, *[middle] * (pp - 2), last] == layers
    if "--pipeline-model-parallel-layout" in flags:
        layout = flags["--pipeline-model-parallel-layout"][0]
        assert [seg.count("t") for seg in layout.split("|")] == layers
        assert layout.startswith("E") and layout.endswith("L")


@pytest.mark.parametrize("name", sorted(ACCEPTS["torchtitan"]))
def test_torchtitan_toml_uses_v022_keys_and_its_rules_hold(name: str) -> None:
    ctx, report = context(name)
    data = tomllib.loads(export_text("torchtitan", ctx, report=report))
    assert dotted(data) - set(data) <= recorded("torchtitan_v0.2.txt")
    par, tr = data["parallelism"], data["training"]
    degrees = (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
               * par["context_parallel_degree"] * par["tensor_parallel_degree"]
               * par["pipeline_parallel_degree"])
    assert degrees == ctx.world_size  # ParallelDims._validate
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert tr["global_batch_size"] % (tr["local_batch_size"] * dp) == 0
    if par["pipeline_parallel_degree"] > 1:
        parts = par["module_fqns_per_model_part"]
        micro = tr["local_batch_size"] // par["pipeline_parallel_microbatch_size"]
        assert tr["local_batch_size"] % par["pipeline_parallel_microbatch_size"] == 0
        assert micro >= len(parts) and len(parts) % par["pipeline_parallel_degree"] == 0
        flat = [n for part in parts for n in part]
        model_layers = load_model(PLANS[name][0]).num_layers
        assert flat == ["tok_embeddings", *[f"layers.{i}" for i in range(model_layers)],
                        "norm", "output"]
        assert [sum(n.startswith("layers.") for n in part) for part in parts] == \
            ctx.chunk_layers
    if par.get("expert_parallel_degree", 1) > 1:
        assert par["expert_tensor_parallel_degree"] in (1, par["tensor_parallel_degree"])
        assert (par["data_parallel_shard_degree"] * par["context_parallel_degree"]) % \
            par["expert_parallel_degree"] == 0


def test_deepspeed_json_keys_and_batch_identity() -> None:
    ctx, report = context("plain")
    data = json.loads(export_text("deepspeed", ctx, report=report))
    assert dotted(data) <= recorded("deepspeed.txt")
    assert data["train_batch_size"] == (data["train_micro_batch_size_per_gpu"]
                                        * data["gradient_accumulation_steps"] * ctx.dp)
    if "pipeline" in data:
        assert data["zero_optimization"]["stage"] <= 1


def test_nanotron_yaml_keys_and_rules() -> None:
    ctx, report = context("plain")
    data = yaml.safe_load(export_text("nanotron", ctx, report=report))
    assert dotted(data) <= recorded("nanotron.txt")
    par, tok = data["parallelism"], data["tokens"]
    assert par["dp"] * par["pp"] * par["tp"] == ctx.world_size
    assert (tok["micro_batch_size"] * tok["batch_accumulation_per_replica"] * par["dp"]
            == 128)
    assert par["pp_engine"] in ("1f1b", "afab") and par["tp_mode"] in ("ALL_REDUCE",
                                                                      "REDUCE_SCATTER")
    if par["pp_engine"] == "1f1b":
        assert tok["batch_accumulation_per_replica"] >= par["pp"] - 1


@pytest.mark.parametrize("fmt", sorted(EXPORTERS))
@pytest.mark.parametrize("name", sorted(PLANS))
def test_each_trainer_accepts_or_refuses_by_name(fmt: str, name: str) -> None:
    ctx, report = context(name)
    if name in ACCEPTS[fmt]:
        assert export_text(fmt, ctx, report=report).strip()
        return
    with pytest.raises(ExportError) as info:
        export_text(fmt, ctx, report=report)
    err = info.value
    assert err.field and err.field.split(".")[-1] in str(err) and fmt.lower() in \
        str(err).lower()


# ---- the plan JSON ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_json_has_every_derived_quantity_and_loads_back(name: str) -> None:
    ctx, report = context(name)
    doc = json.loads(export_text("json", ctx, report=report))
    d = doc["derived"]
    assert d["dp"] * ctx.plan.model_parallel_size == d["world_size"] == ctx.world_size
    gbs = PLANS[name][3]
    assert d["num_microbatches"] * ctx.plan.micro_batch_size * d["dp"] == gbs
    assert sum(d["layers_per_chunk"]) == ctx.model.num_layers
    assert len(d["layers_per_chunk"]) == ctx.plan.pp * ctx.plan.virtual_stages
    assert d["rank_order"] == "tp-cp-ep-dp-pp"
    assert doc["prediction"]["step_time_s"] == report["step_time_s"]
    back = read_plan_document(doc)
    assert back == ctx
    # Exports from the loaded plan JSON equal exports from the original.
    assert export_text("megatron", back) == export_text("megatron", ctx)


def test_bad_plan_json_names_the_field() -> None:
    ctx, _ = context("plain")
    doc = plan_document(ctx)
    with pytest.raises(ExportError, match="format"):
        read_plan_document({**doc, "format": "paraplan-plan/99"})
    with pytest.raises(ExportError, match="tp"):
        read_plan_document({**doc, "plan": {**doc["plan"], "tp": 0}})
    with pytest.raises(ExportError, match="world size"):
        read_plan_document({**doc, "world_size": 10})


@pytest.mark.parametrize("plan, seq, says", [
    ("tp=1,sp=1", 4096, "sequence_parallel=true needs tp > 1"),
    ("tp=2,cp=3", 4099, "needs seq_len divisible by 2*cp=6; seq_len=4099; use an even"),
    ("tp=2,pp=2,vpp=2,schedule=1f1b", 4096, "needs schedule=interleaved"),
])
def test_plan_without_cluster_meets_the_rules_of_check_plan(plan, seq, says) -> None:
    """A plan JSON carries a world size, not a cluster: it is held to every rule of
    ``check_plan`` that needs only the world size, worded the same way."""
    model = load_model("llama2-7b")
    training = TrainingSpec(global_batch_size=96, seq_len=seq)
    with pytest.raises(ExportError, match=re.escape(says)):
        export_context(model, training, parse_plan(plan), world_size=24)
    cluster_reasons = check_plan(model, load_cluster("dgx-a100-80gb", nodes=3), training,
                                 parse_plan(plan))
    assert any(says in r for r in cluster_reasons)


def test_megatron_refuses_what_it_cannot_express() -> None:
    ctx, _ = context("plain")
    for update, field in (({"schedule": "gpipe"}, "schedule"), ({"recompute": "op"},
                                                                "recompute"),
                          ({"dp_sync_interval": 10}, "dp_sync_interval")):
        bad = type(ctx)(ctx.model, ctx.training, ctx.plan.model_copy(update=update),
                        ctx.world_size)
        with pytest.raises(ExportError) as info:
            export_text("megatron", bad)
        assert info.value.field == f"plan.{field}"


def test_unknown_format_lists_the_formats() -> None:
    ctx, _ = context("plain")
    with pytest.raises(ExportError) as info:
        export_text("yaml", ctx)
    assert info.value.allowed == list(FORMATS)


# ---- CLI through the entry point ----------------------------------------------------------------
def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


PLAIN_ARGS = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2",
              "--global-batch", "128", "--seq-len", "4096")


def test_cli_export_every_format_and_plan_json_roundtrip(tmp_path: Path) -> None:
    js = tmp_path / "plan.json"
    res = run("export", "tp=2,pp=2,mbs=1,rc=full,zero=1", "--to", "json", "--out", str(js),
              *PLAIN_ARGS)
    assert res.returncode == 0, res.stderr
    doc = json.loads(js.read_text())
    assert doc["format"] == "paraplan-plan/1" and doc["prediction"]["step_time_s"] > 0
    for fmt in EXPORTERS:
        out = tmp_path / f"cfg{EXPORTERS[fmt].suffix}"
        res = run("export", str(js), "--to", fmt, "--out", str(out))
        assert res.returncode == 0, res.stderr
        assert out.stat().st_size > 50 and (tmp_path / "cfg.plan.json").is_file()
        assert "wrote" in res.stderr
    # Printed to stdout without --out; simulate reads the plan JSON back.
    res = run("export", str(js), "--to", "torchtitan")
    assert res.returncode == 0 and tomllib.loads(res.stdout)["parallelism"]
    res = run("simulate", "--plan", str(js), *PLAIN_ARGS, "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["step_time_s"] == pytest.approx(
        doc["prediction"]["step_time_s"])


@pytest.mark.parametrize(("args", "needle"), [
    (("tp=2,pp=2,mbs=1", "--to", "yaml", *PLAIN_ARGS), "--to"),
    (("tp=2,pp=2,mbs=1", "--to", "megatron"), "needs --model"),
    (("tp=3,mbs=1", "--to", "megatron", *PLAIN_ARGS), "cannot be exported"),
    (("tp=2,pp=2,mbs=1,schedule=gpipe", "--to", "megatron", *PLAIN_ARGS), "1F1B"),
    (("tp=2,mbs=1,zero=1", "--to", "torchtitan", *PLAIN_ARGS), "zero_stage"),
    (("tp=2,pp=2,mbs=1,zero=3", "--to", "torchtitan", *PLAIN_ARGS), "zero_stage"),
])
def test_cli_export_bad_input_exits_2(args: tuple[str, ...], needle: str) -> None:
    res = run("export", *args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr


def test_cli_export_plan_json_refuses_overrides(tmp_path: Path) -> None:
    js = tmp_path / "plan.json"
    assert run("export", "tp=2,pp=2,mbs=1", "--to", "json", "--out", str(js),
               *PLAIN_ARGS).returncode == 0
    res = run("export", str(js), "--to", "megatron", "--model", "llama3-70b")
    assert res.returncode == 2 and "drop --model" in res.stderr


def test_cli_best_export_megatron_writes_flags_and_plan_json(tmp_path: Path) -> None:
    out = tmp_path / "megatron.sh"
    res = run("best", *PLAIN_ARGS, "--top", "2", "--export", "megatron", "--out", str(out),
              "--format", "json")
    assert res.returncode == 0, res.stderr
    best = json.loads(res.stdout)["plans"][0]
    flags = megatron_flags(out.read_text())
    assert int(flags["--tensor-model-parallel-size"][0]) == best["plan"]["tp"]
    doc = json.loads((tmp_path / "megatron.plan.json").read_text())
    assert doc["plan"]["tp"] == best["plan"]["tp"] and doc["search"]["plans"][0] == best
    # The bash snippet is valid bash.
    check = subprocess.run(["bash", "-n", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_every_flag_the_megatron_exporter_can_write_is_recorded() -> None:
    """Not only the flags the test plans happen to use: every flag literal in the exporter."""
    import re

    import paraplan.export.megatron as mod

    src = Path(mod.__file__).read_text(encoding="utf-8")
    flags = set(re.findall(r"\"(--[a-z0-9-]+)", src))
    assert len(flags) > 30
    assert flags <= recorded("megatron_core_v0.15.txt")


def test_every_moe_and_overlap_variant_exports_recorded_keys() -> None:
    """Variants the six plans miss: capacity padding, shared experts, dense first layers,
    ZeRO-2/3 via Megatron-FSDP, TP comm overlap, fp8, a first/last split with vpp."""
    ctx, _ = context("moe-ep-pp")
    model = ctx.model.model_copy(update={"num_shared_experts": 1, "first_dense_layers": 1})
    plan = ctx.plan.model_copy(update={"moe_capacity_factor": 1.25, "tp_comm_overlap": True})
    variants = [
        type(ctx)(model, ctx.training.model_copy(update={"precision": "fp8"}), plan,
                  ctx.world_size),
        type(ctx)(ctx.model, ctx.training, ctx.plan.model_copy(update={"zero_stage": 3}),
                  ctx.world_size),
    ]
    for v in variants:
        flags = megatron_flags(export_text("megatron", v))
        assert set(flags) <= recorded("megatron_core_v0.15.txt")
    flags = megatron_flags(export_text("megatron", variants[0]))
    assert flags["--moe-expert-capacity-factor"] == ["1.25"]
    assert "--tp-comm-overlap" in flags and "--fp8-format" in flags


@pytest.mark.parametrize("fmt", sorted(EXPORTERS))
@pytest.mark.parametrize(("update", "field"), [
    ({"grad_compression": "quantize", "compression_bits": 8}, "plan.grad_compression"),
    ({"activation_compression_bits": 4}, "plan.activation_compression_bits"),
])
def test_compression_knobs_are_refused_by_every_trainer(fmt, update, field) -> None:
    ctx, _ = context("plain")
    bad = type(ctx)(ctx.model, ctx.training, ctx.plan.model_copy(update=update),
                    ctx.world_size)
    with pytest.raises(ExportError) as info:
        export_text(fmt, bad)
    assert info.value.field == field


def test_nanotron_refuses_context_parallelism_its_llama_model_cannot_run():
    # nanotron's Llama model has no context parallelism (only its Qwen2 attention reads
    # context_parallel_size), so neither the search nor the exporter offers cp > 1 for it.
    from paraplan.search import search
    from paraplan.specs import load_trainer

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    training = TrainingSpec(global_batch_size=64, seq_len=16384)
    plan = parse_plan("tp=2,cp=4,mbs=1,pp=2,schedule=gpipe")
    with pytest.raises(ExportError, match="plan.cp=4 cannot be exported to nanotron"):
        export_text("nanotron", export_context(model, training, plan, cluster=cluster))
    assert load_trainer("nanotron").can.context_parallel is False
    res = search(model, cluster, training, trainer="nanotron", top=20)
    assert res.reports and all(r.plan["cp"] == 1 for r in res.reports)


def test_identity_placement_is_rank_order_and_exports():
    """The evolutionary searcher gives its rank-order plans the identity placement (so that
    simulate prices every stage boundary on its GPUs); that is the order every exporter
    writes, so it exports, and the plan is not labelled "placed". A real permutation is
    refused."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=64, seq_len=4096)
    plan = parse_plan("tp=2,pp=2,dp=4,mbs=1,zero=1")
    same = plan.model_copy(update={"placement": list(range(16))})
    moved = plan.model_copy(update={"placement": [1, 0] + list(range(2, 16))})
    assert same.rank_order and plan.rank_order and not moved.rank_order
    assert "placed" not in same.short() and "placed" in moved.short()
    for fmt in ("megatron", "torchtitan"):
        text = export_text(fmt, export_context(model, t, same, cluster=cluster))
        assert text == export_text(fmt, export_context(model, t, plan, cluster=cluster))
        with pytest.raises(ExportError, match="placement"):
            export_text(fmt, export_context(model, t, moved, cluster=cluster))


@pytest.mark.parametrize("fmt", sorted(EXPORTERS))
def test_a_16_bit_optimizer_state_is_written_or_refused_by_name(fmt) -> None:
    ctx, _ = context("plain")
    moments = type(ctx)(ctx.model, ctx.training.model_copy(update={"moments_dtype": "bf16"}),
                        ctx.plan.model_copy(update={"zero_stage": 1}), ctx.world_size)
    master = type(ctx)(ctx.model, ctx.training.model_copy(
        update={"master_weights_dtype": "bf16"}), ctx.plan, ctx.world_size)
    with pytest.raises(ExportError) as info:
        export_text(fmt, master)
    assert info.value.field == "training.master_weights_dtype"
    if fmt == "megatron":
        flags = megatron_flags(export_text(fmt, moments))
        assert flags["--exp-avg-dtype"] == ["bf16"] and flags["--exp-avg-sq-dtype"] == ["bf16"]
        assert "--use-precision-aware-optimizer" in flags
        no_dist = type(ctx)(ctx.model, moments.training,
                            ctx.plan.model_copy(update={"zero_stage": 0}), ctx.world_size)
        with pytest.raises(ExportError, match="zero_stage=1"):
            export_text(fmt, no_dist)
    else:
        with pytest.raises(ExportError) as info:
            export_text(fmt, moments)
        assert info.value.field == "training.moments_dtype"
