"""The MoE run settings a search chooses per plan: token dispatcher (NCCL all-to-all or
DeepEP) and the expert-parallel all-to-all overlap, each priced and checked against the
trainer's rules, the trainer's own setting first, the user's choice kept."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from paraplan import TrainingSpec, load_cluster, load_model, simulate
from paraplan.export import export_context, export_text
from paraplan.search import run_training, search
from paraplan.search.moe_runs import moe_runs
from paraplan.specs import ParallelPlan
from paraplan.specs.loaders import load_trainer
from paraplan.specs.trainer import trainer_reasons, trainer_training
from tests.test_cli import run

MIXTRAL = load_model("mixtral-8x7b")
TRAINING = TrainingSpec(global_batch_size=256, seq_len=4096)


def _settings(runs: list[TrainingSpec]) -> list[tuple[str, bool]]:
    return [(r.moe_dispatcher, r.moe_a2a_overlap) for r in runs]


def test_moe_runs_are_every_setting_the_trainer_has_its_own_first():
    mc = load_trainer("megatron-core")
    tr = trainer_training(mc, TRAINING)
    assert _settings(moe_runs(MIXTRAL, tr, mc, {}, set())) == [
        ("alltoall", False), ("alltoall", True), ("hierarchical", False),
        ("hierarchical", True)]
    # A trainer that overlaps by default still ranks first without the overlap: only that
    # setting ranks plans without expert parallelism (searches after the first see ep > 1).
    overlapping = tr.model_copy(update={"moe_a2a_overlap": True})
    assert _settings(moe_runs(MIXTRAL, overlapping, mc, {}, set()))[:2] == [
        ("alltoall", False), ("alltoall", True)]
    # What the user set stays set; the rest is still searched.
    pinned = TrainingSpec(global_batch_size=256, seq_len=4096, moe_dispatcher="hierarchical")
    runs = moe_runs(MIXTRAL, trainer_training(mc, pinned), mc, {}, pinned.model_fields_set)
    assert _settings(runs) == [("hierarchical", False), ("hierarchical", True)]
    # DeepEP drops no tokens: a pinned capacity factor leaves it out.
    assert _settings(moe_runs(MIXTRAL, tr, mc, {"moe_capacity_factor": 1.25}, set())) == [
        ("alltoall", False), ("alltoall", True)]
    # torchtitan has one dispatcher and no overlap; dense models and trainer-less searches
    # (the plan fields' defaults) have nothing to choose.
    tt = load_trainer("torchtitan")
    assert _settings(moe_runs(MIXTRAL, trainer_training(tt, TRAINING), tt, {}, set())) == [
        ("alltoall", False)]
    assert moe_runs(load_model("llama3-8b"), tr, mc, {}, set()) == [tr]
    assert moe_runs(MIXTRAL, TRAINING, None, {}, set()) == [TRAINING]


def test_search_ranks_each_plan_under_the_run_setting_it_was_priced_with():
    cl = load_cluster("dgx-h100", nodes=4)
    res = search(MIXTRAL, cl, TRAINING, top=6, trainer="megatron-core")
    mc = load_trainer("megatron-core")
    base = trainer_training(mc, TRAINING)
    assert len(res.extra["moe_runs"]) == 4 and "4 run settings" in res.notes[-1]
    keys = [json.dumps(r.plan, sort_keys=True) for r in res.reports]
    assert len(set(keys)) == len(keys) == 6
    times = [r.step_time_s for r in res.reports]
    assert times == sorted(times)
    for rep in res.reports:
        plan = ParallelPlan.model_validate(rep.plan)
        tr = run_training(base, rep)
        assert (tr.moe_dispatcher, tr.moe_a2a_overlap) == (rep.extra["moe_dispatcher"],
                                                           rep.extra["moe_a2a_overlap"])
        assert not trainer_reasons(mc, MIXTRAL, tr, plan, rep.extra["num_microbatches"])
        again = simulate(MIXTRAL, cl, tr, plan, trainer=mc)
        assert again.step_time_s == pytest.approx(rep.step_time_s, rel=1e-9)
    # Choosing among the settings never loses to the trainer's own setting alone.
    plain = search(MIXTRAL, cl, TrainingSpec(global_batch_size=256, seq_len=4096,
                                             moe_dispatcher="alltoall", moe_a2a_overlap=False),
                   top=1, trainer="megatron-core")
    assert "moe_runs" not in plain.extra
    assert res.best.step_time_s <= plain.best.step_time_s * (1 + 1e-12)
    assert res.plans_evaluated > plain.plans_evaluated


def test_best_exports_the_run_setting_of_its_plan(tmp_path):
    out = tmp_path / "run.sh"
    res = run("best", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "4",
              "--global-batch", "256", "--seq-len", "4096", "--top", "1", "--export",
              "megatron", "--out", str(out), "--format", "json")
    assert res.returncode == 0, res.stderr
    best = json.loads(res.stdout)["plans"][0]
    text = out.read_text()
    plan = best["plan"]
    deepep = best["moe_dispatcher"] == "hierarchical" and plan["ep"] * (plan["etp"] or
                                                                        plan["tp"]) > 1
    assert ("--moe-enable-deepep" in text) == deepep
    assert ("--overlap-moe-expert-parallel-comm" in text) == bool(best["moe_a2a_overlap"])
    # The user's --moe-dispatcher is kept: every plan then runs the NCCL all-to-all.
    res = run("best", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "4",
              "--global-batch", "256", "--seq-len", "4096", "--top", "3",
              "--moe-dispatcher", "alltoall", "--format", "json")
    assert res.returncode == 0, res.stderr
    assert {p["moe_dispatcher"] for p in json.loads(res.stdout)["plans"]} == {"alltoall"}


def test_export_of_a_searched_plan_writes_its_dispatcher():
    cl = load_cluster("dgx-h100", nodes=4)
    res = search(MIXTRAL, cl, TrainingSpec(global_batch_size=256, seq_len=4096,
                                           moe_dispatcher="hierarchical"),
                 top=1, trainer="megatron-core", fix="ep=8")
    best = res.best
    assert best.extra["moe_dispatcher"] == "hierarchical"
    tr = run_training(trainer_training(load_trainer("megatron-core"), TRAINING), best)
    text = export_text("megatron", export_context(MIXTRAL, tr,
                                                  ParallelPlan.model_validate(best.plan),
                                                  cluster=cl))
    assert "--moe-enable-deepep" in text


def test_the_overlap_keeps_one_more_layer_of_activations():
    """Megatron-Core warms up one forward more under the all-to-all overlap (schedules.py),
    then runs each forward merged layer by layer with the oldest live micro-batch's backward,
    releasing each backward layer as it goes (model_chunk_schedule_plan.py): the plain
    schedule's peak plus one layer of a model chunk."""
    from paraplan.simulator.memory import GiB, layer_activations
    from paraplan.simulator.moe import a2a_overlap_warmup
    from paraplan.simulator.pipeline import inflight_microbatches

    assert inflight_microbatches("1f1b", 1, 8, 0) == 1.0
    assert inflight_microbatches("1f1b", 1, 8, 0, extra=0.25) == 1.25
    assert inflight_microbatches("1f1b", 1, 1, 0, extra=0.25) == 1.0  # nothing to pair with
    # Interleaved p=4, v=2, m=8, stage 0: (2*3 + 1*4 + 1) / 2 chunk-forwards, one layer more.
    assert inflight_microbatches("interleaved", 4, 8, 0, v=2) == 5.5
    assert inflight_microbatches("interleaved", 4, 8, 0, v=2, extra=0.5) == 5.75
    cl = load_cluster("dgx-h100", nodes=4)
    plan = ParallelPlan(tp=1, pp=1, ep=8, zero_stage=1, micro_batch_size=1)
    mem = {}
    for overlap in (False, True):
        tr = TrainingSpec(global_batch_size=256, seq_len=4096, moe_a2a_overlap=overlap)
        mem[overlap] = simulate(MIXTRAL, cl, tr, plan, time_if_oom=True).memory_gb
    assert a2a_overlap_warmup(MIXTRAL, tr, plan) == 1 / MIXTRAL.num_layers
    one_layer = layer_activations(MIXTRAL, tr, plan).moe / GiB
    assert mem[True]["activations"] - mem[False]["activations"] == pytest.approx(one_layer)
    # Interleaved: one layer of a chunk (L / (p v) layers), in chunk micro-batches.
    piped = ParallelPlan(tp=1, pp=4, ep=8, schedule="interleaved", virtual_stages=2)
    assert a2a_overlap_warmup(MIXTRAL, tr, piped) == pytest.approx(8 / MIXTRAL.num_layers)
    # ep = 1: no all-to-all to overlap, nothing extra.
    dense_ep = ParallelPlan(tp=1, pp=1, ep=1, zero_stage=3, micro_batch_size=1)
    on = simulate(MIXTRAL, cl, tr, dense_ep, time_if_oom=True).memory_gb
    off = simulate(MIXTRAL, cl, TRAINING, dense_ep, time_if_oom=True).memory_gb
    assert on["activations"] == pytest.approx(off["activations"])


def test_validate_recipes_ranks_an_moe_recipe_under_every_run_setting():
    from paraplan.validate.recipes import RECIPE_SOURCES, check_recipe, recipe_cases

    assert "megatron_bridge_moe" in RECIPE_SOURCES
    cases = [c for c in recipe_cases(("megatron_bridge_moe",)) if c.num_gpus == 8]
    assert cases and all(c.model.is_moe for c in cases)
    row = check_recipe(cases[0])  # Qwen3-30B-A3B on 8 GPUs, DeepEP without the overlap
    assert row["status"] == "ok" and row["recipe_run"] == "deepep"
    assert (f"moe deepep -> {row['best_run']}" in row["changed"]) == (row["best_run"] != "deepep")
    assert row["best_run"] in ("alltoall", "alltoall + a2a-overlap", "deepep",
                               "deepep + a2a-overlap")
    assert row["gain"] == pytest.approx(row["recipe_step_time_s"] / row["best_step_time_s"])
    assert row["recipe_in_space"] and row["recipe_fits"]
    assert row["gain"] >= 1 - 1e-9 and row["plans_ranked"] > row["rank"] >= 1
    # Each plan is ranked once, at its fastest setting: the same plans as under the recipe's
    # own setting (the settings change no plan's memory here), each as fast or faster.
    from paraplan.search.space import build_space, evaluate_space

    own = build_space(cases[0].model, cases[0].cluster, cases[0].training,
                      trainer=load_trainer("megatron-core"))
    ev = evaluate_space(own, exact_interleaved=True)
    assert row["plans_ranked"] == int(ev.feasible.sum())
    own_rank = 1 + int((ev.feasible & (ev.step_time_s < row["recipe_step_time_s"]
                                       * (1 - 1e-9))).sum())
    assert row["rank"] >= own_rank


def test_no_overlapped_setting_where_the_run_cannot_overlap():
    mc = load_trainer("megatron-core")
    fp32 = TrainingSpec(global_batch_size=256, seq_len=4096, precision="fp32")
    runs = moe_runs(MIXTRAL, trainer_training(mc, fp32), mc, {}, fp32.model_fields_set)
    assert _settings(runs) == [("alltoall", False), ("hierarchical", False)]


def test_a_saved_best_result_is_priced_and_exported_as_ranked(tmp_path):
    args = ("--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "4",
            "--global-batch", "256", "--seq-len", "4096")
    saved = tmp_path / "best.json"
    res = run("best", *args, "--top", "1", "--format", "json")
    assert res.returncode == 0, res.stderr
    saved.write_text(res.stdout)
    best = json.loads(res.stdout)["plans"][0]
    res = run("simulate", *args, "--plan", str(saved), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["step_time_s"] == pytest.approx(best["step_time_s"],
                                                                  rel=1e-9)
    out = tmp_path / "run.sh"
    res = run("export", str(saved), "--to", "megatron", *args, "--out", str(out))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert ("--overlap-moe-expert-parallel-comm" in text) == bool(best["moe_a2a_overlap"])
    assert ("--moe-enable-deepep" in text) == (best["moe_dispatcher"] == "hierarchical"
                                               and best["plan"]["ep"] > 1)


def test_sweeps_and_fronts_keep_the_run_settings_free():
    from paraplan.search.pareto import pareto_front
    from paraplan.sweep import _variant

    cl = load_cluster("dgx-h100", nodes=4)
    _, tr = _variant(cl, TRAINING, "global_batch", 512)
    assert tr.global_batch_size == 512 and "moe_dispatcher" not in tr.model_fields_set
    front = pareto_front(MIXTRAL, cl, TRAINING, nodes=[4], limit=5,
                         trainer=load_trainer("megatron-core"))
    assert front and all(p.moe_dispatcher in ("alltoall", "hierarchical") for p in front)
    best = search(MIXTRAL, cl, TRAINING, top=1, trainer="megatron-core").best
    assert front[0].step_time_s == pytest.approx(best.step_time_s, rel=1e-9)


def test_frames_say_which_setting_each_moe_plan_was_ranked_under():
    from paraplan.sweep import sweep

    cl = load_cluster("dgx-h100", nodes=4)
    res = search(MIXTRAL, cl, TRAINING, top=3, trainer="megatron-core")
    frame = res.to_frame()
    labels = {"alltoall", "alltoall + a2a-overlap", "deepep", "deepep + a2a-overlap"}
    assert set(frame["moe_run"]) <= labels and frame["moe_run"].notna().all()
    dense = search(load_model("llama3-8b"), cl, TrainingSpec(global_batch_size=64,
                                                             seq_len=4096), top=2)
    assert dense.to_frame()["moe_run"].isna().all()
    swept = sweep(MIXTRAL, cl, TRAINING, parameter="global_batch", values=[256],
                  trainer="megatron-core")
    assert swept["moe_run"].iloc[0] in labels


def test_derived_spaces_equal_spaces_built_for_the_setting():
    """The searches under a second MoE run setting take the first space's ep > 1 plans and
    the setting's own trainer rules: the same plans, in the same order, as building it."""
    from paraplan.search.space import SpaceOptions, build_space
    from paraplan.search.space.build import derive_space

    mc = load_trainer("megatron-core")
    cl = load_cluster("dgx-h100", nodes=4)
    runs = moe_runs(MIXTRAL, trainer_training(mc, TRAINING), mc, {}, set())
    base = build_space(MIXTRAL, cl, runs[0], trainer=mc)
    only_ep = SpaceOptions(expert_parallel_only=True)
    for setting in runs[1:]:
        got = derive_space(base, setting)
        want = build_space(MIXTRAL, cl, setting, options=only_ep, trainer=mc)
        assert got.training == setting and len(got) == len(want) > 0
        assert all(np.array_equal(got.cols[k], want.cols[k]) for k in want.cols)
        assert got.rejected == {k: v for k, v in want.rejected.items()
                                if "overlap" in k}
    with pytest.raises(ValueError):
        derive_space(derive_space(base, runs[1]), runs[2])  # an overlapped base


def test_deepseek_recipes_carry_nvidias_layout():
    """NVIDIA's DeepSeek-V3 recipes lay 61 layers out by Megatron-Bridge's table
    (_get_deepseek_v3_pipeline_layout): four decoders per chunk, the last chunk one decoder
    beside the MTP layer and the loss; the rows say so instead of guessing."""
    from paraplan.validate.recipes import recipe_cases
    from paraplan.validate.rows import LAYOUT_GUESSED

    cases = [c for c in recipe_cases(("megatron_bridge_moe",))
             if c.model.name.startswith("deepseek")]
    assert {(c.plan.pp, c.plan.virtual_stages) for c in cases} == {(8, 2), (16, 1), (4, 4)}
    for c in cases:
        assert list(c.plan.layers_per_stage) == [4] * 15 + [1]
        assert not any(LAYOUT_GUESSED in note for note in c.assumptions)


def test_recipe_with_a_guessed_layout_is_priced_at_its_best_split():
    """A recipe laid out by hand where paraplan only has the near-even guess (here
    DeepSeek-V3's dgxc recipe, tp=2 pp=16 on 1,024 H100, given that guess): the guess puts
    the LM head and the MTP module on a last stage as full as the others, so validate-recipes
    prices the recipe at the exact layer-partition DP's split, as best re-splits its own
    plans."""
    from paraplan.simulator.step import simulate
    from paraplan.validate.recipes import _recipe_layout, recipe_cases
    from paraplan.validate.rows import LAYOUT_GUESSED

    case = next(c for c in recipe_cases(("megatron_bridge_moe",))
                if c.model.name.startswith("deepseek") and c.num_gpus == 1024)
    guess = [4] * 13 + [3] * 3  # even_split(61, 16)
    case = dataclasses.replace(
        case, plan=case.plan.model_copy(update={"layers_per_stage": guess}),
        assumptions=(f"layers per pipeline chunk {guess} ({LAYOUT_GUESSED})",))
    trainer = load_trainer("megatron-core")
    even = simulate(case.model, case.cluster, case.training,
                    case.plan.model_copy(update={"dp": None}), trainer=trainer,
                    time_if_oom=True)
    split = _recipe_layout(case, trainer, even)
    assert split is not None and split.feasible
    layers = split.plan["layers_per_stage"]
    assert sum(layers) == case.model.num_layers and len(layers) == 16
    assert layers[-1] < max(layers)  # the head and MTP stage holds fewer layers
    assert split.step_time_s < even.step_time_s
    # A recipe whose layout paraplan was given is left alone.
    stated = dataclasses.replace(case, assumptions=())
    assert _recipe_layout(stated, trainer, even) is None


def test_later_run_settings_only_simulate_what_can_reach_the_top_and_rank_the_same():
    # search() hands each later run setting the top-th best time found so far (a cutoff):
    # its searcher simulates only plans that can beat it. The merged ranking must be the one
    # of every setting searched in full.
    from paraplan.search.dispatch import _merge
    from paraplan.search.exhaustive import exhaustive_search
    from paraplan.search.space import SpaceOptions

    cl = load_cluster("dgx-h100", nodes=4)
    mc = load_trainer("megatron-core")
    fast = search(MIXTRAL, cl, TRAINING, top=5, trainer=mc, searcher="exhaustive")
    tr = trainer_training(mc, TRAINING)
    runs = moe_runs(MIXTRAL, tr, mc, {}, set())
    full = [exhaustive_search(MIXTRAL, load_cluster("dgx-h100", nodes=4), run, top=5,
                              trainer=mc, options=None if i == 0 else
                              SpaceOptions(expert_parallel_only=True))
            for i, run in enumerate(runs)]
    merged = _merge(full, runs, 5)
    assert [(r.extra["plan_short"], r.step_time_s) for r in fast.reports] == \
        [(r.extra["plan_short"], r.step_time_s) for r in merged.reports]
    assert fast.baseline_step_time_s == merged.baseline_step_time_s
    # Searched in full, every setting returns its own five.
    assert sum(len(r.reports) for r in full) == 5 * len(runs)


class _Rep:
    """A stand-in StepReport for ``top_k``: its time, one GiB, one GPU per replica."""

    feasible = True

    def __init__(self, t: float) -> None:
        self.step_time_s = t
        self.memory_gb = {"peak": 1.0}
        self.plan = {"tp": 1, "pp": 1, "cp": 1, "ep": 1}


def test_top_k_with_a_cutoff_simulates_only_rows_that_can_beat_it():
    from paraplan.search.exhaustive import top_k

    calls = []

    def sim(i: int) -> _Rep:
        calls.append(i)
        return _Rep(float(step[i]))

    step = np.array([3.0, 1.0, 5.0, 2.0, 4.0])
    feasible = np.ones(5, dtype=bool)
    assert [r.step_time_s for r in top_k(step, step, feasible, 2, sim)] == [1.0, 2.0]
    assert sorted(calls) == [1, 3]
    calls.clear()
    assert [r.step_time_s for r in top_k(step, step, feasible, 2, sim, cutoff=1.5)] == [1.0]
    assert calls == [1]  # 2.0 cannot beat the 1.5 found elsewhere: never simulated


def test_top_k_simulates_every_row_whose_lower_bound_can_beat_the_kth():
    """Estimated rows are visited by their lower bound: a row estimated far behind but bounded
    below the K-th best is still simulated (and here wins); rows bounded past it are not."""
    from paraplan.search.exhaustive import top_k

    exact = np.array([1.0, 2.0, 3.0, 1.5, 9.0])  # what simulate returns
    step = np.array([1.0, 2.0, 3.0, 2.6, 9.5])  # rows 3 and 4 are estimates
    lower = np.array([1.0, 2.0, 3.0, 1.2, 8.0])
    calls: list[int] = []

    def sim(i: int) -> _Rep:
        calls.append(i)
        return _Rep(float(exact[i]))

    got = top_k(step, lower, np.ones(5, dtype=bool), 2, sim)
    assert [r.step_time_s for r in got] == [1.0, 1.5]
    assert sorted(calls) == [0, 3]  # bounds 2.0, 3.0 and 8.0 cannot beat the 2nd best, 1.5
