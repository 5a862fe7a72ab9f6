"""The plan space and its vectorized evaluator against simulate() and check_plan()."""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan import ParallelPlan, TrainingSpec, check_plan, load_cluster, load_model, simulate
from paraplan.search.space import (
    R_WORLD,
    RECOMPUTES,
    SpaceOptions,
    build_space,
    evaluate_space,
    parse_fix,
)
from paraplan.search.space.keys import group_rows, key_index
from paraplan.simulator.pipeline import SCHEDULES, pipeline_time
from paraplan.simulator.step import even_split
from paraplan.specs.errors import SpecError

CASES = (
    ("llama3-8b", "dgx-h100", 2, 128, 4096),
    ("gpt3-2.7b", "dgx-a100-80gb", 2, 256, 2048),
    ("mixtral-8x7b", "dgx-h100", 4, 256, 4096),
    # Megatron-Core's host stall after each MoE layer's sync (TrainingSpec.moe_host_sync_s)
    ("deepseek-moe-16b", "dgx-h100", 2, 128, 4096, {"moe_host_sync_s": 6e-4}),
    ("llama2-13b", "aws-p4d.24xlarge", 2, 64, 4096),
    # FSDP2's copies under ZeRO-2/3 (simulator.copies.fsdp_copy_bytes_per_param)
    # PyTorch's ring attention (simulator.copies.eager_ring_bytes) and FSDP's ZeRO-2 gathers,
    # as torchtitan runs them
    ("llama3-8b", "dgx-a100-80gb", 2, 64, 4096, {"fsdp_copies": "per_param",
                                                   "grad_reduce_fp32": True,
                                                   "cp_merge": "eager_fp32",
                                                   "cp_kv_exchange": "allgather",
                                                   "zero2_regather": True}),
    # DeepEP with the expert-parallel all-to-all overlap: its SMs and its extra warm-up
    # micro-batch (moe.a2a_overlap_warmup)
    # (and the host stall, hidden but for the warm-up forwards)
    ("mixtral-8x7b", "dgx-h100", 4, 256, 4096, {"moe_dispatcher": "hierarchical",
                                                 "moe_a2a_overlap": True,
                                                 "moe_host_sync_s": 6e-4}),
    # B200's measured fp8 GEMM table, and llm-foundry's loss (one kernel, two metric passes)
    ("llama3-8b", "dgx-b200", 1, 64, 4096, {"precision": "fp8", "loss_kernels": "one_kernel",
                                           "logit_metric_passes": 2}),
    # DeepSpeed's BF16 optimizer: a pass adding the 16-bit gradients into fp32 ones after
    # every backward (grads.accumulation_bytes_per_param), none under ZeRO-2/3
    # and its ZeRO-1 that all-reduces the whole fp32 gradient (dp_sync.grad_sync_parts)
    ("gpt3-2.7b", "dgx-a100-80gb", 2, 256, 2048, {"grad_accumulation": "fp32_add",
                                                   "grad_reduce_fp32": True,
                                                   "zero1_grad_all_reduce": True}),
    # PyTorch pipelining's gradient chains under FSDP (dp_sync.pp_grad_chains) and FSDP2's
    # eager fp32 accumulation between them
    ("llama2-13b", "dgx-h100", 4, 128, 4096, {"pp_grad_sync": "cascade",
                                              "grad_accumulation": "eager",
                                              "grad_reduce_fp32": True}),
    # A switchless node (the p3.16xlarge's NVLink hybrid cube mesh): TP pairs on one link,
    # quads on four, data-parallel rings across the 25 Gb/s network
    ("gpt3-xl", "aws-p3.16xlarge", 2, 64, 2048, {"precision": "fp16"}),
    # A power-capped GPU with eager kernels (the loss follows them)
    ("llama3-8b", str(Path(__file__).parent / "data" / "capped-h100.yaml"), 2, 64, 4096,
     {"kernels": "eager"}),
)


@cache
def _case(i: int):
    name, cluster, nodes, batch, seq, *more = CASES[i]
    model, cl = load_model(name), load_cluster(cluster, nodes=nodes)
    tr = TrainingSpec(global_batch_size=batch, seq_len=seq, **(more[0] if more else {}))
    space = build_space(model, cl, tr, options=SpaceOptions(max_micro_batch=8))
    ev = evaluate_space(space, times_for_oom=True, exact_interleaved=True)
    return model, cl, tr, space, ev


@settings(max_examples=120, deadline=None)
@given(case=st.integers(0, len(CASES) - 1), pick=st.integers(0, 10**9))
def test_evaluator_agrees_with_simulate(case: int, pick: int) -> None:
    model, cl, tr, space, ev = _case(case)
    i = pick % len(space)
    plan = space.plan(i)
    rep = simulate(model, cl, tr, plan, time_if_oom=True)
    assert rep.step_time_s is not None, rep.reasons
    assert ev.peak_gib[i] == pytest.approx(rep.memory_gb["peak"], rel=1e-9)
    assert bool(ev.feasible[i]) == rep.feasible
    if space.cols["uneven"][i]:
        return  # simulate runs the event simulation there; the evaluator estimates
    assert ev.exact[i]
    assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-6)
    for key, val in rep.time_s.items():
        assert ev.time[key][i] == pytest.approx(val, rel=1e-6, abs=1e-9 * rep.step_time_s)


def test_evaluator_agrees_with_simulate_on_dp_sized_buckets(monkeypatch) -> None:
    """Gradient buckets grow with the data-parallel size (Megatron-Core: max(40M, 1M x dp));
    at these sizes only a larger per-rank share shows it, on dense and expert buffers alike,
    with CP, overlapped or not; and a bucket size the run sets (``ddp_bucket_size``)."""
    import paraplan.simulator.memory as memory

    monkeypatch.setattr(memory, "BUCKET_ELEMENTS_PER_RANK", 30e6)
    model, cl = load_model("mixtral-8x7b"), load_cluster("dgx-h100", nodes=4)
    for overlap, bucket in ((True, None), (False, None), (True, 25_000_000)):
        tr = TrainingSpec(global_batch_size=256, seq_len=4096, ddp_bucket_size=bucket)
        fix = f"cp=2,overlap_grad_reduce={int(overlap)}"
        space = build_space(model, cl, tr, fix=parse_fix(fix),
                            options=SpaceOptions(max_micro_batch=2))
        ev = evaluate_space(space, times_for_oom=True)
        rng = np.random.default_rng(7)
        rows = [i for i in rng.permutation(len(space)).tolist()
                if space.cols["zero"][i] in (0, 1, 2) and not space.cols["uneven"][i]][:25]
        assert rows
        for i in rows:
            rep = simulate(model, cl, tr, space.plan(i), time_if_oom=True)
            assert ev.time["dp_comm"][i] == pytest.approx(rep.time_s["dp_comm"], rel=1e-6,
                                                          abs=1e-12)
            assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-6)


@pytest.mark.parametrize("sync", ["after_schedule", "cascade"])
def test_evaluator_prices_pipelined_gradient_chains_as_simulate(sync: str) -> None:
    """Pipelined plans under sharded DP whose stages reduce their gradients after the last
    backward (``TrainingSpec.pp_grad_sync``): the evaluator's DP time and step are
    simulate's, on 1F1B and interleaved plans, ZeRO-1 and ZeRO-2, overlapped or not."""
    model, cl = load_model("llama2-13b"), load_cluster("dgx-h100", nodes=4)
    tr = TrainingSpec(global_batch_size=128, seq_len=4096, pp_grad_sync=sync)
    for overlap in (True, False):
        space = build_space(model, cl, tr, fix=parse_fix(f"overlap_grad_reduce={int(overlap)}"),
                            options=SpaceOptions(max_micro_batch=2))
        ev = evaluate_space(space, times_for_oom=True, exact_interleaved=True)
        rng = np.random.default_rng(11)
        c = space.cols
        rows = [i for i in rng.permutation(len(space)).tolist()
                if c["pp"][i] > 1 and c["zero"][i] in (1, 2) and c["dp"][i] > 1
                and not c["uneven"][i]][:20]
        assert len(rows) == 20
        for i in rows:
            rep = simulate(model, cl, tr, space.plan(i), time_if_oom=True)
            assert ev.time["dp_comm"][i] == pytest.approx(rep.time_s["dp_comm"], rel=1e-6)
            assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-6)


def test_evaluator_prices_the_attention_call_facts_as_simulate() -> None:
    """Repeated grouped K/V under ring attention (``kv_repeat``, PyTorch's fp32 merges and
    all-gathered K/V), flash-attn's varlen packing (``attention_unpad``), the Triton
    FlashAttention-1 kernel and a split fused QKV's backward concatenation
    (``qkv_split_cat``): the evaluator's step and memory are simulate's."""
    model, cl = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    runs = (TrainingSpec(global_batch_size=16, seq_len=32768, kv_repeat=True,
                         cp_merge="eager_fp32", cp_kv_exchange="allgather", kernels="eager"),
            TrainingSpec(global_batch_size=32, seq_len=4096, attention_unpad=True),
            TrainingSpec(global_batch_size=32, seq_len=4096, flash_attention_version=1,
                         flash_attention_triton=True, qkv_split_cat=True))
    for tr in runs:
        space = build_space(model, cl, tr, options=SpaceOptions(max_micro_batch=2))
        ev = evaluate_space(space, times_for_oom=True, exact_interleaved=True)
        c = space.cols
        rng = np.random.default_rng(5)
        rows = [i for i in rng.permutation(len(space)).tolist()
                if (c["cp"][i] > 1) == tr.kv_repeat and not c["uneven"][i]][:15]
        assert len(rows) == 15
        for i in rows:
            rep = simulate(model, cl, tr, space.plan(i), time_if_oom=True)
            assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-6)
            assert ev.peak_gib[i] == pytest.approx(rep.memory_gb["peak"], rel=1e-6)


def test_every_plan_in_the_space_is_legal() -> None:
    for case in range(len(CASES)):
        model, cl, tr, space, _ = _case(case)
        rng = np.random.default_rng(case)
        for i in rng.choice(len(space), size=min(200, len(space)), replace=False):
            plan = space.plan(int(i))
            assert check_plan(model, cl, tr, plan) == [], plan.short()


def test_space_is_complete_against_brute_force() -> None:
    """Every legal plan of a small grid (checked one by one) is in the space, and no other."""
    model, cl = load_model("gpt3-125m"), load_cluster("dgx-a100-80gb", nodes=1)
    tr = TrainingSpec(global_batch_size=32, seq_len=2048)
    opts = SpaceOptions(max_cp=8, max_micro_batch=32, max_virtual_stages=4)
    space = build_space(model, cl, tr, options=opts)
    got = {space.plan(i).model_dump_json() for i in range(len(space))}
    want = set()
    n, L = cl.num_gpus, model.num_layers
    for tp, pp, cp in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)):
        if tp * pp * cp > n or n % (tp * pp * cp):
            continue
        sched_v = [("1f1b", 1)] if pp == 1 else [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1)] + [
            ("interleaved", v) for v in range(2, 5)]
        for (sched, v), sp, zero, mbs, rc in itertools.product(
                sched_v, (False, True), range(4), (1, 2, 4, 8, 16, 32), RECOMPUTES):
            layers = None
            if L % (pp * v):
                if v > 1:
                    continue
                layers = even_split(L, pp)
            plan = ParallelPlan(tp=tp, pp=pp, cp=cp, dp=n // (tp * pp * cp),
                                sequence_parallel=sp, zero_stage=zero, micro_batch_size=mbs,
                                schedule=sched, virtual_stages=v, recompute=rc,
                                layers_per_stage=layers)
            if not check_plan(model, cl, tr, plan):
                want.add(plan.model_dump_json())
    assert got == want
    assert space.considered == len(space) + sum(space.rejected.values())


def test_rejections_are_counted_by_reason() -> None:
    model, cl = load_model("llama3-70b"), load_cluster("dgx-h100", nodes=4)
    tr = TrainingSpec(global_batch_size=96, seq_len=4096)
    space = build_space(model, cl, tr)
    assert space.rejected[R_WORLD] > 0
    assert space.considered == len(space) + sum(space.rejected.values())
    assert all(c >= 0 for c in space.rejected.values())


def test_fix_pins_fields_and_rejects_unknown_ones() -> None:
    model, cl = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    tr = TrainingSpec(global_batch_size=64, seq_len=4096)
    space = build_space(model, cl, tr, parse_fix("tp=4,rc=full,zero=1,tp_comm_overlap=1"))
    assert set(space.cols["tp"].tolist()) == {4}
    assert set(space.cols["rc"].tolist()) == {RECOMPUTES.index("full")}
    assert space.plan(0).tp_comm_overlap is True
    with pytest.raises(SpecError, match="cannot pin 'foo'"):
        parse_fix("foo=3")
    with pytest.raises(SpecError):
        parse_fix("tp=0")
    with pytest.raises(SpecError, match="key=value"):
        parse_fix("tp")


@settings(max_examples=200, deadline=None)
@given(p=st.integers(2, 12), v=st.integers(2, 6), extra=st.integers(1, 30),
       tf=st.floats(0.01, 3), tb=st.floats(0.01, 6), c=st.floats(0, 0.5))
def test_interleaved_bound_is_a_lower_bound(p, v, extra, tf, tb, c) -> None:
    """The closed form used for interleaved m % p != 0 never exceeds the event simulation."""
    m = p + extra
    if m % p == 0:
        m += 1
    n = m * v + p - 1
    exact = pipeline_time("interleaved", p, m, tf, tb, v=v, t_p2p=c)
    assert n * (tf + tb) / v + 2 * n * c <= exact.total_s * (1 + 1e-12)
    assert n * (tf + tb) / v <= (exact.total_s - exact.p2p_s) * (1 + 1e-12)


def test_schedules_in_space_match_pipeline_module() -> None:
    _, _, _, space, _ = _case(0)
    assert set(space.cols["sched"].tolist()) <= set(range(len(SCHEDULES)))


def test_every_even_interleaving_is_searched() -> None:
    """No vpp cap: every chunk count that splits the layers evenly is in the default space,
    down to one layer per chunk (NVIDIA's GPT-3 175B and Nemotron-4 340B recipes run
    pp=8 with vpp=12 on 96 layers), and no count that does not split them."""
    from paraplan.specs.loaders import load_trainer

    model, cl = load_model("gpt3-175b"), load_cluster("dgx-h100", nodes=8)
    tr = TrainingSpec(global_batch_size=128, seq_len=2048)
    space = build_space(model, cl, tr, fix=parse_fix("tp=8,pp=8,mbs=1"),
                        trainer=load_trainer("megatron-core"))
    interleaved = SCHEDULES.index("interleaved")
    vs = set(space.cols["v"][space.cols["sched"] == interleaved].tolist())
    assert vs == {2, 3, 4, 6, 12}
    capped = build_space(model, cl, tr, fix=parse_fix("tp=8,pp=8,mbs=1"),
                         options=SpaceOptions(max_virtual_stages=8))
    assert set(capped.cols["v"][capped.cols["sched"] == interleaved].tolist()) == {2, 3, 4, 6}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), ncols=st.integers(1, 6), nrows=st.integers(1, 400))
def test_key_index_matches_sorting_the_codes(data, ncols: int, nrows: int) -> None:
    """The table-marking key_index gives np.unique's keys, in its order, with its inverse
    (both code paths: the dense table and the sort fallback)."""
    import paraplan.search.space.keys as block

    cols = [np.array(data.draw(st.lists(st.sampled_from(data.draw(st.lists(
        st.integers(0, 300), min_size=1, max_size=5))), min_size=nrows, max_size=nrows)),
        dtype=np.int64) for _ in range(ncols)]
    code = np.zeros(nrows, dtype=np.int64)
    for col in cols:
        code = code * (int(col.max()) + 1) + col
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    want = np.stack(cols, axis=1)[first]
    for dense in (block.DENSE_KEYS, 1):
        old, block.DENSE_KEYS = block.DENSE_KEYS, dense
        try:
            keys, where = key_index(cols)
        finally:
            block.DENSE_KEYS = old
        assert np.array_equal(keys, want) and np.array_equal(where, inv.reshape(-1))


@settings(max_examples=80, deadline=None)
@given(data=st.data(), ncols=st.integers(1, 3), nrows=st.integers(1, 300),
       runs=st.booleans())
def test_group_rows_is_a_stable_sort_by_key(data, ncols: int, nrows: int, runs: bool) -> None:
    """group_rows gives key_index's keys, the rows of a stable sort by its inverse and each
    group's bounds, whether the rows come in long runs (as a plan space's (pp, vpp) do) or
    not."""
    cols = [np.array(data.draw(st.lists(st.integers(0, 5), min_size=nrows, max_size=nrows)),
                     dtype=np.int64) for _ in range(ncols)]
    if runs:
        cols = [np.sort(c) for c in cols]
    keys, inv = key_index(cols)
    order = np.argsort(inv, kind="stable")
    got_keys, got_order, bounds = group_rows(cols)
    assert np.array_equal(got_keys, keys) and np.array_equal(got_order, order)
    assert np.array_equal(bounds, np.searchsorted(inv[order], np.arange(len(keys) + 1)))


def test_key_index_sorts_the_rows_where_the_code_would_overflow():
    rng = np.random.default_rng(7)
    cols = [rng.permutation(400).astype(np.int64) * 1_000 for _ in range(8)]  # 400^8 > 2^62
    cols[0][:3] = cols[0][3]
    for c in cols[1:]:
        c[:3] = c[3]  # rows 0-3 are one key
    keys, inv = key_index(cols)
    want, where = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    assert np.array_equal(keys, want) and np.array_equal(inv, where.reshape(-1))
    assert len(keys) == 397 and len(set(inv[:4].tolist())) == 1


def test_other_moe_run_settings_reuse_the_per_key_costs() -> None:
    """The spaces of the other MoE run settings (``derive_space``) share the base's memo: the
    compute, TP/CP and activation parts, which read neither the dispatcher nor its overlap,
    are computed once, and the all-to-alls and the dispatcher's sort by local expert once per
    dispatcher (the overlap does not change them). Sharing changes no number."""
    from dataclasses import replace

    from paraplan.search.space.build import derive_space

    model, cl = load_model("mixtral-8x7b"), load_cluster("dgx-h100", nodes=4)
    tr = TrainingSpec(global_batch_size=256, seq_len=4096)
    base = build_space(model, cl, tr, options=SpaceOptions(max_micro_batch=2))
    evaluate_space(base, times_for_oom=True)

    def run_free() -> int:
        return sum(1 for k in base.memo if k[0] != "a2a")

    def a2a(dispatcher: str) -> int:
        return sum(1 for k in base.memo if k[0] == "a2a" and k[2] == dispatcher)

    filled, own = run_free(), a2a(tr.moe_dispatcher)
    assert filled > 0 and own > 0
    for run in ({"moe_dispatcher": "hierarchical"}, {"moe_a2a_overlap": True}):
        derived = derive_space(base, tr.model_copy(update=run))
        assert derived.memo is base.memo
        shared = evaluate_space(derived, times_for_oom=True)
        assert run_free() == filled  # every key's run-free part was there already
        assert a2a(tr.moe_dispatcher) == own  # the overlap setting reused the all-to-alls
        alone = evaluate_space(replace(derived, memo={}), times_for_oom=True)
        np.testing.assert_array_equal(shared.step_time_s, alone.step_time_s)
        np.testing.assert_array_equal(shared.peak_gib, alone.peak_gib)
        assert shared.time["ep_comm"].any()
    assert a2a("hierarchical") > 0  # the other dispatcher's were priced on their own


def test_keys_whose_plans_all_run_out_of_memory_are_never_priced() -> None:
    """Memory comes first: the per-layer time tables are built only for the keys that have a
    plan that fits, and those plans get the very times they get when every plan is timed."""
    from dataclasses import replace

    model, cl = load_model("deepseek-moe-16b"), load_cluster("dgx-a100-40gb", nodes=1)
    tr = TrainingSpec(global_batch_size=256, seq_len=4096)
    space = build_space(model, cl, tr, options=SpaceOptions(max_micro_batch=8))
    ev = evaluate_space(space)
    fits = ev.feasible
    assert fits.any() and not fits.all()
    assert np.isnan(ev.step_time_s[~fits]).all()
    every = evaluate_space(replace(space, memo={}), times_for_oom=True)
    np.testing.assert_array_equal(ev.peak_gib, every.peak_gib)
    np.testing.assert_array_equal(ev.step_time_s[fits], every.step_time_s[fits])
    for part, values in ev.time.items():
        np.testing.assert_array_equal(values[fits], every.time[part][fits])
    c = space.cols

    def keys(rows: np.ndarray) -> set[tuple[int, ...]]:  # the MoE shared parts' memo key
        return {(int(c["tp"][i]), int(c["cp"][i]), int(c["sp"][i]), int(c["mbs"][i]), 0)
                for i in np.flatnonzero(rows)}  # (zs = 0: fused kernels)

    priced = {k[2:] for k in space.memo if k[0] == "moe-shared"}
    assert priced == keys(fits)
    assert priced < keys(np.ones(len(space), dtype=bool))


@pytest.mark.parametrize("name", ["megatron-core", "torchtitan", "deepspeed", "nanotron"])
def test_a_trainer_space_is_the_full_space_masked_by_its_rules(name: str) -> None:
    """Blocks a trainer refuses by tp, pp and schedule alone are dropped before their rows are
    built (``structural_reason``): the space and every rejection count are what masking the
    full space with ``trainer_mask`` gives."""
    from paraplan.search.space.trainer_filter import trainer_mask
    from paraplan.specs.loaders import load_trainer
    from paraplan.specs.trainer import trainer_training

    spec = load_trainer(name)
    model, cl = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=4)
    tr = trainer_training(spec, TrainingSpec(global_batch_size=256, seq_len=4096))
    full = build_space(model, cl, tr)
    keep, refused = trainer_mask(full.cols, spec, model, tr)
    space = build_space(model, cl, tr, trainer=spec)
    assert 0 < len(space) < len(full)
    for col, values in full.cols.items():
        np.testing.assert_array_equal(space.cols[col], values[keep])
    assert space.rejected == full.rejected + refused
    assert space.considered == full.considered


@pytest.mark.parametrize("dispatcher", ["alltoall", "hierarchical"])
def test_all_to_alls_read_the_plan_only_through_their_shape(dispatcher: str) -> None:
    """``layer_a2a_time`` is equal for every plan with the same ``moe.a2a_shape`` (the search
    prices each shape once), and the shape sets several keys apart."""
    from paraplan.simulator.layer import layer_a2a_time
    from paraplan.simulator.moe import a2a_shape

    model, cl = load_model("mixtral-8x7b"), load_cluster("dgx-h100", nodes=4)
    tr = TrainingSpec(global_batch_size=256, seq_len=4096, moe_dispatcher=dispatcher)
    space = build_space(model, cl, tr, options=SpaceOptions(max_micro_batch=4))
    c = space.cols
    uniq, _ = key_index([c["tp"], c["cp"], c["sp"], c["mbs"], c["ep"], c["etp"]])
    by_shape: dict[tuple, set[float]] = {}
    for t, cp, sp, mbs, ep, etp in uniq.tolist():
        plan = ParallelPlan(tp=t, cp=cp, sequence_parallel=bool(sp), micro_batch_size=mbs,
                            ep=ep, etp=etp)
        by_shape.setdefault(a2a_shape(tr, plan), set()).add(
            layer_a2a_time(model, cl.topology, tr, plan, moe=True))
    assert all(len(times) == 1 for times in by_shape.values())
    assert len(by_shape) < len(uniq)  # shapes shared by several keys
    assert len({t for times in by_shape.values() for t in times}) > 1
