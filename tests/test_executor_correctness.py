"""Executor equivalence: every parallel plan reproduces the one-process reference.

Real torch.distributed processes (gloo, CPU, world sizes 2 and 4). For each plan, the loss of
every step and EVERY first-step gradient (TP shards gathered, under reference names) must
match ``ReferenceGPT`` within fp32 tolerance, and the bytes ``Comm`` counted must equal the
closed-form volumes of the byte contract (``paraplan.executor.comm``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("torch.distributed")

from paraplan.executor.model import ReferenceGPT, TinyGPTConfig  # noqa: E402
from paraplan.executor.train import reference_run  # noqa: E402
from tests.executor_helpers import run_distributed  # noqa: E402

DENSE = {"num_layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "seq_len": 16, "vocab": 64,
         "ffn_hidden": 64, "seed": 1}
MOE = {"num_layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "seq_len": 16, "vocab": 64,
       "ffn_hidden": 48, "num_experts": 4, "top_k": 2, "seed": 2}
RTOL, ATOL = 1e-4, 1e-5


def case(model: dict[str, Any], batch: int = 4, steps: int = 2, optimizer: str = "sgd",
         bucket: int = 3000, **plan: Any) -> dict[str, Any]:
    """A train_worker config (SGD lr 0.05 unless told, small buckets: several per step)."""
    return {"model": model, "plan": plan, "global_batch_size": batch, "steps": steps,
            "seed": 7, "lr": 0.05, "optimizer": optimizer, "bucket_elements": bucket,
            "return_grads": True}


WORLD2 = {
    "dp": case(DENSE, dp=2, micro_batch_size=1),
    "zero1": case(DENSE, steps=3, optimizer="adamw", dp=2, zero_stage=1, micro_batch_size=2),
    "tp": case(DENSE, tp=2, micro_batch_size=2),
    "tp_sp": case(DENSE, tp=2, sequence_parallel=True, micro_batch_size=2),
    "pp_afab": case(DENSE, pp=2, schedule="gpipe", micro_batch_size=1),
    "pp_1f1b": case(DENSE, pp=2, schedule="1f1b", micro_batch_size=1, layers_per_stage=[1, 3]),
    "ep": case(MOE, dp=2, ep=2, micro_batch_size=1),
}
WORLD4 = {
    "dp_tp": case(DENSE, dp=2, tp=2, micro_batch_size=1),
    "tp_pp": case(DENSE, batch=6, tp=2, pp=2, sequence_parallel=True, micro_batch_size=2),
    "pp4_1f1b": case(DENSE, batch=6, pp=4, schedule="1f1b", micro_batch_size=1),
    "pp4_afab": case(DENSE, batch=3, pp=4, schedule="gpipe", micro_batch_size=1),
    "ep_edp": case(MOE, dp=4, ep=2, zero_stage=1, micro_batch_size=1),
    "ep_tp_sp": case(MOE, dp=2, ep=2, tp=2, sequence_parallel=True, micro_batch_size=2),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every case's per-rank results (two spawns: world size 2 and world size 4)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for world, cases in ((2, WORLD2), (4, WORLD4)):
        workdir = Path(tmp_path_factory.mktemp(f"world{world}"))
        out |= dict(zip(cases, run_distributed(world, list(cases.values()), workdir),
                        strict=True))
    return out


@pytest.mark.parametrize("name", [*WORLD2, *WORLD4])
def test_loss_and_every_gradient_match_reference(runs: dict[str, list[dict[str, Any]]],
                                                 name: str) -> None:
    config = {**WORLD2, **WORLD4}[name]
    ref = reference_run(config)
    seen: set[str] = set()
    for result in runs[name]:
        torch.testing.assert_close(torch.tensor(result["loss"]), torch.tensor(ref["loss"]),
                                   rtol=RTOL, atol=ATOL, msg=lambda m: f"{name} loss: {m}")
        for tensor_name, grad in result["grads"].items():
            torch.testing.assert_close(grad, ref["grads"][tensor_name], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, n=tensor_name: f"{name} grad {n}: {m}")
            seen.add(tensor_name)
    missing = set(ref["grads"]) - seen
    assert not missing, f"{name}: gradients never returned: {sorted(missing)}"


def _num_params(model: dict[str, Any]) -> int:
    return sum(p.numel() for p in ReferenceGPT(TinyGPTConfig(**model)).parameters())


def test_dp_all_reduce_bytes_are_four_per_parameter_per_step(runs) -> None:
    config = WORLD2["dp"]
    for result in runs["dp"]:
        assert result["bytes_by_kind"]["all_reduce"] == 4 * _num_params(DENSE) * config["steps"]
        assert result["calls_by_kind"]["all_reduce"] > config["steps"]  # several buckets
        assert sum(result["bytes_by_kind"].values()) == result["bytes_by_kind"]["all_reduce"]


def test_zero1_reduce_scatters_padded_buckets_and_gathers_shards(runs) -> None:
    steps, n = WORLD2["zero1"]["steps"], 2
    for result in runs["zero1"]:
        counted = result["bytes_by_kind"]
        # Padding adds at most n-1 elements per bucket to the 4*params bytes.
        padding = counted["reduce_scatter"] - 4 * _num_params(DENSE) * steps
        assert 0 <= padding <= 4 * (n - 1) * result["calls_by_kind"]["reduce_scatter"]
        assert counted["all_gather"] * n == counted["reduce_scatter"]
        assert counted["all_reduce"] == 0


def test_tp_all_reduce_bytes_match_megatron_count(runs) -> None:
    """Per micro-batch [b, s, h] activations: 2 forward + 2 backward all-reduces per block,
    the embedding's forward and the LM head input's backward; plus 3 all-reduces of b*s
    floats in the vocab-parallel cross-entropy (Megatron)."""
    config = WORLD2["tp"]
    b, s, h, layers = config["plan"]["micro_batch_size"], DENSE["seq_len"], DENSE["hidden"], 4
    micro_batches = config["global_batch_size"] // b
    per_mb = 4 * (b * s * h * (4 * layers + 2) + 3 * b * s)
    for result in runs["tp"]:
        assert result["bytes_by_kind"]["all_reduce"] == per_mb * micro_batches * config["steps"]


def test_ep_all_to_all_bytes_match_padded_dispatch(runs) -> None:
    """Per MoE layer and micro-batch: counts (8 E bytes) + dispatch, combine and their two
    backward transposes, each 4 * ep * T * k * h bytes (capacity T*k per destination)."""
    config, ep = WORLD2["ep"], 2
    tokens = config["plan"]["micro_batch_size"] * MOE["seq_len"]
    per_layer = 8 * MOE["num_experts"] + 4 * (4 * ep * tokens * MOE["top_k"] * MOE["hidden"])
    micro_batches = config["global_batch_size"] // (2 * config["plan"]["micro_batch_size"])
    expected = per_layer * MOE["num_layers"] * micro_batches * config["steps"]
    for result in runs["ep"]:
        assert result["bytes_by_kind"]["all_to_all"] == expected


def test_pipeline_sends_one_activation_per_micro_batch_each_way(runs) -> None:
    config = WORLD2["pp_afab"]
    act = 4 * config["plan"]["micro_batch_size"] * DENSE["seq_len"] * DENSE["hidden"]
    m = config["global_batch_size"] // config["plan"]["micro_batch_size"]
    for result in runs["pp_afab"]:
        assert result["bytes_by_kind"]["p2p_send"] == act * m * config["steps"]


def test_ranks_follow_megatron_order_tp_fastest(runs) -> None:
    for name, config in {**WORLD2, **WORLD4}.items():
        plan = config["plan"]
        tp, world = plan.get("tp", 1), len(runs[name])
        dp = plan.get("dp") or world // (tp * plan.get("pp", 1))
        for result in runs[name]:
            c = result["coords"]
            assert result["rank"] == c["tp"] + tp * (c["dp"] + dp * c["pp"])
            assert c["ep"] == c["dp"] % plan.get("ep", 1)


def test_validation_invalid_world_size() -> None:
    from paraplan.executor.grid import ProcessGrid

    with pytest.raises(ValueError, match=r"dp=3 \* pp=1 \* tp=2 = 6 does not equal .* 4"):
        ProcessGrid(dp=3, pp=1, tp=2, rank=0, world_size=4)
    with pytest.raises(ValueError, match="ep=3 does not divide dp=4"):
        ProcessGrid(dp=4, pp=1, tp=1, ep=3, rank=0, world_size=4)


def test_validation_plan_must_shard_the_model() -> None:
    from paraplan.executor.pipeline_parallel import stage_layers
    from paraplan.executor.train import check_plan, parse_plan

    cfg = TinyGPTConfig(**DENSE)
    with pytest.raises(ValueError, match="tp=3 does not divide heads=4"):
        check_plan(cfg, parse_plan({"tp": 3}, 3), 4)
    with pytest.raises(ValueError, match="plan.cp=2 is not supported"):
        parse_plan({"cp": 2}, 2)
    with pytest.raises(ValueError, match="global_batch_size=5 is not a multiple"):
        check_plan(cfg, parse_plan({"dp": 2}, 2), 5)
    with pytest.raises(ValueError, match="layers_per_stage"):
        stage_layers(4, 2, [1, 2])
    assert stage_layers(5, 2) == [range(0, 3), range(3, 5)]


@pytest.mark.parametrize("name", [*WORLD2, *WORLD4])
def test_simulator_predicts_every_ranks_bytes_exactly(runs, name: str) -> None:
    """``paraplan.simulator.volumes.comm_bytes`` equals what ``Comm`` counted, per rank and
    collective kind, for every plan (the simulator's byte accounting is exact)."""
    from paraplan.executor.bridge import model_spec, simulator_plan, training_spec
    from paraplan.simulator.volumes import comm_bytes

    config = {**WORLD2, **WORLD4}[name]
    world = len(runs[name])
    model = model_spec(TinyGPTConfig(**config["model"]))
    training, plan = training_spec(config), simulator_plan(config, world)
    for result in runs[name]:
        predicted = comm_bytes(model, training, plan, world, rank=result["rank"])
        measured = {k: v // config["steps"] for k, v in result["bytes_by_kind"].items()}
        assert measured.pop("broadcast") == 0
        assert predicted == measured, f"{name} rank {result['rank']}"


@pytest.mark.parametrize("model", [DENSE, MOE])
def test_model_spec_counts_the_executor_parameters_exactly(model) -> None:
    from paraplan.executor.bridge import config_from_model_spec, model_spec

    cfg = TinyGPTConfig(**model)
    spec = model_spec(cfg)
    assert spec.num_params == _num_params(model)
    assert config_from_model_spec(spec, cfg.seq_len, seed=cfg.seed) == cfg
