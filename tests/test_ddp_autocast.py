"""PyTorch DDP under torch.autocast (composer's amp_bf16, torchtitan without FSDP): weight casts
every micro-batch, fp32 gradient accumulation and the reducer's bucket copies, and torchtitan's
all-reduce of every micro-batch; simulate and the search evaluator alike."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, simulate
from paraplan.search.space import SpaceOptions, build_space, evaluate_space, parse_fix
from paraplan.simulator.compute import Device
from paraplan.simulator.copies import ddp_autocast_bytes_per_param
from paraplan.simulator.memory import params_per_stage
from paraplan.specs import load_trainer

MODEL = load_model("gpt3-760m")
TRAIN = TrainingSpec(global_batch_size=64, seq_len=2048, grad_reduce_fp32=True)


def test_ddp_autocast_bytes_by_hand() -> None:
    on = TRAIN.model_copy(update={"ddp_autocast": True})
    # m = 4, synced once: 4 x (6 + 6) casts + 3 x 12 accumulation + 16 bucket copies
    assert ddp_autocast_bytes_per_param(on, 4, True) == 4 * 12 + 3 * 12 + 16
    assert ddp_autocast_bytes_per_param(on, 4, False) == 4 * 12 + 3 * 12  # no DDP wrapper
    every = on.model_copy(update={"ddp_sync_every_microbatch": True})
    assert ddp_autocast_bytes_per_param(every, 4, True) == 4 * 12 + 3 * 12 + 4 * 16
    assert ddp_autocast_bytes_per_param(TRAIN, 4, True) == 0.0
    fp32 = on.model_copy(update={"precision": "fp32"})  # nothing to cast
    assert ddp_autocast_bytes_per_param(fp32, 4, True) == 0.0
    m = np.array([1.0, 2.0])
    assert np.allclose(ddp_autocast_bytes_per_param(on, m, np.array([True, False])), [28, 36])


def test_simulate_charges_them_on_ddp_plans_only() -> None:
    cluster = load_cluster("dgx-h100")
    plan = parse_plan("dp=8,zero=0,mbs=2")
    on = TRAIN.model_copy(update={"ddp_autocast": True})
    bare, priced = simulate(MODEL, cluster, TRAIN, plan), simulate(MODEL, cluster, on, plan)
    m = priced.extra["num_microbatches"]
    assert m == 4
    dense, experts = params_per_stage(MODEL, plan, [MODEL.num_layers], 0, [0])
    dev = Device.of(cluster.node_groups[0].gpu, "bf16")
    want = (dense + experts) * (4 * 12 + 3 * 12 + 16) / dev.memory_Bps
    assert priced.step_time_s - bare.step_time_s == pytest.approx(want, rel=1e-9)
    sharded = parse_plan("dp=8,zero=3,mbs=2")
    assert simulate(MODEL, cluster, on, sharded).step_time_s == \
        simulate(MODEL, cluster, TRAIN, sharded).step_time_s
    # all-reduce every micro-batch: the DP time grows m-fold for DDP
    every = on.model_copy(update={"ddp_sync_every_microbatch": True})
    rep = simulate(MODEL, cluster, every, plan)
    assert rep.time_s["dp_comm"] == pytest.approx(4 * priced.time_s["dp_comm"], rel=1e-9)


@pytest.mark.parametrize("trainer", ["torchtitan", "llm-foundry"])
def test_evaluator_prices_ddp_autocast_as_simulate(trainer) -> None:
    spec = load_trainer(trainer)
    assert spec.runs.ddp_autocast
    assert spec.runs.ddp_sync_every_microbatch == (trainer == "torchtitan")
    tr = TRAIN.model_copy(update={"ddp_autocast": True, "ddp_sync_every_microbatch":
                                  spec.runs.ddp_sync_every_microbatch})
    cluster = load_cluster("dgx-h100", nodes=2)
    space = build_space(MODEL, cluster, tr, fix=parse_fix({"tp": 1, "pp": 1}),
                        options=SpaceOptions(max_micro_batch=4))
    ev = evaluate_space(space, times_for_oom=True)
    c = space.cols
    rows = [i for i in range(len(space)) if c["zero"][i] == 0]
    assert len(rows) >= 3
    for i in rows:
        rep = simulate(MODEL, cluster, tr, space.plan(i), time_if_oom=True)
        assert ev.step_time_s[i] == pytest.approx(rep.step_time_s, rel=1e-9)
        assert ev.time["dp_comm"][i] == pytest.approx(rep.time_s["dp_comm"], rel=1e-9)
