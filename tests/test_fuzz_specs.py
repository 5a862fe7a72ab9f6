"""Property tests: random and malformed specs/plans only ever produce SpecError.

Loaders, the plan parser and the plan checker must answer bad input with a clear SpecError
(naming the field) and nothing else: no KeyError, TypeError, AttributeError or traceback.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan import TrainingSpec, check_plan, load_cluster, load_model, parse_plan
from paraplan.specs import ParallelPlan, SpecError, list_profiles
from paraplan.specs.hf_config import model_from_hf_config
from paraplan.specs.loaders import cluster_from_dict

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8)

MODEL_KEYS = ["name", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
              "ffn_hidden_size", "vocab_size", "activation", "num_experts", "moe_top_k",
              "head_dim", "tie_word_embeddings", "first_dense_layers", "bogus_key"]
PLAN_KEYS = ["tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "mbs", "schedule", "vpp", "rc",
             "layers", "sequence_parallel", "what"]
HF_KEYS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "intermediate_size", "vocab_size", "num_local_experts",
           "num_experts_per_tok", "tie_word_embeddings", "hidden_act", "n_embd", "head_dim"]

good_ints = st.integers(1, 4096)


def _mixed_dict(keys):
    return st.dictionaries(st.sampled_from(keys), st.one_of(good_ints, values), max_size=len(keys))


def _write(suffix: str, text: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False,
                                     encoding="utf-8") as handle:
        handle.write(text)
    return handle.name


@FAST
@given(_mixed_dict(MODEL_KEYS))
def test_model_yaml_only_spec_errors(data):
    path = _write(".yaml", yaml.safe_dump(data))
    try:
        model = load_model(path)
    except SpecError:
        return
    finally:
        Path(path).unlink()
    assert model.num_params > 0 and model.num_active_params <= model.num_params


@FAST
@given(_mixed_dict(HF_KEYS))
def test_hf_config_only_spec_errors(data):
    try:
        model = model_from_hf_config(data)
    except SpecError:
        return
    assert model.num_params > 0


@FAST
@given(st.text(max_size=200))
def test_garbage_files_only_spec_errors(text):
    for suffix, loader in ((".yaml", load_model), (".json", load_model), (".yaml", load_cluster)):
        path = _write(suffix, text)
        try:
            loader(path)
        except SpecError:
            pass
        finally:
            Path(path).unlink()


@FAST
@given(st.text(max_size=40))
def test_names_only_spec_errors(name):
    for loader in (load_model, load_cluster):
        with contextlib.suppress(SpecError):
            loader(name)


@FAST
@given(st.one_of(st.text(max_size=60), _mixed_dict(PLAN_KEYS)))
def test_plan_parser_only_spec_errors(text):
    try:
        plan = parse_plan(text)
    except SpecError:
        return
    assert isinstance(plan, ParallelPlan)


cluster_dicts = st.fixed_dictionaries(
    {"name": st.one_of(st.just("c"), values)},
    optional={
        "node": st.one_of(values, st.fixed_dictionaries(
            {"gpu": st.one_of(st.sampled_from(list_profiles("gpus")), values)},
            optional={"gpus_per_node": st.one_of(good_ints, values),
                      "num_nodes": st.one_of(good_ints, values),
                      "intra_node_link": st.one_of(st.sampled_from(list_profiles("links")),
                                                   values),
                      "inter_node_link": st.one_of(st.sampled_from(list_profiles("links")),
                                                   values),
                      "region": values})),
        "node_groups": values, "region_links": values, "intra_region_link": values,
        "region_links_csv": values, "extra": values,
    },
)


@FAST
@given(cluster_dicts)
def test_cluster_dicts_only_spec_errors(data):
    try:
        cluster = cluster_from_dict(data)
    except SpecError:
        return
    assert cluster.num_gpus >= 1


plans = st.builds(
    ParallelPlan,
    tp=st.sampled_from([1, 2, 3, 4, 8, 16]), pp=st.integers(1, 12), cp=st.sampled_from([1, 2, 3]),
    ep=st.sampled_from([1, 2, 3, 8]), etp=st.sampled_from([None, 1, 2]),
    sequence_parallel=st.booleans(), zero_stage=st.sampled_from([0, 1, 2, 3]),
    micro_batch_size=st.integers(1, 9), virtual_stages=st.integers(1, 3),
    schedule=st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1"]),
    dp=st.one_of(st.none(), st.integers(1, 64)),
    allow_cross_node_tp=st.booleans(),
)


@FAST
@given(plans, st.sampled_from(list_profiles("models")),
       st.sampled_from(["dgx-h100", "dtfm-spot", "aws-p3.2xlarge", "pcie-rtx4090x8"]),
       st.integers(1, 4096), st.integers(1, 9000), st.sampled_from(["bf16", "fp16", "fp8"]))
def test_plan_checker_returns_reasons_never_raises(plan, model, cluster, gbs, seq, precision):
    reasons = check_plan(load_model(model), load_cluster(cluster),
                         TrainingSpec(global_batch_size=gbs, seq_len=seq, precision=precision),
                         plan)
    assert isinstance(reasons, list) and all(isinstance(r, str) and r for r in reasons)


def test_plan_json_roundtrip():
    plan = parse_plan("tp=4,pp=2,mbs=2,sp=1,zero=1,rc=full,layers=10/14")
    assert parse_plan(json.dumps(plan.model_dump())) == plan


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=350, max_value=700), st.floats(min_value=350, max_value=700))
def test_power_limit_never_speeds_a_gpu_up(low, high):
    """Along the H100 power curve compute never rises as the limit falls, stays within the
    curve's end points (0.746 at 350 W, 1.0 at 700 W) and is 1.0 without a limit."""
    from paraplan.specs import load_gpu

    sxm = load_gpu("h100-sxm")
    low, high = sorted((low, high))
    f_low = sxm.model_validate({**sxm.model_dump(), "power_limit_W": low}).power_fraction
    f_high = sxm.model_validate({**sxm.model_dump(), "power_limit_W": high}).power_fraction
    assert 0.746 <= f_low <= f_high <= 1.0
    assert sxm.power_fraction == 1.0
