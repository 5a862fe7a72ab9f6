"""Interleaved layer splits the searchers consider: equal chunks, and Megatron-Core's split that
counts the embedding and the loss as a pipeline layer each (``stages.accounted_split``), which
NVIDIA's Llama 3.1 405B and Qwen3-235B recipes run."""

from __future__ import annotations

import shlex

import numpy as np
import pytest

from paraplan import TrainingSpec, load_cluster, load_model, simulate
from paraplan.export import export_context, export_text
from paraplan.search.space import SpaceOptions, build_space, evaluate_space
from paraplan.simulator.pipeline import SCHEDULES
from paraplan.simulator.stages import accounted_split, pipeline_chunks
from paraplan.specs.loaders import load_trainer
from paraplan.specs.trainer import trainer_reasons, trainer_training

INTERLEAVED = SCHEDULES.index("interleaved")


def test_pipeline_chunks_are_even_where_the_layers_divide_else_megatrons_accounted_split():
    assert pipeline_chunks(80, 4, 5) == [4] * 20
    assert pipeline_chunks(126, 16, 1) == [8] * 14 + [7] * 2  # remainder on the first stages
    assert pipeline_chunks(126, 16, 8) == [0] + [1] * 126 + [0]
    assert pipeline_chunks(126, 16, 4) == [1] + [2] * 62 + [1]
    assert pipeline_chunks(94, 8, 3) == accounted_split(94, 8, 3) == [3] + [4] * 22 + [3]
    assert pipeline_chunks(80, 4, 3) is None  # neither 80 nor 82 splits into 12 chunks


def _space(trainer: str | None):
    model, cl = load_model("llama3-405b"), load_cluster("dgx-h100", nodes=32)
    tr = TrainingSpec(global_batch_size=512, seq_len=4096)
    spec = None if trainer is None else load_trainer(trainer)
    if spec is not None:
        tr = trainer_training(spec, tr)
    opts = SpaceOptions(max_micro_batch=1)
    return build_space(model, cl, tr, fix={"tp": 8, "cp": 1}, options=opts, trainer=spec)


def _shapes(space) -> set[tuple[int, int]]:
    c = space.cols
    rows = (c["sched"] == INTERLEAVED) & (c["uneven"] == 1)
    return set(zip(c["pp"][rows].tolist(), c["v"][rows].tolist(), strict=True))


def test_the_space_holds_accounted_interleaved_splits_the_trainer_can_run():
    """126 layers + embedding + loss = 128 slots: pp=16 with 2, 4 or 8 chunks per rank (8: the
    first and last chunk hold no decoder layer), pp=8 with 2..16, pp=4 with 2..32. The plan a
    row names carries the split; torchtitan, which gives every chunk a layer, gets only the
    splits without empty chunks; DeepSpeed none (it splits evenly)."""
    space = _space("megatron-core")
    shapes = _shapes(space)
    assert {(16, 2), (16, 4), (16, 8), (8, 16), (4, 32)} <= shapes
    row = int(np.flatnonzero((space.cols["pp"] == 16) & (space.cols["v"] == 8))[0])
    plan = space.plan(row)
    assert plan.layers_per_stage == [0] + [1] * 126 + [0]
    tr = space.training
    assert trainer_reasons(load_trainer("megatron-core"), space.model, tr, plan) == []
    titan = _shapes(_space("torchtitan"))
    assert (16, 4) in titan and (16, 8) not in titan and (4, 32) not in titan
    assert "empty first or last chunk" in " ".join(
        trainer_reasons(load_trainer("torchtitan"), space.model, tr, plan))
    assert not _shapes(_space("deepspeed"))


def test_the_evaluator_prices_accounted_splits_as_simulate_does():
    """Memory exactly; the step time is the closed form on the stage classes (marked inexact,
    so the searchers simulate such finalists), within 1% of the event simulation here."""
    space = _space(None)
    ev = evaluate_space(space, times_for_oom=True)
    c = space.cols
    rows = np.flatnonzero((c["sched"] == INTERLEAVED) & (c["uneven"] == 1))
    assert len(rows) and not ev.exact[rows].any()
    model, cl, tr = space.model, space.cluster, space.training
    for i in rows[:: max(1, len(rows) // 12)].tolist():
        rep = simulate(model, cl, tr, space.plan(i), time_if_oom=True)
        assert ev.peak_gib[i] == pytest.approx(rep.memory_gb["peak"], rel=1e-9)
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=0.01)


def test_search_returns_nvidias_405b_gb200_layout_and_megatron_can_run_it():
    """NVIDIA's Llama 3.1 405B MXFP8 recipe on 256 GB200 (tp=4 pp=16 vpp=8: [embedding] +
    126 x [1] + [loss]) is in the searched space and ranks first; exported, its split is
    Megatron's pipeline layout with the embedding and the loss as chunks of their own."""
    from paraplan.validate.recipes import check_recipe, recipe_cases

    case = next(c for c in recipe_cases(("megatron_bridge_dense",))
                if c.plan.virtual_stages == 8 and c.cluster.gpu.name == "gb200")
    row = check_recipe(case)
    assert row["recipe_in_space"] and row["rank"] == 1
    ctx = export_context(case.model, case.training, case.plan, cluster=case.cluster)
    text = export_text("megatron", ctx, report=simulate(
        case.model, case.cluster, case.training, case.plan, time_if_oom=True).to_dict())
    layout = next(line for line in text.splitlines() if "pipeline-model-parallel-layout" in line)
    segments = shlex.split(layout.rstrip("\\"))[-1].split("|")  # quoted for bash
    assert segments[0] == "E" and segments[-1] == "L" and segments[1:-1] == ["t"] * 126


@pytest.mark.parametrize("case", [
    ("llama3-405b", "dgx-h100", 32, 512, 4096, {}, 0.9),
    # pp up to 64 with few micro-batches: the fill and drain the bound counts dominate
    ("llama3-405b", "dgx-h100", 2048, 2048, 8192, {}, 0.85),
    ("deepseek-moe-16b", "dgx-h100", 2, 128, 4096, {"moe_a2a_overlap": True}, 0.9),
    ("llama2-13b", "dgx-h100", 4, 256, 4096, {}, 0.9),
])
def test_the_lower_bound_never_exceeds_what_simulate_returns(case) -> None:
    """``Evaluation.lower_s`` (the searchers' stop rule) is at most the step time
    ``simulate`` gives, on every schedule, with uneven and accounted splits and the MoE
    all-to-all overlap; it is the step time itself where that is exact."""
    name, cluster, nodes, batch, seq, more, tight = case
    model, cl = load_model(name), load_cluster(cluster, nodes=nodes)
    tr = TrainingSpec(global_batch_size=batch, seq_len=seq, **more)
    space = build_space(model, cl, tr, options=SpaceOptions(max_micro_batch=2))
    ev = evaluate_space(space, times_for_oom=True, exact_interleaved=True)
    assert (ev.lower_s[ev.exact] == ev.step_time_s[ev.exact]).all()
    uneven = np.flatnonzero(space.cols["uneven"] == 1)
    assert len(uneven)
    rng = np.random.default_rng(3)
    ratios = []
    for i in rng.choice(uneven, size=min(60, len(uneven)), replace=False).tolist():
        rep = simulate(model, cl, tr, space.plan(i), time_if_oom=True)
        assert ev.lower_s[i] <= rep.step_time_s * (1 + 1e-9), space.plan(i).short()
        if ev.feasible[i]:
            ratios.append(ev.lower_s[i] / rep.step_time_s)
    assert ratios and float(np.median(ratios)) > tight  # tight enough to prune
