"""CLI through the real entry point (the installed ``paraplan`` console script)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXE = shutil.which("paraplan", path=str(Path(sys.executable).parent)) or shutil.which("paraplan")
CMD = [EXE] if EXE else [sys.executable, "-m", "paraplan"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PARAPLAN_DEBUG"}
    env["COLUMNS"] = "120"
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=120, env=env)


def test_profiles_json():
    res = run("profiles", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert len(data["gpus"]) >= 10 and len(data["links"]) >= 8
    assert len(data["models"]) >= 15
    assert {"dgx-h100", "dtfm-worldwide", "dgx-a100-80gb"} <= set(data["clusters"])
    assert len(data["clusters"]) >= 11
    assert "h100-sxm" in data["details"]["gpus"]


def test_profiles_table():
    res = run("profiles")
    assert res.returncode == 0 and "h100-sxm" in res.stdout and "Links" in res.stdout


def test_describe_model_json():
    res = run("describe", "--model", "mixtral-8x7b", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["num_params"] == pytest.approx(46.7e9, rel=0.01)
    assert data["num_active_params"] == pytest.approx(12.9e9, rel=0.01)
    assert data["shape"]["num_experts"] == 8


def test_describe_hf_config(hf_dir):
    res = run("describe", "--model", str(hf_dir / "llama3-70b.json"), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["num_params"] == pytest.approx(70.6e9, rel=0.01)


def test_describe_cluster_json_with_nodes():
    res = run("describe", "--cluster", "dgx-h100", "--nodes", "32", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["num_gpus"] == 256 and data["memory_GiB_per_gpu"] == 80
    assert data["peak_flops_per_gpu"]["bf16"] == pytest.approx(989e12)
    assert {link["name"] for link in data["links"]} == {"nvlink4", "ib-ndr"}


def test_describe_shows_a_power_limited_gpu_and_refuses_one_off_its_curve(tmp_path):
    capped = tmp_path / "capped.yaml"
    capped.write_text("name: capped\nnode: {gpu: h100-sxm, gpu_power_limit_W: 500, "
                      "gpus_per_node: 8, intra_node_link: nvlink4, inter_node_link: ib-ndr}\n")
    res = run("describe", "--cluster", str(capped), "--format", "json")
    assert res.returncode == 0, res.stderr
    group = json.loads(res.stdout)["node_groups"][0]
    assert group["power_limit_W"] == 500 and group["compute_at_power_limit"] == 0.844
    assert "@500W x0.844" in run("describe", "--cluster", str(capped)).stdout
    capped.write_text(capped.read_text().replace("500", "250"))
    res = run("describe", "--cluster", str(capped))
    assert res.returncode == 2 and "gpu_power_limit_W=250" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_describe_tables():
    res = run("describe", "--model", "llama3-8b", "--cluster", "dtfm-worldwide")
    assert res.returncode == 0, res.stderr
    assert "8,030,261,248" in res.stdout and "Tokyo" in res.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("describe", "--model", "llama9"), "unknown model 'llama9'"),
        (("describe", "--cluster", "dgx-h100", "--nodes", "0"), "--nodes=0 must be a positive"),
        (("describe", "--cluster", "dtfm-spot", "--nodes", "2"), "applies to clusters of one"),
        (("describe",), "describe needs --model or --cluster"),
        (("describe", "--bogus"), "No such option"),
        (("describe", "--cluster", "dgx-h100", "--nodes", "x"), "--nodes"),
        (("describe", "--model", "x", "--format", "xml"), "--format"),
    ],
)
def test_bad_input_exit_2_one_line_no_traceback(args, needle):
    res = run(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert needle in res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1


def test_bad_yaml_file_exit_2(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("name: c\nnode: {gpu: h100-sxm, gpus_per_node: 8, inter_node_link: ib-ndr}\n")
    res = run("describe", "--cluster", str(f))
    assert res.returncode == 2
    assert "intra_node_link is required when gpus_per_node=8" in res.stderr


def test_help_has_examples():
    res = run("--help")
    assert res.returncode == 0 and "paraplan describe --model llama3-70b" in res.stdout


def test_validate_published_json_through_entry_point():
    res = run("validate-published", "holdout", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert {"rows", "mape_pct", "by_source", "n_rows", "n_predicted"} <= set(data)
    assert data["n_rows"] == len(data["rows"]) >= 30
    statuses = {r["status"] for r in data["rows"]}
    assert statuses <= {"ok", "skipped", "infeasible"} and "ok" in statuses
    for row in data["rows"]:
        assert {"index", "source_id", "metric", "measured", "predicted", "error_pct", "status",
                "reason"} <= set(row)
        if row["status"] != "ok":
            assert row["reason"]  # never dropped silently
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    assert data["mape_pct"] == pytest.approx(sum(abs(r["error_pct"]) for r in ok) / len(ok))


def test_validate_published_detects_memory_csv_and_rejects_others(tmp_path):
    res = run("validate-published", "memory", "--format", "json")
    assert res.returncode == 0 and json.loads(res.stdout)["rows"][0]["metric"].endswith(
        ("_gib", "_baseline"))
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    res = run("validate-published", str(bad))
    assert res.returncode == 2 and "neither the throughput format" in res.stderr
    res = run("validate-published", str(tmp_path / "missing.csv"))
    assert res.returncode == 2 and "not found" in res.stderr


# ---- best ------------------------------------------------------------------------------------
BEST = ("best", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2",
        "--global-batch", "128", "--seq-len", "4096")


def test_best_json_contract(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "best.json"
    out.parent.mkdir()
    res = run(*BEST, "--top", "3", "--format", "json", "--explain", "--export", "json",
              "--out", str(out))
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert {"searcher", "plans_evaluated", "search_time_s", "plans",
            "baseline_step_time_s"} <= set(data)
    assert data["searcher"] == "exhaustive" and len(data["plans"]) == 3
    assert data["plans_evaluated"] > 1000
    first = data["plans"][0]
    for key in ("feasible", "reasons", "step_time_s", "tokens_per_s", "mfu", "hfu",
                "memory_gb", "memory_per_stage_gb", "time_s", "plan"):
        assert key in first
    assert data["explain"]["top_rejections"]
    written = json.loads(out.read_text())  # the best plan's plan JSON, search kept inside
    assert written["format"] == "paraplan-plan/1" and written["search"] == data
    assert written["plan"]["tp"] == first["plan"]["tp"]


def test_best_table_fix_and_explain() -> None:
    res = run(*BEST, "--top", "2", "--fix", "tp=2,rc=full", "--explain")
    assert res.returncode == 0, res.stderr
    assert "tp=2" in res.stdout and "rc=full" in res.stdout
    assert "rejected" in res.stdout and "plans considered" in res.stdout


@pytest.mark.parametrize(("extra", "needle"), [
    (("--fix", "foo=1"), "cannot pin 'foo'"),
    (("--fix", "tp=3"), "no legal plan"),
    (("--export", "json"), "--export needs --out"),
    (("--export", "yaml", "--out", "x.yaml"), "yaml"),
    (("--searcher", "magic"), "magic"),
    (("--moments-dtype", "fp16"), "--moments-dtype 'fp16'"),
    (("--moments-dtype", "bf16", "--trainer", "deepspeed"),
     "deepspeed (0.14) keeps its optimizer moments in fp32"),
])
def test_best_bad_input_exits_2(extra: tuple[str, ...], needle: str) -> None:
    res = run(*BEST, *extra)
    assert res.returncode == 2, res.stdout + res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr


def test_best_model_that_cannot_fit_says_why() -> None:
    res = run("best", "--model", "llama3-70b", "--cluster", "dgx-h100", "--global-batch", "8",
              "--seq-len", "8192")
    assert res.returncode == 2
    assert "no plan fits in memory" in res.stderr and "GiB" in res.stderr


def test_best_auto_uses_evolutionary_on_a_wan_cluster_and_reports_the_baseline() -> None:
    res = run("best", "--model", "gpt3-350m", "--cluster", "dtfm-multi-university", "--trainer",
              "generic",
              "--global-batch", "64", "--seq-len", "1024", "--precision", "fp16", "--top", "2",
              "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["searcher"] == "evolutionary"
    assert data["plans"][0]["step_time_s"] <= data["baseline_step_time_s"]
    assert data["placements"] and "convergence_s" in data["placements"][0]


def test_best_auto_uses_the_ilp_on_mixed_gpu_types(tmp_path: Path) -> None:
    yaml_text = (
        "name: two-types\n"
        "node_groups:\n"
        "  - {gpu: a100-sxm-80gb, gpus_per_node: 8, num_nodes: 1, intra_node_link: nvlink3,"
        " inter_node_link: ib-hdr}\n"
        "  - {gpu: v100-sxm2-32gb, gpus_per_node: 8, num_nodes: 1, intra_node_link: nvlink2,"
        " inter_node_link: eth-100g}\n")
    path = tmp_path / "two-types.yaml"
    path.write_text(yaml_text)
    res = run("best", "--model", "gpt3-760m", "--cluster", str(path), "--global-batch", "64",
              "--seq-len", "2048", "--precision", "fp16", "--top", "1")
    assert res.returncode == 0, res.stderr
    assert "ilp search" in res.stdout and "baseline" in res.stdout
    assert "optimality gap" in res.stdout


def test_fixing_an_unsearched_recompute_kind_is_a_clear_error():
    for searcher in ("exhaustive", "ilp"):
        res = run("best", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
                  "--global-batch", "16", "--seq-len", "4096", "--fix", "rc=layer",
                  "--searcher", searcher)
        assert res.returncode == 2, res.stderr
        assert "recompute 'layer' is not searched" in res.stderr
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_bad_fp8_gemm_table_names_its_own_field(tmp_path):
    from paraplan.specs import SpecError, load_gpu

    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("name: g\nmemory_GiB: 80\nmemory_bandwidth_GBps: 3000\n"
                   "peak_tflops: {bf16: 900, fp8: 1800}\ngemm_table_fp8: nope\n")
    with pytest.raises(SpecError, match="unknown gemm_table_fp8 'nope'") as err:
        load_gpu(str(gpu))
    assert err.value.field == "gpu.gemm_table_fp8"


def test_bf16_moments_from_the_command_line_shrink_the_optimizer_state() -> None:
    # ZeRO-1 over 8 GPUs: 12 bytes of optimizer state per parameter become 8 (bf16 moments),
    # a third less; torchtitan keeps fp32 moments, so the same plan is infeasible there.
    args = ("simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
            "--plan", "tp=1,zero=1,mbs=1,rc=full", "--global-batch", "64", "--seq-len", "4096",
            "--format", "json")
    full = json.loads(run(*args).stdout)
    half = json.loads(run(*args, "--moments-dtype", "bf16").stdout)
    assert half["memory_gb"]["optimizer"] == pytest.approx(
        full["memory_gb"]["optimizer"] * 8 / 12, rel=1e-9)
    titan = json.loads(run(*args, "--moments-dtype", "bf16", "--trainer", "torchtitan").stdout)
    assert not titan["feasible"]
    assert any("optimizer moments in fp32" in r for r in titan["reasons"])


def test_bf16_moments_survive_best_to_export_and_stay_on_the_distributed_optimizer(tmp_path):
    # Megatron's precision-aware optimizer runs with the distributed optimizer only, so the
    # search keeps zero=1 and its #1 exports; a best result carries the setting to export.
    a = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch",
         "64", "--seq-len", "4096")
    res = json.loads(run("best", *a, "--moments-dtype", "bf16", "--top", "5",
                         "--format", "json").stdout)
    assert all(p["plan"]["zero_stage"] == 1 for p in res["plans"])
    assert res["plans"][0]["moments_dtype"] == "bf16"
    result = tmp_path / "best.json"
    result.write_text(json.dumps(res))
    out = tmp_path / "run.sh"
    done = run("export", str(result), "--to", "megatron", *a, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "--exp-avg-dtype bf16" in out.read_text()
    clash = run("simulate", *a, "--plan", str(out), "--moments-dtype", "fp32")
    assert clash.returncode == 2 and "--moments-dtype" in clash.stderr


def test_moe_host_sync_option_sets_the_stall_and_rejects_bad_values():
    """NVIDIA's 16-H100 Qwen3-30B HybridEP run: megatron-core's stall (0.616 ms per MoE layer
    forward) over 64 micro-batches x 48 layers; --moe-host-sync-ms 0 prices sync-free MoE."""
    args = ("simulate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2",
            "--plan", "tp=1,ep=16,mbs=1,zero=1", "--global-batch", "1024", "--seq-len", "4096",
            "--moe-dispatcher", "hierarchical", "--moe-imbalance", "1.0", "--format", "json")
    steps = []
    for extra in ((), ("--moe-host-sync-ms", "0")):
        res = run(*args, *extra)
        assert res.returncode == 0, res.stderr
        steps.append(json.loads(res.stdout)["step_time_s"])
    assert steps[0] - steps[1] == pytest.approx(64 * 48 * 0.616e-3, rel=1e-3)
    for bad in ("-1", "nan", "1e9"):
        res = run(*args, "--moe-host-sync-ms", bad)
        assert res.returncode == 2 and "--moe-host-sync-ms" in res.stderr
        assert "Traceback" not in res.stderr


def test_moe_dispatcher_sms_option_prices_the_overlap_and_rejects_bad_values():
    """Under the all-to-all overlap the flex dispatcher's SMs are taken from the compute beside
    it: NVIDIA's HybridEP benchmarks hold 32 SMs, not DeepEP's default 20, so the same plan is
    slower; without the overlap the option changes nothing."""
    args = ("simulate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2",
            "--plan", "tp=1,ep=16,mbs=1,zero=1", "--global-batch", "1024", "--seq-len", "4096",
            "--moe-dispatcher", "hierarchical", "--moe-imbalance", "1.0", "--format", "json")

    def step(*extra: str) -> float:
        res = run(*args, *extra)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)["step_time_s"]

    assert step("--moe-a2a-overlap", "--moe-dispatcher-sms", "32") > \
        step("--moe-a2a-overlap") == step("--moe-a2a-overlap", "--moe-dispatcher-sms", "20")
    assert step("--moe-dispatcher-sms", "32") == step()
    quiet = run(*args, "--moe-a2a-overlap", "--moe-dispatcher-sms", "32")
    ignored = run(*args, "--moe-dispatcher-sms", "32")
    assert "note:" not in quiet.stderr and "--moe-dispatcher-sms changes nothing" in \
        ignored.stderr
    for bad in ("0", "5000", "x"):
        res = run(*args, "--moe-dispatcher-sms", bad)
        assert res.returncode == 2 and "--moe-dispatcher-sms" in res.stderr
        assert "Traceback" not in res.stderr


def test_a_best_result_keeps_its_moe_knobs_when_simulated_again(tmp_path):
    """``best --moe-dispatcher-sms --moe-imbalance`` records both with each plan, so
    ``simulate --plan best.json`` prices the plan as it was ranked without repeating them;
    given again with another value, the command line wins."""
    out = tmp_path / "best.json"
    common = ("--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2",
              "--global-batch", "1024", "--seq-len", "4096")
    res = run("best", *common, "--moe-dispatcher", "hierarchical", "--moe-a2a-overlap",
              "--moe-dispatcher-sms", "32", "--moe-imbalance", "1.0",
              "--fix", "ep=16,tp=1,pp=1", "--top", "1", "--format", "json")
    assert res.returncode == 0, res.stderr
    out.write_text(res.stdout)
    best = json.loads(res.stdout)["plans"][0]
    assert best["moe_dispatcher_sms"] == 32 and best["moe_dispatcher"] == "hierarchical"
    assert best["moe_load_imbalance"] == 1.0

    def step(*extra: str) -> float:
        again = run("simulate", *common, "--plan", str(out), *extra, "--format", "json")
        assert again.returncode == 0, again.stderr
        return json.loads(again.stdout)["step_time_s"]

    assert step() == pytest.approx(best["step_time_s"], rel=1e-12)
    assert step("--moe-imbalance", "1.3") > best["step_time_s"]  # busier ranks
    assert step("--moe-dispatcher-sms", "20") < best["step_time_s"]  # fewer SMs taken
