"""The MoE layer priced in parts (``layer.shared_parts`` per (tp, cp, sp, mbs, zs),
``layer_terms.routed_terms`` per ``moe.expert_shape``, composed on arrays by
``search.space.moe_keys.moe_parts``) against the whole layer as ``simulate`` prices it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan import ParallelPlan, TrainingSpec, load_cluster, load_model
from paraplan.search.space import build_space
from paraplan.search.space.evaluate import _plan_maker, _run_free
from paraplan.search.space.moe_keys import moe_parts
from paraplan.simulator.compute import Device
from paraplan.simulator.layer import layer_parts
from paraplan.simulator.layer_compose import PARTS
from paraplan.simulator.layer_terms import compose_times, layer_times, routed_terms, shared_terms
from paraplan.simulator.moe import expert_shape
from paraplan.specs.loaders import load_trainer

RUNS = (
    # model, cluster, nodes, training extras, trainer
    ("deepseek-v3", "dgx-h800", 4, {"moe_host_sync_s": 6e-4}, None),
    # gpt-oss: expert biases and the clamped GLU; Megatron-Core's TP overlap and dispatcher
    ("gpt-oss-120b", "dgx-h100", 2, {}, "megatron-core"),
    # eager kernels with an accumulation pass (zs = 1 keys), DeepEP with the overlap
    ("mixtral-8x7b", "dgx-h100", 2, {"kernels": "eager", "moe_dispatcher": "hierarchical",
                                     "moe_a2a_overlap": True}, None),
    ("qwen3-30b-a3b", "dgx-b200", 2, {"precision": "fp8"}, None),
)


def _row(pt) -> list[float]:
    lt = pt.times
    return [lt.forward_s, lt.backward_s, lt.gemm_fwd_s, lt.attention_fwd_s,
            lt.elementwise_fwd_s, lt.expert_fwd_s, pt.tp_s, pt.tp_bwd_s, pt.cp_s, pt.ep_s,
            pt.cp_bwd_s, pt.ep_overlap_slowdown or 0.0, pt.host_stall_s, lt.rerun_skip_s,
            lt.op_rerun_gemm_s, pt.tp_rerun_skip_s, pt.tp_op_rerun_s]


@pytest.mark.parametrize("run", range(len(RUNS)))
def test_moe_parts_match_layer_parts_on_every_key(run: int) -> None:
    name, cluster, nodes, extra, trainer = RUNS[run]
    model, cl = load_model(name), load_cluster(cluster, nodes=nodes)
    tr = TrainingSpec(global_batch_size=256, seq_len=4096, **extra)
    space = build_space(model, cl, tr, trainer=load_trainer(trainer) if trainer else None)
    dev = Device.of_training(cl.gpu, tr)
    c = space.cols
    keys = np.unique(np.stack([c["tp"], c["cp"], c["sp"], c["mbs"],
                               (c["zero"] >= 2).astype(np.int64), c["ep"], c["etp"]], axis=1),
                     axis=0)
    assert len(keys) > 20
    plan_of = _plan_maker(space)
    got = moe_parts(space, dev, keys, plan_of, _run_free(space))
    picks = np.random.default_rng(run).choice(len(keys), size=min(60, len(keys)),
                                              replace=False)
    for i in picks:
        plan = plan_of(*keys[i].tolist())
        want = _row(layer_parts(model, cl.topology, tr, plan, dev, moe=True))
        assert got[i] == pytest.approx(want, rel=1e-12, abs=1e-15), keys[i]
    # A second call (another MoE run setting's space) reads the parts from the memo.
    assert np.array_equal(moe_parts(space, dev, keys, plan_of, _run_free(space)), got)


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]), sp=st.booleans(),
       mbs=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 2, 8, 16]),
       etp=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1, 2]),
       eager=st.booleans())
def test_plans_with_one_expert_shape_have_one_routed_cost(tp, cp, sp, mbs, ep, etp, zero,
                                                          eager) -> None:
    """``moe.expert_shape`` lists everything ``routed_terms`` reads: any other plan fields
    change nothing, and the layer is the composition of its two parts."""
    model = load_model("mixtral-8x7b")
    gpu = load_cluster("dgx-h100", nodes=1).gpu
    tr = TrainingSpec(global_batch_size=64, seq_len=4096,
                      kernels="eager" if eager else "fused")
    dev = Device.of_training(gpu, tr)
    plan = ParallelPlan(tp=tp, cp=cp, sequence_parallel=sp and tp > 1, micro_batch_size=mbs,
                        ep=ep, etp=etp, zero_stage=zero)
    routed = routed_terms(model, tr, plan, dev)
    for other in itertools.islice(
            (plan.model_copy(update={"pp": pp, "dp": dp, "recompute": rc})
             for pp, dp, rc in itertools.product((1, 4), (1, 8), ("none", "full"))), 8):
        assert expert_shape(tr, other) == expert_shape(tr, plan)
        assert routed_terms(model, tr, other, dev) == routed
    whole = layer_times(model, tr, plan, dev, moe=True)
    assert compose_times(shared_terms(model, tr, plan, dev, moe=True), routed) == whole
    assert whole.expert_fwd_s == routed.gemm_fwd_s > 0


def test_a_moe_space_where_nothing_fits_prices_no_keys() -> None:
    """Every plan out of memory: no MoE key is priced and the evaluator returns no times
    (``best`` then says no plan fits, as before the parts were priced apart)."""
    from paraplan.search.space import evaluate_space

    model, cl = load_model("deepseek-v3"), load_cluster("dgx-h100", nodes=1)
    space = build_space(model, cl, TrainingSpec(global_batch_size=64, seq_len=4096))
    ev = evaluate_space(space)
    assert len(space) > 0 and not ev.feasible.any()
    assert np.isnan(ev.step_time_s).all()
    assert moe_parts(space, Device.of_training(cl.gpu, space.training),
                     np.zeros((0, 7), dtype=np.int64), _plan_maker(space),
                     _run_free(space)).shape == (0, PARTS)
