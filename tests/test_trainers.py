"""Trainer profiles: what each trainer can express (scalar rules and the vectorized filter agree),
how it runs a plan (explicit fields win), searches return only plans the trainer can run, and
``best --export X`` works for every trainer on plans of many shapes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, simulate
from paraplan.export import export_context, export_text
from paraplan.search import search
from paraplan.search.space import build_space
from paraplan.search.space.trainer_filter import trainer_mask
from paraplan.specs import SpecError, list_profiles, load_trainer
from paraplan.specs.loaders import cluster_from_dict
from paraplan.specs.trainer import TrainerCan, TrainerRuns, apply_trainer, trainer_reasons
from tests.test_cli import run
from tests.test_export import dotted, megatron_flags, recorded

TRAINERS = list_profiles("trainers")
EXPORTING = {"megatron-core": "megatron", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
             "nanotron": "nanotron"}
KEY_LISTS = {"megatron": "megatron_core_v0.15.txt", "torchtitan": "torchtitan_v0.2.txt",
             "deepspeed": "deepspeed.txt", "nanotron": "nanotron.txt"}


def recorded_keys(fmt: str) -> set[str]:
    return recorded(KEY_LISTS[fmt])


def exported_keys(fmt: str, text: str) -> set[str]:
    """Every key a written trainer config sets (Megatron flags, dotted TOML/JSON/YAML keys)."""
    if fmt == "megatron":
        return set(megatron_flags(text))
    if fmt == "torchtitan":
        data = tomllib.loads(text)
        return dotted(data) - set(data)
    return dotted(json.loads(text) if fmt == "deepspeed" else yaml.safe_load(text))


def test_every_profile_loads_and_cites_real_fields():
    assert {"megatron-core", "megatron-lm-2021", "torchtitan", "deepspeed", "nanotron",
            "generic"} <= set(TRAINERS)
    for name in TRAINERS:
        spec = load_trainer(name)
        assert spec.name == name
        for key in spec.sources:
            part, _, field = key.partition(".")
            fields = TrainerCan.model_fields if part == "can" else TrainerRuns.model_fields
            assert part in ("can", "runs") and (not field or field in fields), (name, key)
        if name != "generic":
            assert spec.sources, f"{name} cites no source"
    assert {load_trainer(n).export_format for n in EXPORTING} == set(EXPORTING.values())


def test_unknown_trainer_is_a_clear_error():
    with pytest.raises(SpecError, match="unknown trainer 'megatron-x'.*megatron-core"):
        load_trainer("megatron-x")


MODEL = load_model("llama3-8b")
TRAIN = TrainingSpec(global_batch_size=64, seq_len=4096)


@pytest.mark.parametrize(("trainer", "plan", "needle"), [
    ("megatron-core", "tp=2,pp=2,schedule=zb-h1", "cannot run schedule=zb-h1"),
    ("megatron-core", "tp=2,pp=2,rc=op", "cannot recompute=op"),
    ("megatron-core", "tp=2,pp=2,zero=2", "ZeRO stage 1 at most with pipeline"),
    ("torchtitan", "tp=2,zero=1", "cannot express zero_stage=1"),
    ("torchtitan", "tp=2,pp=2,zero=3", "runs ZeRO stage 0 or 1 with pipeline parallelism"),
    ("torchtitan", "tp=2,pp=2,zero=2", "runs ZeRO stage 0 or 1 with pipeline parallelism"),
    ("torchtitan", "tp=2,sp=0", "always shards norms"),
    ("deepspeed", "pp=2,zero=2", "ZeRO stage 1 at most"),
    ("deepspeed", "tp=2,sp=1", "no Megatron sequence parallelism"),
    ("deepspeed", "cp=2", "no ring context parallelism"),
    ("nanotron", "pp=2,vpp=2,schedule=interleaved", "cannot run schedule=interleaved"),
    ("nanotron", "zero=3", "cannot express zero_stage=3"),
    ("llm-foundry", "tp=2", "no tensor parallelism"),
    ("llm-foundry", "pp=2", "no pipeline parallelism"),
    ("megatron-core", "h=10", "synchronizes dense gradients every step"),
    ("megatron-core", "dp_algo=sharded_ps", "sends gradients through collective"),
])
def test_trainer_reasons_by_hand(trainer, plan, needle):
    reasons = trainer_reasons(load_trainer(trainer), MODEL, TRAIN, parse_plan(plan), 16)
    assert any(needle in r for r in reasons), reasons
    assert not trainer_reasons(load_trainer("generic"), MODEL, TRAIN, parse_plan(plan), 16)


def test_llm_foundry_search_mask_has_no_tp_or_pp():
    """The vectorized mask agrees with trainer_reasons on a dense model (the MoE check above
    is vacuous for a trainer without MoE) and keeps only tp = pp = 1 for llm-foundry."""
    cluster = load_cluster("dgx-a100-80gb", nodes=2)
    spec = load_trainer("llm-foundry")
    space = build_space(MODEL, cluster, TRAIN)
    keep, refused = trainer_mask(space.cols, spec, MODEL)
    assert keep.any() and (space.cols["tp"][keep] == 1).all()
    assert (space.cols["pp"][keep] == 1).all()
    assert any("tensor parallelism" in r for r in refused)
    for i in np.random.default_rng(1).choice(len(space), size=300, replace=False).tolist():
        scalar = not trainer_reasons(spec, MODEL, TRAIN, space.plan(i),
                                     int(space.cols["m"][i]))
        assert scalar == bool(keep[i]), space.plan(i).short()


def test_microbatch_rules():
    # torchtitan: one micro-batch per stage at least; nanotron's 1F1B: pp - 1 at least.
    plan = parse_plan("tp=2,sp=1,pp=4,vpp=2,schedule=interleaved")
    assert any("one micro-batch per pipeline stage" in r for r in
               trainer_reasons(load_trainer("torchtitan"), MODEL, TRAIN, plan, 7))
    assert not trainer_reasons(load_trainer("torchtitan"), MODEL, TRAIN, plan, 8)
    one = parse_plan("pp=4,schedule=1f1b")
    assert trainer_reasons(load_trainer("nanotron"), MODEL, TRAIN, one, 2)
    assert not trainer_reasons(load_trainer("nanotron"), MODEL, TRAIN, one, 3)


def test_apply_trainer_sets_run_facts_but_explicit_fields_win():
    meg = load_trainer("megatron-core")
    training, plan = apply_trainer(meg, TRAIN, parse_plan("tp=4,sp=1"))
    assert plan.tp_comm_overlap and plan.overlap_grad_reduce
    assert training.grad_reduce_fp32 and not training.dropout  # bf16: Megatron reduces in fp32
    _, no_sp = apply_trainer(meg, TRAIN, parse_plan("tp=4,sp=0"))
    assert not no_sp.tp_comm_overlap  # --tp-comm-overlap needs --sequence-parallel
    fp16 = TrainingSpec(global_batch_size=64, seq_len=4096, precision="fp16")
    assert not apply_trainer(meg, fp16, parse_plan("tp=4"))[0].grad_reduce_fp32
    mine = TrainingSpec(global_batch_size=64, seq_len=4096, dropout=True, grad_reduce_fp32=False)
    training, plan = apply_trainer(meg, mine, parse_plan("tp=4,sp=1,tp_comm_overlap=false"))
    assert training.dropout and not training.grad_reduce_fp32 and not plan.tp_comm_overlap
    # Applying twice changes nothing.
    assert apply_trainer(meg, training, plan) == (training, plan)
    titan, _ = apply_trainer(load_trainer("torchtitan"), TRAIN, parse_plan("tp=2,sp=1"))
    assert titan.kernels == "eager" and titan.grad_reduce_fp32


def test_generic_prices_a_plan_as_written():
    cluster = load_cluster("dgx-h100", nodes=2)
    for text in ("tp=2,pp=2,mbs=1,zero=1,schedule=zb-h1", "tp=4,cp=2,sp=1,rc=selective"):
        plan = parse_plan(text)
        a = simulate(MODEL, cluster, TRAIN, plan)
        b = simulate(MODEL, cluster, TRAIN, plan, trainer="generic")
        assert a.step_time_s == b.step_time_s and a.memory_gb == b.memory_gb
        assert b.extra["trainer"] == "generic"


def test_simulate_refuses_what_the_trainer_cannot_run():
    cluster = load_cluster("dgx-h100", nodes=2)
    rep = simulate(MODEL, cluster, TRAIN, parse_plan("tp=2,pp=2,schedule=zb-h1"),
                   trainer="megatron-core")
    assert not rep.feasible and any("zb-h1" in r for r in rep.reasons)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_vectorized_filter_agrees_with_trainer_reasons(trainer):
    model = load_model("mixtral-8x7b")  # MoE: ep and etp rules too
    cluster = load_cluster("dgx-h100", nodes=4)
    training = TrainingSpec(global_batch_size=64, seq_len=4096)
    spec = load_trainer(trainer)
    space = build_space(model, cluster, training)
    keep, _ = trainer_mask(space.cols, spec, model, training)
    rng = np.random.default_rng(0)
    rows = rng.choice(len(space), size=min(600, len(space)), replace=False)
    for i in rows.tolist():
        plan = space.plan(i)
        scalar = not trainer_reasons(spec, model, training, plan, int(space.cols["m"][i]))
        assert scalar == bool(keep[i]) or not spec.can.moe, (trainer, plan.short())


def _search_cases():
    dense = TrainingSpec(global_batch_size=128, seq_len=4096)
    return [
        ("llama3-8b", "dgx-h100", 1, dense),
        ("llama3-70b", "dgx-h100", 32, TrainingSpec(global_batch_size=1024, seq_len=8192)),
        ("llama3-405b", "dgx-h100", 2048, TrainingSpec(global_batch_size=2048, seq_len=8192)),
        ("llama3-8b", "dgx-h100", 4, TrainingSpec(global_batch_size=32, seq_len=32768)),
        ("mixtral-8x7b", "dgx-h100", 8, TrainingSpec(global_batch_size=256, seq_len=4096)),
        ("gpt3-13b", "dgx-a100-80gb", 16, TrainingSpec(global_batch_size=512, seq_len=2048)),
        ("gpt3-175b", "dgx-a100-80gb", 16, TrainingSpec(global_batch_size=1536, seq_len=2048)),
        ("llama2-13b", "dgx-a100-80gb", 4, TrainingSpec(global_batch_size=256, seq_len=4096)),
    ]


# What a trainer cannot do at all on a case, and the error that says so. Everything else must
# give a plan that exports: at least five cases per trainer besides the README main job.
CANNOT = {
    ("nanotron", 4): "mixture-of-experts",  # the Llama config nanotron takes has no experts
    # 126 layers split evenly over pp | 16384 leaves pp in {1, 2}; ZeRO-1 at most: no fit.
    ("nanotron", 2): "no plan fits in memory",
}


@pytest.mark.parametrize("trainer", sorted(EXPORTING))
@pytest.mark.parametrize("case", range(8))
def test_best_plan_exports_to_its_trainer(trainer, case):
    name, cluster_name, nodes, training = _search_cases()[case]
    model = load_model(name)
    spec = load_trainer(trainer)
    cluster = load_cluster(cluster_name, nodes=nodes)
    if (trainer, case) in CANNOT:
        with pytest.raises(SpecError, match=CANNOT[trainer, case]):
            search(model, cluster, training, top=1, trainer=spec)
        return
    result = search(model, cluster, training, top=3, trainer=spec)
    fmt = EXPORTING[trainer]
    for rep in result.reports:
        plan = parse_plan({k: v for k, v in rep.plan.items() if v is not None})
        ctx = export_context(model, training, plan, cluster=cluster)
        text = export_text(fmt, ctx, report=rep.to_dict())
        unknown = exported_keys(fmt, text) - recorded_keys(fmt)
        assert not unknown, (trainer, plan.short(), unknown)


def test_every_trainer_has_five_cases_besides_the_main_job():
    for trainer in EXPORTING:
        assert sum((trainer, c) not in CANNOT for c in range(8)) >= 6  # the main job is one


def test_mixed_gpu_cluster_search_respects_the_trainer():
    # A two-type cluster goes to the ILP; megatron-core cannot run zero-bubble, so the ILP's
    # ZB-H1 re-timing must not be returned, and the plan must export.
    cluster = cluster_from_dict({"name": "mix", "node_groups": [
        {"gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8, "intra_node_link": "nvlink3",
         "inter_node_link": "ib-hdr", "nics_per_node": 8},
        {"gpu": "v100-sxm2-32gb", "num_nodes": 1, "gpus_per_node": 8, "intra_node_link": "nvlink2",
         "inter_node_link": "ib-edr", "nics_per_node": 4}]})
    model = load_model("gpt3-2.7b")
    training = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")
    result = search(model, cluster, training, top=2, trainer="megatron-core")
    assert result.searcher == "ilp" and result.reports
    for rep in result.reports:
        assert rep.plan["schedule"] in ("1f1b", "interleaved")
        assert rep.extra["trainer"] == "megatron-core"
        plan = parse_plan({k: v for k, v in rep.plan.items() if v is not None})
        export_text("megatron", export_context(model, training, plan, cluster=cluster))


@pytest.mark.parametrize(("fmt", "suffix"), [("megatron", "sh"), ("torchtitan", "toml"),
                                             ("deepspeed", "json"), ("nanotron", "yaml")])
def test_cli_best_export_on_the_readme_main_job(tmp_path: Path, fmt, suffix):
    out = tmp_path / f"run.{suffix}"
    res = run("best", "--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "32",
              "--global-batch", "1024", "--seq-len", "8192", "--top", "1", "--export", fmt,
              "--out", str(out), "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    trainer = {v: k for k, v in EXPORTING.items()}[fmt]
    assert data["trainer"] == trainer and data["plans"][0]["trainer"] == trainer
    unknown = exported_keys(fmt, out.read_text()) - recorded_keys(fmt)
    assert not unknown


def test_cli_trainer_conflicts_and_defaults():
    args = ("best", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64",
            "--seq-len", "4096", "--top", "1")
    res = run(*args, "--trainer", "torchtitan", "--export", "megatron", "--out", "x.sh")
    assert res.returncode == 2 and "conflicts with --export megatron" in res.stderr
    res = run(*args, "--trainer", "nope")
    assert res.returncode == 2 and "unknown trainer 'nope'" in res.stderr
    res = run(*args, "--format", "json")
    assert res.returncode == 0 and json.loads(res.stdout)["trainer"] == "megatron-core"
    res = run(*args, "--relaxed")
    assert res.returncode == 2 and "--trainer generic" in res.stderr


def test_cli_simulate_with_megatron_lm_2021_reproduces_validate_published(tmp_path: Path):
    # Megatron 2021 Table 1 (Narayanan et al.): the CLI, given the row's model, cluster, plan
    # and --trainer megatron-lm-2021, prices exactly what validate-published predicts.
    from paraplan.validate.predict import predict_step_time
    from paraplan.validate.published import load_published_throughput

    cases = [c for c in load_published_throughput()
             if c.source_id == "megatron2021_narayanan" and c.skip_reason is None]
    assert len(cases) == 10
    for i, case in enumerate(cases):
        model, cluster = tmp_path / f"m{i}.yaml", tmp_path / f"c{i}.yaml"
        plan = tmp_path / f"p{i}.json"
        model.write_text(yaml.safe_dump(case.model.model_dump(mode="json", exclude_none=True)))
        cluster.write_text(yaml.safe_dump(case.cluster.model_dump(mode="json", exclude_none=True)))
        plan.write_text(json.dumps(case.plan.model_dump(mode="json", exclude_none=True)))
        t = case.training
        res = run("simulate", "--model", str(model), "--cluster", str(cluster), "--plan", str(plan),
                  "--global-batch", str(t.global_batch_size), "--seq-len", str(t.seq_len),
                  "--precision", t.precision, "--no-flash-attention", "--trainer",
                  "megatron-lm-2021", "--format", "json")
        assert res.returncode == 0, res.stderr
        predicted, _, _ = predict_step_time(case)
        assert json.loads(res.stdout)["step_time_s"] == predicted, case.model_name


def test_validate_published_takes_an_unknown_source_with_a_trainer_column(tmp_path: Path):
    # A user's own runs: an unknown source_id is predicted when its metric is a step time or
    # tokens/s (no FLOP formula needed); the trainer column picks the profile.
    header = ("source_id,model_name,layers,hidden,heads,kv_heads,ffn_hidden,vocab,seq_len,"
              "activation,gpu_type,gpu_mem_gb,num_gpus,gpus_per_node,tp,pp,dp,sequence_parallel,"
              "zero_stage,recompute,micro_batch,global_batch,precision,measured_metric,"
              "measured_value,trainer")
    row = ("my_lab,Llama-3-8B,32,4096,32,8,14336,128256,8192,swiglu,H100-SXM,80,16,8,2,1,8,1,"
           "1,none,1,128,bf16,{metric},{value},{trainer}")
    rows = [row.format(metric="step_time_s", value="9.5", trainer="torchtitan"),
            row.format(metric="tokens_per_s_per_gpu", value="7000", trainer="megatron-core"),
            row.format(metric="mfu", value="40", trainer="megatron-core")]
    path = tmp_path / "mine.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    res = run("validate-published", str(path), "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    status = [r["status"] for r in data["rows"]]
    assert status[:2] == ["ok", "ok"] and status[2] == "skipped"  # mfu needs a FLOP formula
    assert [r["trainer"] for r in data["rows"][:2]] == ["torchtitan", "megatron-core"]
    assert set(data["by_trainer"]) == {"torchtitan", "megatron-core"}
    # ... and by GPU type, every row (predicted or not) in its GPU's group.
    assert [r["gpu"] for r in data["rows"]] == ["h100-sxm"] * 3
    assert data["by_gpu"]["h100-sxm"]["n_rows"] == 3 and data["by_gpu"]["h100-sxm"]["n"] == 2


def test_explain_suggests_only_what_the_trainer_can_run():
    from paraplan.explain import explain

    model, cluster = load_model("gpt3-xl"), load_cluster("dgx-h100", nodes=2)
    training = TrainingSpec(global_batch_size=64, seq_len=2048)
    plan = parse_plan("pp=4,mbs=1")
    for trainer in ("megatron-core", "torchtitan", "nanotron"):
        spec = load_trainer(trainer)
        data = explain(model, cluster, training, plan, top=50, trainer=spec)
        for alt in data["alternatives"]:
            alt_plan = parse_plan(alt["plan_fields"])
            assert not trainer_reasons(spec, model, training, alt_plan), (trainer, alt["change"])
    # The generic space suggests a parameter server even on InfiniBand DGX nodes; a trainer
    # that sends gradients through its collectives never sees that suggestion.
    changes = lambda t: [a["change"] for a in  # noqa: E731
                         explain(model, cluster, training, plan, top=50, trainer=t)["alternatives"]]
    assert any("sharded_ps" in c for c in changes("generic"))
    assert not any("sharded_ps" in c for c in changes("megatron-core"))


def test_overlapped_interleaved_sends_agree_between_evaluator_and_simulate():
    # megatron-core overlaps interleaved pipeline sends (plan.overlap_p2p_comm): the
    # vectorized evaluator and simulate price it alike, and it is never slower than blocking.
    from paraplan.search.space import evaluate_space

    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", nodes=8)
    training = TrainingSpec(global_batch_size=256, seq_len=4096)
    spec = load_trainer("megatron-core")
    space = build_space(model, cluster, training, {"pp": 4, "tp": 8, "sequence_parallel": True},
                        trainer=spec)
    ev = evaluate_space(space, exact_interleaved=True, times_for_oom=True)
    rows = [i for i in range(len(space)) if space.cols["v"][i] > 1 and not space.cols["uneven"][i]]
    assert rows
    for i in rows[:40]:
        plan = space.plan(i)
        assert plan.overlap_p2p_comm
        rep = simulate(model, cluster, space.training, plan, time_if_oom=True)
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-9), plan.short()
        blocking = simulate(model, cluster, space.training,
                            plan.model_copy(update={"overlap_p2p_comm": False}), time_if_oom=True)
        assert rep.step_time_s <= blocking.step_time_s
        assert rep.time_s["pp_comm"] < blocking.time_s["pp_comm"]


def test_validate_recipes_ranks_a_recipe_and_says_why():
    from paraplan.validate.recipes import check_recipe, recipe_cases

    cases = {c.index: c for c in recipe_cases(("dgxc_nemo_h100",))}
    assert len(cases) == 18
    for index in (4, 11):  # Llama 3.1 8B (cp=2) and 405B (tp=8 pp=9 vpp=7) NeMo recipes
        row = check_recipe(cases[index])
        assert row["status"] == "ok" and row["trainer"] == "megatron-core"
        assert row["rank"] >= 1 and row["plans_ranked"] > row["rank"]
        assert row["gain"] == pytest.approx(row["recipe_step_time_s"] / row["best_step_time_s"])
        if row["recipe_in_space"]:  # the search's #1 is never slower than a plan it holds
            assert row["gain"] >= 1 - 1e-9 and row["recipe_fits"]
        assert all(w["part"] in ("compute", "bubble", "tp_comm", "cp_comm", "ep_comm",
                                 "pp_comm", "dp_comm", "optimizer") for w in row["why"])
        # Both plans' peak memory; "tight": #1 needs more than the recipe and sits within the
        # memory model's error of the GPU's memory.
        from paraplan.validate.recipes import TIGHT_MEMORY_FRACTION

        cap, peak = row["memory_capacity_gib"], row["best_peak_gib"]
        assert cap == 80.0 and 0 < peak <= cap and row["recipe_peak_gib"] > 0
        assert row["tight"] == (peak >= TIGHT_MEMORY_FRACTION * cap
                                and peak > row["recipe_peak_gib"])
        # The knobs #1 sets differently, read off the two plans: the 8B recipe runs cp=2.
        import re

        def field(short: str, key: str, default: str) -> str:
            hit = re.search(rf"\b{key}=(\w+)", short)
            return hit.group(1) if hit else default

        for key, name, default in (("cp", "cp", "1"), ("mbs", "mbs", "1"),
                                   ("zero", "zero", "0"), ("rc", "recompute", "none")):
            old, new = field(row["recipe"], key, default), field(row["best"], key, default)
            assert (f"{name} {old} -> {new}" in row["changed"]) == (old != new), name


def test_changed_knobs_names_each_differing_field_and_the_moe_setting():
    from paraplan.validate.recipes import changed_knobs

    recipe = {"tp": 4, "pp": 8, "cp": 1, "recompute": "full", "micro_batch_size": 1}
    best = {"tp": 4, "pp": 4, "cp": 1, "recompute": "none", "micro_batch_size": 1}
    assert changed_knobs(recipe, best) == ["pp 8 -> 4", "recompute full -> none"]
    assert changed_knobs(recipe, recipe, ("alltoall", "alltoall")) == []
    assert changed_knobs(recipe, recipe, ("alltoall", "deepep + a2a-overlap")) == [
        "moe alltoall -> deepep + a2a-overlap"]


def test_cli_validate_recipes_rejects_an_unknown_source():
    res = run("validate-recipes", "--source", "my_lab")
    assert res.returncode == 2 and "not a recipe source" in res.stderr


def test_torchtitan_fsdp_under_pipelining_is_zero_1():
    # torch.distributed.pipelining keeps FSDP parameters and gradients unsharded until the
    # last backward: torchtitan runs zero=1 with pp > 1 (not zero=1 without), and the
    # exported config is the FSDP one, which reads back as zero=1 whatever its reshard policy.
    titan = load_trainer("torchtitan")
    assert not trainer_reasons(titan, MODEL, TRAIN, parse_plan("tp=2,sp=1,pp=2,zero=1"), 16)
    from paraplan.importers.torchtitan import read_torchtitan
    for policy in ("default", "always", "never"):
        got = read_torchtitan({"training": {}, "activation_checkpoint": {"mode": "full"},
                               "parallelism": {
            "pipeline_parallel_degree": 2, "data_parallel_shard_degree": 4,
            "fsdp_reshard_after_forward": policy}})
        assert got.plan.zero_stage == 1
    flat = read_torchtitan({"training": {}, "activation_checkpoint": {"mode": "full"},
                            "parallelism": {"data_parallel_shard_degree": 4}})
    assert flat.plan.zero_stage == 3


def test_pipelined_fsdp_gradient_chains_by_hand():
    """torch.distributed.pipelining under FSDP reduces each stage's gradients in one chain
    after its last backward: after the schedule (1 chain, nothing hidden) since pytorch PR
    #165106, before each stage's last gradient send (pp chains) in torch 2.6. By hand: the
    steps differ by exactly the gradient reduce-scatters of the critical stage, and by
    (pp - 1) of them between the two; pp = 1 and DDP keep the overlapped reduction."""
    from paraplan.simulator.dp_sync import grad_sync_parts
    from paraplan.specs.topology import Topology

    model, cluster = load_model("llama2-13b"), load_cluster("dgx-h100", nodes=4)
    plan = parse_plan("tp=2,pp=4,dp=4,zero=1,mbs=1,sp=1")
    rep = {s: simulate(model, cluster, TRAIN.model_copy(update={"pp_grad_sync": s}), plan)
           for s in ("overlapped", "after_schedule", "cascade")}
    crit = max(range(4), key=lambda r: rep["cascade"].extra["stage_forward_s"][r]
               + rep["cascade"].extra["stage_backward_s"][r])
    layers = rep["cascade"].extra["layers_per_stage"]
    from paraplan.simulator.memory import params_per_stage
    dense, _ = params_per_stage(model, plan, layers, crit)
    group = tuple(2 * i for i in range(4))  # tp fastest, then dp: the DP group of rank 0
    grads, _ = grad_sync_parts(Topology(cluster), group, model, plan, TRAIN, dense)
    assert grads > 1e-3  # 13B / 8 over NVLink (the DP group of rank 0 is in one node)
    assert rep["cascade"].step_time_s - rep["after_schedule"].step_time_s == \
        pytest.approx(3 * grads, rel=1e-9)
    assert rep["after_schedule"].step_time_s > rep["overlapped"].step_time_s
    for other in (parse_plan("tp=2,pp=1,dp=16,zero=1,mbs=1,sp=1"),
                  parse_plan("tp=2,pp=4,dp=4,zero=0,mbs=1,sp=1")):
        times = {simulate(model, cluster, TRAIN.model_copy(update={"pp_grad_sync": s}),
                          other).step_time_s for s in ("overlapped", "cascade")}
        assert len(times) == 1
    # torchtitan's profile: after the schedule (the v0.2.2 era); its 2024-12 runs: cascade
    assert load_trainer("torchtitan").runs.pp_grad_sync == "after_schedule"


def test_async_tp_leaves_the_input_gradient_reduce_scatters_exposed():
    """PyTorch's async TP fuses each all-gather into the matmul reading it and each
    reduce-scatter into the one matmul writing it; a backward's input gradient is a sum of
    data gradients, so its reduce-scatter runs whole. By hand on one layer: the forward
    hides both collectives under a quarter of the GEMMs each, the backward only the
    all-gather; Transformer Engine's userbuffers hide both ways; the evaluator agrees."""
    from paraplan.search.space import SpaceOptions, evaluate_space, parse_fix
    from paraplan.simulator import collectives as coll
    from paraplan.simulator.compute import Device
    from paraplan.simulator.layer import layer_parts

    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", nodes=2)
    plan = parse_plan("tp=8,sp=1,mbs=2,tp_comm_overlap=1")
    topo = cluster.topology
    act = 2 * 4096 * model.hidden_size * 2
    gather = coll.group_collective(topo, tuple(range(8)), "all_gather", act)
    scatter = coll.group_collective(topo, tuple(range(8)), "reduce_scatter", act)
    asy = TRAIN.model_copy(update={"tp_overlap": "async_tp"})
    dev = Device.of_training(cluster.gpu, asy)
    parts = layer_parts(model, topo, asy, plan, dev, moe=False)
    cover = 0.25 * parts.times.gemm_fwd_s
    assert parts.tp_s == pytest.approx(coll.overlapped(gather + scatter, cover,
                                                       dev.nccl_slowdown))
    assert parts.tp_bwd_s == pytest.approx(coll.overlapped(gather, cover, dev.nccl_slowdown)
                                           + scatter)
    assert parts.tp_bwd_s > parts.tp_s  # (where the all-gather alone fits under the cover)
    ub = TRAIN.model_copy(update={"tp_overlap": "userbuffers"})
    ub_parts = layer_parts(model, topo, ub, plan, Device.of_training(cluster.gpu, ub),
                           moe=False)
    assert ub_parts.tp_bwd_s == pytest.approx(ub_parts.tp_s)
    space = build_space(model, cluster, asy, fix=parse_fix("tp_comm_overlap=1,sp=1"),
                        options=SpaceOptions(max_micro_batch=2))
    ev = evaluate_space(space, times_for_oom=True)
    rows = [i for i in np.random.default_rng(5).permutation(len(space)).tolist()
            if space.cols["tp"][i] > 1 and not space.cols["uneven"][i]][:15]
    assert len(rows) == 15
    for i in rows:
        rep = simulate(model, cluster, asy, space.plan(i), time_if_oom=True)
        assert ev.time["tp_comm"][i] == pytest.approx(rep.time_s["tp_comm"], rel=1e-6)
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-6)


def test_eager_loss_holds_the_fp32_logits_and_their_gradient():
    # torchtitan before 2025-02 compiled the blocks but not the loss: 14 B per logit on the
    # last stage (bf16 logits, fp32 upcast, log-softmax, gradient) instead of 6.
    from paraplan.simulator.memory import pipeline_memory
    model = load_model("llama3-8b")
    train = TrainingSpec(global_batch_size=16, seq_len=8192)
    plan = parse_plan("zero=3,mbs=2")
    fused = pipeline_memory(model, train, plan, dp=8, layers=[32], inflight=[1.0])[0]
    eager = pipeline_memory(model, train.model_copy(update={"loss_kernels": "eager"}), plan,
                            dp=8, layers=[32], inflight=[1.0])[0]
    assert eager.activations - fused.activations == pytest.approx(8.0 * 2 * 8192 * 128256)


def test_fp8_weight_casts_are_paid_once_per_step_where_the_trainer_caches_them():
    # Transformer Engine casts weights to fp8 on the first micro-batch and reuses them
    # (megatron-core passes is_first_microbatch): the per-GEMM weight cast disappears and the
    # optimizer step pays 4 B per parameter once; the evaluator and simulate agree.
    from paraplan.search.space import evaluate_space
    from paraplan.simulator.compute import Device, gemm_time
    from paraplan.simulator.grads import optimizer_step_time
    from paraplan.specs import load_gpu

    gpu = load_gpu("h100-sxm")
    plain, cached = Device.of(gpu, "fp8"), Device.of(gpu, "fp8", weight_cache=True)
    m, n, k = 8192.0, 8192.0, 8192.0
    assert gemm_time(plain, m, n, k) - gemm_time(cached, m, n, k) == pytest.approx(
        plain.fp8_cast_bytes * k * n / plain.memory_Bps)
    fp8 = TrainingSpec(global_batch_size=256, seq_len=4096, precision="fp8")
    assert optimizer_step_time(1e9, fp8, cached) - optimizer_step_time(1e9, fp8, plain) == \
        pytest.approx(4e9 / plain.memory_Bps)
    assert not Device.of(gpu, "bf16", weight_cache=True).fp8_weights_cached

    from paraplan.specs.trainer import trainer_training

    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", nodes=8)
    spec = load_trainer("megatron-core")
    space = build_space(model, cluster, trainer_training(spec, fp8),
                        {"pp": 4, "tp": 8, "sequence_parallel": True}, trainer=spec)
    assert space.training.fp8_weight_cache
    ev = evaluate_space(space, exact_interleaved=True, times_for_oom=True)
    for i in range(0, len(space), max(1, len(space) // 25)):
        plan = space.plan(i)
        rep = simulate(model, cluster, space.training, plan, time_if_oom=True)
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-9), plan.short()
        uncached = simulate(model, cluster,
                            space.training.model_copy(update={"fp8_weight_cache": False}), plan,
                            time_if_oom=True)
        assert rep.step_time_s < uncached.step_time_s


def test_fused_fp8_casts_write_both_layouts():
    # A fused fp8 cast writes the row-wise copy for the forward GEMM and the column-wise one
    # the weight-gradient GEMM needs (Hopper fp8 GEMMs are TN only): 2 B per input element;
    # eager torchao pays amax (2 B read) + cast (2 B read, 1 B write) = 5 B.
    import dataclasses

    from paraplan.simulator.compute import Device, gemm_time
    from paraplan.specs import load_gpu

    gpu = load_gpu("h100-sxm")
    m, n, k = 8192.0, 4096.0, 8192.0
    for kernels, per_elem in (("fused", 2.0), ("eager", 5.0)):
        dev = Device.of(gpu, "fp8", kernels)
        bare = dataclasses.replace(dev, fp8_cast_bytes=0.0)
        assert gemm_time(dev, m, n, k) - gemm_time(bare, m, n, k) == pytest.approx(
            per_elem * (m * k + k * n) / dev.memory_Bps)
    assert Device.of(gpu, "bf16").fp8_cast_bytes == 0.0


@pytest.mark.parametrize("copies,zero,regather,per_param", [
    ("per_param", 3, False, 2 * 2 * 2 + 2 + 4),  # two gathers copied out, bf16 -> fp32 pack
    ("per_param", 2, True, 1 * 2 * 2 + 2 + 4),   # reshard_after_forward=False: one gather
    ("per_param", 2, False, 2 + 4),              # gathered once per step: only the pack
    # FSDP1: the views' gradients concatenated (bf16), cast to fp32, pre-divided in place
    ("flat", 3, False, 2 * 2 + (2 + 4) + 2 * 4),
])
def test_fsdp_copies_are_charged_every_micro_batch(copies, zero, regather, per_param):
    # Hand-worked: the step grows by m x (parameters on the rank) x bytes / memory bandwidth,
    # in simulate and in the vectorized search evaluator alike.
    from paraplan.simulator.compute import Device
    from paraplan.simulator.memory import params_per_stage

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    training = TrainingSpec(global_batch_size=64, seq_len=4096, grad_reduce_fp32=True,
                            zero2_regather=regather)
    plan = parse_plan(f"tp=1,pp=1,dp=8,zero={zero},mbs=2")
    bare = simulate(model, cluster, training, plan)
    priced = simulate(model, cluster, training.model_copy(update={"fsdp_copies": copies}), plan)
    dense, experts = params_per_stage(model, plan, [model.num_layers], 0, [0])
    dev = Device.of(cluster.node_groups[0].gpu, "bf16")
    m = priced.extra["num_microbatches"]
    assert m == 4
    want = m * (dense + experts) * per_param / dev.memory_Bps
    # FSDP also updates its fp32 shards in place: no fp32 gradient or 16-bit weight copies
    # around the optimizer (grads.optimizer_bytes_per_param), on the 1/8 shard.
    from paraplan.simulator.grads import optimizer_bytes_per_param
    fsdp = training.model_copy(update={"fsdp_copies": copies})
    opt = (optimizer_bytes_per_param(fsdp) - optimizer_bytes_per_param(training)) * \
        (dense + experts) / 8 / dev.memory_Bps
    assert priced.step_time_s - bare.step_time_s == pytest.approx(want + opt, rel=1e-9)
    assert priced.time_s["compute"] - bare.time_s["compute"] == pytest.approx(want, rel=1e-9)
    # The vectorized evaluator the searchers rank with prices it the same way.
    from paraplan.search.space import evaluate_space, parse_fix

    trained = training.model_copy(update={"fsdp_copies": copies})
    space = build_space(model, cluster, trained, fix=parse_fix({"tp": 1, "pp": 1, "zero": zero}))
    ev = evaluate_space(space, times_for_oom=True)
    i = next(k for k in range(len(space)) if space.plan(k).short() == plan.short())
    assert ev.step_time_s[i] == pytest.approx(priced.step_time_s, rel=1e-9)
    assert ev.time["compute"][i] == pytest.approx(priced.time_s["compute"], rel=1e-9)


def test_trainer_profiles_name_their_fsdp():
    assert load_trainer("torchtitan").runs.fsdp_copies == "per_param"
    assert load_trainer("llm-foundry").runs.fsdp_copies == "flat"
    assert load_trainer("megatron-core").runs.fsdp_copies is None


def test_pytorch_ring_attention_merges_in_fp32():
    # Hand count for cp=4, bf16, 1000 query and 500 K+V elements (copies.eager_ring_bytes):
    # forward 3 merges x (0.75 x 38 + 4) B per query element + 3 K/V packs x 4 B + the first
    # step's cast and the final one (6 B each); backward 4 steps x (0.75 x 10 + 4 B per query
    # element, that + 8 per K/V element) + 3 K/V packs x 4 B + zeroing and casting back
    # (10 B per element).
    from paraplan.simulator.copies import eager_ring_bytes

    fwd, bwd, kernels = eager_ring_bytes(4, 1000.0, 500.0, 2.0)
    assert fwd == 3 * 32.5 * 1000 + 3 * 4 * 500 + 2 * 6 * 1000
    assert bwd == 4 * (11.5 * 1000 + 19.5 * 500) + 3 * 4 * 500 + 10 * 1500
    assert kernels == (32, 32)
    # In a plan: torchtitan's ring (eager fp32 merges, fp32 dK/dV ring) costs more than
    # Transformer Engine's for the same cp=4 plan; without cp both are the same.
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    fused = TrainingSpec(global_batch_size=8, seq_len=65536)
    eager = fused.model_copy(update={"cp_merge": "eager_fp32"})
    cp4 = parse_plan("tp=1,pp=1,dp=2,cp=4,zero=1,mbs=1,rc=full")
    assert (simulate(model, cluster, eager, cp4).step_time_s
            > simulate(model, cluster, fused, cp4).step_time_s)
    cp1 = parse_plan("tp=1,pp=1,dp=8,zero=1,mbs=1,rc=full")
    assert (simulate(model, cluster, eager, cp1).step_time_s
            == simulate(model, cluster, fused, cp1).step_time_s)
    assert load_trainer("torchtitan").runs.cp_merge == "eager_fp32"
    assert load_trainer("megatron-core").runs.cp_merge == "fused"


def _mpt7b_attention_with(**fact):
    """MPT-7b on 8 H100, mbs 6 x 2,048 tokens: (model, cluster, plain training, training with
    ``fact``, plan, device, plain (forward, backward) attention s, with ``fact``)."""
    from paraplan.simulator.compute import Device, attention_times

    model, cluster = load_model("mpt-7b"), load_cluster("dgx-h100")
    plain = TrainingSpec(global_batch_size=48, seq_len=2048)
    changed = plain.model_copy(update=fact)
    plan = parse_plan("tp=1,pp=1,dp=8,zero=3,mbs=6")
    dev = Device.of_training(cluster.gpu, plain)
    return (model, cluster, plain, changed, plan, dev,
            attention_times(model, plain, plan, dev)[1:],
            attention_times(model, changed, plan, dev)[1:])


def test_flash_attn_varlen_packing_moves_its_copies():
    # Hand count (copies.unpad_bytes), bf16, an MHA layer of width h: forward gathers q, k, v
    # (read + write: 4 B each) and scatters the output into zeros (zero, read, write: 6 B), 18h;
    # backward scatters dq, dk, dv into zeros (6 B each) and gathers the output's gradient
    # (4 B), 22h. MPT-7b (h 4096), 8 H100, mbs 6, seq 2048: per layer and micro-batch
    # 12,288 tokens x 18 (22) x 4096 B at 0.9 x 3.35 TB/s.
    from paraplan.simulator.copies import unpad_bytes

    assert unpad_bytes(3 * 2048.0, 2048.0, 2.0) == (18 * 2048, 22 * 2048)
    model, cluster, plain, packed, plan, dev, (f0, b0), (f1, b1) = \
        _mpt7b_attention_with(attention_unpad=True)
    tokens = 6 * 2048
    assert f1 - f0 == pytest.approx(tokens * 18 * 4096 / (0.9 * 3350e9))
    assert b1 - b0 == pytest.approx(tokens * 22 * 4096 / (0.9 * 3350e9))
    assert (simulate(model, cluster, packed, plan).step_time_s
            > simulate(model, cluster, plain, plan).step_time_s)


def test_torchtitan_repeated_kv_heads_pay_their_copies_ring_bytes_and_memory():
    # torchtitan repeated grouped-query K/V to the query heads before SDPA until ff0829c10
    # (2026-01-27): Llama 3 8B's 1,024-wide K and V become 4,096 wide. Hand count
    # (copies.kv_repeat_bytes), bf16, each way: eager copies read and write, 2 x (1024 +
    # 4096) x 2 B = 20,480 B per token; compiled, K's copy fuses into the rotary kernel (the
    # extra 3,072 written) and V pays its whole copy: (3072 + 5120) x 2 B = 16,384 B.
    from paraplan.simulator.compute import Device, attention_times, kv_widths
    from paraplan.simulator.copies import kv_repeat_bytes
    from paraplan.simulator.memory import layer_activation_bytes

    assert kv_repeat_bytes(1024, 1024, 4096, 4096, 2.0, fused=False) == 20480
    assert kv_repeat_bytes(1024, 1024, 4096, 4096, 2.0, fused=True) == 16384
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    native = TrainingSpec(global_batch_size=16, seq_len=8192, kernels="eager")
    repeated = native.model_copy(update={"kv_repeat": True})
    assert kv_widths(model, native) == (1024, 1024) and kv_widths(model, repeated) == (4096, 4096)
    plan = parse_plan("tp=1,pp=1,dp=8,zero=3,mbs=2")
    dev = Device.of_training(cluster.gpu, native)
    _, f0, b0 = attention_times(model, native, plan, dev)
    _, f1, b1 = attention_times(model, repeated, plan, dev)
    tokens = 2 * 8192
    assert f1 - f0 == pytest.approx(tokens * 20480 / dev.memory_Bps)
    assert b1 - b0 == pytest.approx(tokens * 20480 / dev.memory_Bps)
    # The attention inputs kept for the backward are the repeated K and V.
    grow = layer_activation_bytes(model, repeated, plan, 2, moe=False, recompute="none") - \
        layer_activation_bytes(model, native, plan, 2, moe=False, recompute="none")
    assert grow == pytest.approx(tokens * 2 * (2 * 3072))
    # PyTorch's ring attention exchanges and merges the repeated K/V: cp costs more.
    from paraplan.specs.trainer import trainer_training

    titan = trainer_training(load_trainer("torchtitan"), native)
    cp4 = parse_plan("tp=1,pp=1,dp=2,cp=4,zero=3,mbs=1,rc=full")
    base = simulate(model, cluster, titan, cp4)
    rep = simulate(model, cluster, titan.model_copy(update={"kv_repeat": True}), cp4)
    assert rep.time_s.get("cp_comm", 0.0) > base.time_s.get("cp_comm", 0.0)
    assert rep.step_time_s > base.step_time_s
    # Full multi-head attention has nothing to repeat.
    mha = load_model("mpt-7b")
    assert kv_widths(mha, repeated) == kv_widths(mha, native)


def test_a_split_fused_qkv_concatenates_its_gradients_in_the_backward():
    # torch.split's backward is a cat: Megatron-LM 2021 (split_tensor_along_last_dim), its
    # Megatron-DeepSpeed fork and llm-foundry (qkv.split after Wqkv) read and write dq, dk, dv
    # once more. Hand count (copies.qkv_cat_bytes), bf16, MPT-7b (q, k, v 4,096 wide each),
    # tp=1: 2 x 2 B x 12,288 = 49,152 B per token, backward only.
    from paraplan.simulator.copies import qkv_cat_bytes

    assert qkv_cat_bytes(3 * 4096.0, 2.0) == 49152
    *_, dev, (f0, b0), (f1, b1) = _mpt7b_attention_with(qkv_split_cat=True)
    assert f1 == f0
    assert b1 - b0 == pytest.approx(6 * 2048 * 49152 / dev.memory_Bps)
    assert {name: load_trainer(name).runs.qkv_split_cat for name in (
        "megatron-lm-2021", "megatron-deepspeed-2022", "llm-foundry", "megatron-core",
        "torchtitan")} == {"megatron-lm-2021": True, "megatron-deepspeed-2022": True,
                           "llm-foundry": True, "megatron-core": False, "torchtitan": False}


def test_fsdp_zero2_gathers_the_parameters_every_micro_batch():
    # FSDP reshards after every backward, so its ZeRO-2 with accumulation all-gathers the
    # parameters once per micro-batch (m), not once per step (DeepSpeed stage 2), and does so
    # per layer as ZeRO-3 does (one gather for the forward, one reduce-scatter), prefetched
    # under that micro-batch's compute. DeepSpeed's stage 2 reduce-scatters m times in
    # buckets and gathers once; without overlap every bucket is exposed.
    from paraplan.simulator import collectives as coll
    from paraplan.simulator.compute import Device
    from paraplan.simulator.dp_sync import grad_sync_parts
    from paraplan.simulator.memory import params_per_stage

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    once = TrainingSpec(global_batch_size=128, seq_len=4096)
    again = once.model_copy(update={"zero2_regather": True})
    plan = parse_plan("tp=1,pp=1,dp=16,zero=2,mbs=2").model_copy(
        update={"overlap_grad_reduce": False})
    a, b = simulate(model, cluster, once, plan), simulate(model, cluster, again, plan)
    m = a.extra["num_microbatches"]
    assert m == 4
    topo, group = cluster.topology, tuple(range(16))
    dense, _ = params_per_stage(model, plan, [model.num_layers], 0, [0])
    grads, params = grad_sync_parts(topo, group, model, plan, once, dense)
    assert params > 0
    assert a.time_s["dp_comm"] == pytest.approx(m * grads + params, rel=1e-9)
    units = model.num_layers
    gather = units * coll.group_collective(topo, group, "all_gather",
                                           dense * again.param_gather_bytes(16) / units)
    scatter = units * coll.group_collective(topo, group, "reduce_scatter",
                                            dense * again.grad_reduce_bytes / units)
    compute = b.extra["stage_forward_s"][0] + b.extra["stage_backward_s"][0]
    per_mb = gather + scatter
    slow = Device.of_training(cluster.gpu, again).nccl_slowdown
    exposed = m * (max(0.0, per_mb - compute) + min(per_mb, compute) * slow) + gather / units
    assert b.time_s["dp_comm"] == pytest.approx(exposed, rel=1e-9)
    assert load_trainer("torchtitan").runs.zero2_regather is True
    assert load_trainer("deepspeed").runs.zero2_regather is False


def test_torchtitan_trains_fp8_as_its_float8_converter_runs_it(tmp_path: Path):
    """torchtitan v0.2.2 trains fp8 with torchao's tensorwise Float8Linear: the export writes
    the converter, torch.compile and fp8 FSDP all-gathers; the import reads them back; the
    all-gathers are priced at 1 byte per parameter (half the bf16 volume)."""
    from paraplan.importers import read_trainer_config

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    titan = load_trainer("torchtitan")
    fp8 = TrainingSpec(global_batch_size=32, seq_len=8192, precision="fp8")
    plan = parse_plan("zero=3,mbs=2,rc=op")
    training, applied = apply_trainer(titan, fp8, plan)
    assert training.kernels == "fused" and training.fp8_param_gather  # compiled, fp8 gathers
    assert training.param_gather_bytes(16) == 1 and training.param_gather_bytes(1) == 2
    ctx = export_context(model, training, applied, cluster=cluster)
    text = export_text("torchtitan", ctx)
    data = tomllib.loads(text)
    assert data["model"]["converters"] == ["quantize.linear.float8"]
    assert data["compile"]["enable"] is True
    assert data["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] is True
    assert exported_keys("torchtitan", text) <= recorded_keys("torchtitan")
    path = tmp_path / "fp8.toml"
    path.write_text(text)
    back = read_trainer_config(path, text)
    assert back.training["precision"] == "fp8" and back.training["fp8_param_gather"]
    assert back.training["kernels"] == "fused"
    # Without [compile] the import says eager, so fp8 is not priced as compiled.
    no_compile = text.replace("[compile]\nenable = true", "[compile]\nenable = false")
    assert read_trainer_config(path, no_compile).training["kernels"] == "eager"
    # The user's own fp8_param_gather=False is what the export writes.
    mine = training.model_copy(update={"fp8_param_gather": False})
    off = tomllib.loads(export_text("torchtitan", export_context(model, mine, applied,
                                                                 cluster=cluster)))
    assert not off["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"]
    # DDP (zero=0) has nothing to gather: the flag is written off.
    ddp = export_context(model, training, applied.model_copy(update={"zero_stage": 0}),
                         cluster=cluster)
    assert not tomllib.loads(export_text("torchtitan", ddp))["quantize"]["linear"]["float8"][
        "enable_fsdp_float8_all_gather"]
    # Pricing: the same plan with 16-bit gathers moves twice the parameter bytes.
    with_fp8 = simulate(model, cluster, training, plan, trainer=titan)
    bf16_gathers = simulate(model, cluster, training.model_copy(
        update={"fp8_param_gather": False}), plan, trainer=titan)
    assert with_fp8.feasible and bf16_gathers.feasible
    assert with_fp8.time_s["dp_comm"] < bf16_gathers.time_s["dp_comm"]
    # FSDP over context-parallel ranks alone (dp = 1) gathers in 16 bits (dp_shard_enabled).
    long = fp8.model_copy(update={"global_batch_size": 2, "seq_len": 65536})
    cp_only = parse_plan("cp=8,zero=3,mbs=1,rc=full")
    a = simulate(model, load_cluster("dgx-h100", nodes=1), long, cp_only, trainer=titan)
    b = simulate(model, load_cluster("dgx-h100", nodes=1), long.model_copy(
        update={"fp8_param_gather": False}), cp_only, trainer=titan)
    assert a.feasible and a.time_s["dp_comm"] > 0
    assert a.time_s["dp_comm"] == b.time_s["dp_comm"]
    # Experts are not nn.Linear: torchtitan has no (non-prototype) fp8 for MoE models.
    moe_model = load_model("mixtral-8x7b")
    assert any("fp8" in r for r in trainer_reasons(titan, moe_model, fp8,
                                                   parse_plan("ep=8,zero=3"), 4))
    with pytest.raises(SpecError, match="mixture-of-experts models in fp8"):
        search(moe_model, cluster, fp8, top=1, trainer="torchtitan")
    # The searcher prices fp8 gathers as simulate does, and its best plan exports.
    rep = search(model, cluster, fp8, top=1, trainer="torchtitan", fix="zero=3").reports[0]
    top = parse_plan({k: v for k, v in rep.plan.items() if v is not None})
    again = simulate(model, cluster, fp8, top, trainer="torchtitan")
    assert again.step_time_s == pytest.approx(rep.step_time_s, rel=1e-9)
    assert "quantize.linear.float8" in export_text(
        "torchtitan", export_context(model, fp8, top, cluster=cluster))


def test_pytorch_all_gather_rotater_hides_under_one_attention_step():
    """torchtitan's default rotate method gathers every rank's K/V in one all-gather that only
    the first of the cp attention steps covers (PyTorch ``_AllGatherRotater``); the backward
    gathers again and passes dK/dV round the ring. By hand for tp=8, cp=4 across 4 nodes."""
    from paraplan.simulator import collectives as coll
    from paraplan.simulator.compute import Device
    from paraplan.simulator.layer import layer_parts

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=4)
    ring = TrainingSpec(global_batch_size=8, seq_len=8192)
    gather = ring.model_copy(update={"cp_kv_exchange": "allgather"})
    plan = parse_plan("tp=8,cp=4,sp=1,mbs=1")
    topo, dev = cluster.topology, Device.of_training(cluster.gpu, ring)
    ring_p = layer_parts(model, topo, ring, plan, dev, moe=False)
    ag_p = layer_parts(model, topo, gather, plan, dev, moe=False)
    lt, ring_c, ag_c, ag_b = ring_p.times, ring_p.cp_s, ag_p.cp_s, ag_p.cp_bwd_s
    att = model.attention
    kv = 1 * 8192 / 4 * (att.k_width + att.v_width) * 2 / 8
    all_gather = coll.group_collective(topo, (0, 8, 16, 24), "all_gather", 4 * kv)
    first = lt.attention_fwd_s / 4
    assert ag_c == pytest.approx(max(0.0, all_gather - first)
                                 + min(all_gather, first) * dev.nccl_slowdown)
    assert ag_b == pytest.approx(ag_c + ring_c)  # 16-bit dK/dV round the ring
    assert ag_c > ring_c
    assert load_trainer("torchtitan").runs.cp_kv_exchange == "allgather"
    assert load_trainer("megatron-core").runs.cp_kv_exchange == "ring"
