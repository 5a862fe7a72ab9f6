"""What torchtitan v0.2.2 cannot run as asked: DDP beside any other parallelism (its
parallelize.py raises "DDP has not supported > 1D parallelism"), and mixed precision with TP
or PP outside FSDP (maybe_enable_amp turns it off: the run would train in fp32)."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan
from paraplan.search import search
from paraplan.search.space import SpaceOptions, build_space
from paraplan.search.space.trainer_filter import trainer_mask
from paraplan.specs import load_trainer
from paraplan.specs.trainer import trainer_reasons

TRAIN = TrainingSpec(global_batch_size=64, seq_len=4096)
MODEL = load_model("llama3-8b")


@pytest.mark.parametrize("plan,ddp,fp32", [
    ("tp=4,dp=8,zero=0,sp=1", True, True),       # DDP beside TP: raises; and no FSDP
    ("tp=8,dp=1,zero=0,sp=1", False, True),      # TP alone: mixed precision off
    ("tp=2,pp=4,dp=1,zero=1,sp=1", False, True),  # PP without sharding: the same
    ("dp=8,zero=0", False, False),               # plain DDP: autocast
    ("tp=4,dp=2,zero=3,sp=1", False, False),     # FSDP over dp > 1
    ("tp=2,dp=1,cp=4,zero=3,sp=1", False, False),  # FSDP over the CP ranks
    ("dp=2,cp=4,zero=0", True, False),            # CP shards with FSDP: not DDP
    ("tp=2,pp=2,dp=2,zero=1,sp=1", False, False),  # FSDP under pipelining
])
def test_torchtitan_reasons(plan, ddp, fp32):
    titan = load_trainer("torchtitan")
    why = trainer_reasons(titan, MODEL, TRAIN, parse_plan(plan))
    assert any("replicated data parallelism" in r for r in why) == ddp
    assert any("otherwise in fp32" in r for r in why) == fp32
    # fp32 training asks for no mixed precision; other trainers have neither rule
    fp32_run = TRAIN.model_copy(update={"precision": "fp32"})
    assert not any("fp32" in r for r in trainer_reasons(titan, MODEL, fp32_run, parse_plan(plan)))
    assert trainer_reasons(load_trainer("megatron-core"), MODEL, TRAIN, parse_plan(plan)) == []


def test_the_search_mask_agrees_and_best_returns_runnable_plans():
    titan = load_trainer("torchtitan")
    cluster = load_cluster("dgx-h100", nodes=2)
    space = build_space(MODEL, cluster, TRAIN, options=SpaceOptions(max_micro_batch=4))
    keep, refused = trainer_mask(space.cols, titan, MODEL, TRAIN)
    assert any("replicated data parallelism" in r for r in refused)
    assert any("mixed precision" in r for r in refused)
    for i in np.random.default_rng(3).choice(len(space), size=400, replace=False).tolist():
        scalar = not trainer_reasons(titan, MODEL, TRAIN, space.plan(i),
                                     int(space.cols["m"][i]))
        assert scalar == bool(keep[i]), space.plan(i).short()
    result = search(MODEL, cluster, TRAIN, searcher="exhaustive", top=10, trainer=titan)
    for rep in result.reports:
        p = rep.plan
        assert not (p["zero_stage"] == 0 and rep.extra["dp"] > 1
                    and max(p["tp"], p["pp"], p["cp"]) > 1)
        assert not (max(p["tp"], p["pp"]) > 1 and p["cp"] == 1
                    and not (p["zero_stage"] >= 1 and rep.extra["dp"] > 1))


@pytest.mark.parametrize("plan,model,field", [
    ("tp=4,dp=8,zero=0,sp=1,mbs=1", "llama3-8b", "plan.zero_stage"),
    ("tp=2,pp=2,zero=1,sp=1,mbs=1", "gpt3-13b", "plan.pp"),  # tied embeddings
    ("tp=8,dp=1,pp=4,zero=1,sp=1,mbs=1", "llama3-8b", "training.precision"),
])
def test_export_refuses_what_torchtitan_cannot_run(plan, model, field):
    from paraplan.export import ExportError, export_context, export_text

    cluster = load_cluster("dgx-a100-80gb", nodes=4)
    tr = TrainingSpec(global_batch_size=256, seq_len=2048)
    ctx = export_context(load_model(model), tr, parse_plan(plan), cluster=cluster)
    with pytest.raises(ExportError) as err:
        export_text("torchtitan", ctx)
    assert err.value.field == field
