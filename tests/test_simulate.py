"""simulate(): the StepReport contract, breakdown consistency, infeasibility reasons."""

from __future__ import annotations

import json
import subprocess

import pytest

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan
from paraplan.simulator.step import simulate
from tests.test_cli import CMD

CONTRACT = {"feasible", "reasons", "step_time_s", "tokens_per_s", "model_tflops_per_gpu",
            "hardware_tflops_per_gpu", "mfu", "hfu", "memory_gb", "memory_per_stage_gb",
            "time_s", "plan"}
TIME_PARTS = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble",
              "optimizer")


def run(model="llama3-70b", cluster="dgx-h100", nodes=8, plan="tp=8,pp=4,mbs=1,sp=1",
        gbs=256, seq=8192, **kw):
    return simulate(load_model(model), load_cluster(cluster, nodes=nodes),
                    TrainingSpec(global_batch_size=gbs, seq_len=seq, **kw), parse_plan(plan))


def test_contract_keys_and_sane_values():
    rep = run(plan="tp=8,pp=4,mbs=1,sp=1,rc=selective").to_dict()
    assert set(rep) >= CONTRACT
    assert rep["feasible"] and rep["reasons"] == []
    assert 0.05 < rep["mfu"] < 0.8 and rep["hfu"] >= rep["mfu"]
    assert set(rep["memory_gb"]) == {"weights", "grads", "optimizer", "activations", "other",
                                     "peak"}
    assert set(rep["time_s"]) == set(TIME_PARTS) | {"exposed_comm"}
    assert len(rep["memory_per_stage_gb"]) == 4


@pytest.mark.parametrize("plan", ["tp=8,pp=4,mbs=1,sp=1", "tp=4,pp=8,mbs=2,rc=full,zero=1",
                                  "tp=8,pp=4,vpp=5,schedule=interleaved,sp=1,rc=selective",
                                  "tp=8,pp=2,cp=2,sp=1,rc=full", "tp=8,pp=1,zero=3,rc=full"])
def test_breakdown_adds_up_to_step_time(plan):
    rep = run(plan=plan, nodes=16)
    assert rep.step_time_s is not None, rep.reasons
    parts = sum(rep.time_s[k] for k in TIME_PARTS)
    assert parts == pytest.approx(rep.step_time_s, rel=1e-6)


def test_mfu_is_model_flops_over_time_and_peak():
    rep = run(plan="tp=8,pp=4,mbs=1,sp=1,rc=full")
    from paraplan.simulator.flops import model_flops_per_step
    flops = model_flops_per_step(load_model("llama3-70b"), 256, 8192)
    assert rep.mfu == pytest.approx(flops / rep.step_time_s / 64 / 989e12, rel=1e-9)
    assert rep.hfu > rep.mfu  # full recompute re-runs the forward


def test_illegal_plan_reports_every_reason():
    rep = run(model="llama3-8b", plan="tp=3,pp=3,sp=1", nodes=1)
    assert not rep.feasible and rep.step_time_s is None and len(rep.reasons) >= 2


def test_out_of_memory_says_by_how_much_and_where():
    rep = run(plan="tp=8,pp=1,mbs=1", nodes=1, gbs=8)
    assert not rep.feasible
    (reason,) = rep.reasons
    assert reason.startswith("out of memory by ") and "on stage 0" in reason
    assert rep.memory_gb["peak"] > 80


def test_zero_shards_optimizer_over_dp():
    base = run(plan="tp=8,pp=4,mbs=1,sp=1,rc=full", nodes=16)
    z1 = run(plan="tp=8,pp=4,mbs=1,sp=1,rc=full,zero=1", nodes=16)
    assert z1.memory_gb["optimizer"] == pytest.approx(base.memory_gb["optimizer"] / 4, rel=1e-9)
    assert z1.memory_gb["weights"] == pytest.approx(base.memory_gb["weights"])


def test_more_microbatches_shrink_the_bubble_share():
    few = run(plan="tp=8,pp=8,mbs=1,sp=1,rc=full", nodes=8, gbs=16)
    many = run(plan="tp=8,pp=8,mbs=1,sp=1,rc=full", nodes=8, gbs=256)
    assert few.time_s["bubble"] / few.step_time_s > many.time_s["bubble"] / many.step_time_s


def test_interleaving_cuts_the_bubble():
    plain = run(plan="tp=8,pp=8,mbs=1,sp=1,rc=full", nodes=8, gbs=64)
    inter = run(plan="tp=8,pp=8,vpp=5,schedule=interleaved,mbs=1,sp=1,rc=full", nodes=8, gbs=64)
    assert inter.time_s["bubble"] < plain.time_s["bubble"]


def test_unequal_split_uses_event_simulation():
    even = run(plan="tp=8,pp=4,mbs=1,sp=1,rc=full", nodes=8)
    skew = run(plan="tp=8,pp=4,mbs=1,sp=1,rc=full,layers=26/18/18/18", nodes=8)
    assert skew.step_time_s > even.step_time_s


def test_moe_with_expert_parallel():
    rep = run(model="mixtral-8x7b", plan="tp=2,pp=1,ep=8,mbs=1,sp=1,rc=full,zero=1", nodes=2,
              gbs=64, seq=4096)
    assert rep.feasible, rep.reasons
    assert rep.time_s["ep_comm"] > 0


def test_cli_simulate_json_through_entry_point():
    res = subprocess.run([*CMD, "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                          "--plan", "tp=2,pp=1,mbs=1,sp=1,zero=1", "--global-batch", "64",
                          "--seq-len", "4096", "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert set(rep) >= CONTRACT and rep["feasible"]


def test_cli_simulate_bad_plan_exit_2():
    res = subprocess.run([*CMD, "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                          "--plan", "tp=8,pp=1,rc=sometimes", "--global-batch", "64",
                          "--seq-len", "4096"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "plan.recompute='sometimes'" in res.stderr


def test_cli_simulate_plot_writes_a_timeline_png(tmp_path):
    out = tmp_path / "timeline.png"
    res = subprocess.run([*CMD, "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                          "--plan", "tp=1,pp=4,mbs=1,rc=full,vpp=2,schedule=interleaved",
                          "--global-batch", "16", "--seq-len", "2048", "--nodes", "1",
                          "--plot", str(out), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["feasible"]
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a real, busy figure
    from matplotlib import image

    pixels = image.imread(str(out))
    assert pixels.std() > 0.05  # not a blank canvas


def test_cli_simulate_plot_rejects_infeasible_and_bad_suffix(tmp_path):
    base = [*CMD, "simulate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--plan",
            "tp=8,pp=1,mbs=1", "--global-batch", "8", "--seq-len", "8192"]
    res = subprocess.run([*base, "--plot", str(tmp_path / "x.png")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "--plot needs a feasible plan" in res.stderr
    assert not (tmp_path / "x.png").exists()
    res = subprocess.run([*CMD, "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                          "--plan", "tp=1,pp=2", "--global-batch", "16", "--seq-len", "2048",
                          "--plot", str(tmp_path / "x.txt")], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "must end in .png, .svg or .pdf" in res.stderr


def test_mixed_gpu_cluster_paces_each_stage_by_its_slowest_gpu():
    from paraplan.specs.loaders import cluster_from_dict

    mixed = cluster_from_dict({"name": "mixed", "node_groups": [
        {"gpu": "a100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 1,
         "intra_node_link": "nvlink3", "inter_node_link": "ib-hdr", "nics_per_node": 8},
        {"gpu": "v100-sxm2-32gb", "gpus_per_node": 8, "num_nodes": 1,
         "intra_node_link": "nvlink2", "inter_node_link": "ib-hdr", "nics_per_node": 8},
    ]})
    model = load_model("gpt3-6.7b")
    tr = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16",
                      flash_attention=False)
    plan = parse_plan("tp=8,pp=2,mbs=1,rc=full")
    rep = simulate(model, mixed, tr, plan)
    assert rep.extra["stage_gpu_types"] == [["a100-sxm-80gb"], ["v100-sxm2-32gb"]]
    f, b = rep.extra["stage_forward_s"], rep.extra["stage_backward_s"]
    # V100 vs A100: GEMMs ~2.4x slower (112 vs 271 achievable TFLOP/s), memory-bound work
    # ~2.2x (0.79 vs 1.71 TB/s), NVLink2 TP rings 2x: the V100 stage is about 2x slower.
    assert f[1] + b[1] > 1.8 * (f[0] + b[0])
    assert rep.extra["stage_memory_capacity_gb"] == [80, 32]
    same = simulate(model, load_cluster("dgx-a100-80gb", nodes=2), tr, plan)
    assert rep.step_time_s > 1.5 * same.step_time_s
    # MFU is taken against the mixed cluster's mean peak, so it is not understated.
    mean_peak = (8 * 312e12 + 8 * 125e12) / 16
    assert rep.mfu == pytest.approx(rep.model_tflops_per_gpu * 1e12 / mean_peak)


def test_cli_simulate_unwritable_plot_and_missing_plan_file_exit_2(tmp_path):
    base = [*CMD, "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100",
            "--global-batch", "16", "--seq-len", "2048"]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = subprocess.run([*base, "--plan", "tp=1,pp=2", "--plot", str(blocker / "x.png")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "cannot write --plot" in res.stderr
    assert "Traceback" not in res.stderr
    res = subprocess.run([*base, "--plan", str(tmp_path / "plan.json")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "plan file" in res.stderr and "not found" in res.stderr
