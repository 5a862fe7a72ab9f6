"""paraplan run / calibrate / validate-executor through the real entry point (real gloo
processes on CPU)."""

from __future__ import annotations

import json

import pytest
import yaml

from paraplan import load_cluster
from tests.test_cli import run

pytest.importorskip("torch.distributed")

TINY = {"name": "exec-tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_kv_heads": 2, "ffn_hidden_size": 128, "vocab_size": 256,
        "position_embedding": "learned", "max_position_embeddings": 32, "use_bias": True}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return str(path)


@pytest.fixture(scope="module")
def profile(quick_calibration) -> str:
    """A quick calibration of this machine, written by the CLI (shared, see conftest)."""
    path, meas = quick_calibration
    assert {"gemm", "memory", "attention", "elementwise", "collectives"} <= set(meas)
    return path


def test_calibrated_profile_loads_with_measured_efficiencies(profile) -> None:
    gpu = load_cluster(profile).gpu
    assert gpu.peak_tflops["fp32"] > 0
    assert 0 < gpu.attention_efficiency_fwd <= 1 and 0 < gpu.attention_efficiency_bwd <= 1
    assert 0 < gpu.memory_bandwidth_efficiency <= 1


@pytest.mark.parametrize("plan", ["tp=2,sp=1,mbs=2", "pp=2,mbs=1,schedule=1f1b",
                                  "dp=2,zero=1,mbs=2"])
def test_run_reports_exact_bytes_and_a_prediction(tiny_model, profile, plan) -> None:
    proc = run("run", plan, "--nproc", "2", "--steps", "2", "--model", tiny_model,
               "--seq-len", "32", "--global-batch", "4", "--cluster", profile,
               "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["bytes_exact"] is True
    assert len(out["ranks"]) == 2 and len(out["step_times_s"]) == 2
    assert out["measured_step_s"] > 0 and out["predicted_step_s"] > 0
    assert all(loss == loss for loss in out["loss"])  # finite, same on every rank


def test_run_takes_the_best_plan_from_a_best_export(tiny_model, tmp_path) -> None:
    export = tmp_path / "best.json"
    export.write_text(json.dumps({"plans": [{"feasible": True, "plan": {
        "tp": 2, "pp": 1, "dp": 1, "micro_batch_size": 2}}]}))
    proc = run("run", str(export), "--nproc", "2", "--steps", "1", "--model", tiny_model,
               "--seq-len", "32", "--global-batch", "2", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plan"]["tp"] == 2


@pytest.mark.parametrize("args, words", [
    (["tp=3"], "tp=3"),
    (["tp=2,dp=1", "--nproc", "4"], "does not equal the world size 4"),
    (["cp=2"], "plan.cp=2 is not supported"),
    (["tp=1", "--model", "llama3-8b"], "model.activation"),
])
def test_run_bad_input_exits_2_with_one_line(args, words) -> None:
    proc = run("run", *args, "--global-batch", "2")
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr


def test_validate_executor_json_contract(profile) -> None:
    proc = run("validate-executor", "--cluster", profile, "--steps", "1", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["n_runs"] >= 6 and out["bytes_exact"] is True
    names = {r["name"] for r in out["runs"]}
    assert {"dp", "tp", "pp-1f1b", "ep"} <= names
    for r in out["runs"]:
        assert {"plan", "measured_step_s", "predicted_step_s", "error_pct", "bytes_measured",
                "bytes_predicted"} <= set(r)
        assert r["bytes_measured"] == r["bytes_predicted"]
    assert out["mape_pct"] > 0 and -1 <= out["spearman"] <= 1
