"""The slowest part's pace: order statistics, the fleet figures, and where the simulator uses it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paraplan import TrainingSpec, load_cluster, parse_plan, simulate
from paraplan.simulator.compute import Device
from paraplan.simulator.variability import expected_max_standard_normal, slowest_part_pace
from paraplan.specs import load_gpu, load_model


def test_expected_max_of_normals_matches_closed_forms_and_tables():
    """E[max of n standard normals]: 1/sqrt(pi) for 2 and 3/(2 sqrt(pi)) for 3 in closed form;
    Harter (1961) tabulates 1.0294 for 4, 1.1630 for 5, 1.4236 for 8 and 1.5388 for 10."""
    assert expected_max_standard_normal(1) == 0.0
    assert expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max_standard_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-6)
    for n, table in ((4, 1.0294), (5, 1.1630), (8, 1.4236), (10, 1.5388)):
        assert expected_max_standard_normal(n) == pytest.approx(table, abs=1e-4)


@given(spread=st.floats(0.0, 0.5), n=st.integers(1, 1_000_000))
def test_pace_is_a_slowdown_that_grows_with_the_fleet(spread, n):
    pace = slowest_part_pace(spread, n)
    assert 0.0 < pace <= 1.0
    assert slowest_part_pace(spread, n + 1) <= pace
    if spread == 0.0 or n == 1:
        assert pace == 1.0


def test_profiles_carry_the_fleet_measurements():
    """V100: per-GPU SGEMM times of 392 Longhorn V100s, interquartile range 2.31% of the
    median; A100: ResNet-50 iteration times of 219 Lonestar6 A100s, 2.11%. A normal body's
    standard deviation is the IQR over 1.349 (hal-uw/blox-pal @da726cab aggregated_data)."""
    assert load_gpu("v100-sxm2-16gb").unit_speed_spread == pytest.approx(0.0231 / 1.349,
                                                                          abs=1e-4)
    assert load_gpu("a100-sxm-80gb").unit_speed_spread == pytest.approx(0.0211 / 1.349, abs=1e-4)
    assert load_gpu("mi300x").unit_speed_spread == 0.0  # no public fleet figure: no term


def test_device_computes_at_the_slowest_of_its_fleet():
    """Eight H100s in one step: GEMMs (the measured sustained figure) and attention run at
    1 / (1 + 0.0156 x 1.4236) of one median part's speed; memory bandwidth keeps its level."""
    h100 = load_gpu("h100-sxm")
    one, eight = Device.of(h100, "bf16"), Device.of(h100, "bf16", synced_gpus=8)
    pace = 1 / (1 + h100.unit_speed_spread * 1.4236)
    assert eight.matmul_flops == pytest.approx(one.matmul_flops * pace, rel=1e-4)
    assert eight.table_scale == pytest.approx(one.table_scale * pace, rel=1e-4)
    assert eight.attention_bwd_flops == pytest.approx(one.attention_bwd_flops * pace, rel=1e-4)
    assert eight.memory_Bps == one.memory_Bps
    a100 = load_gpu("a100-sxm-80gb")  # burst efficiency x sustained clock path
    ratio = Device.of(a100, "bf16", synced_gpus=512).matmul_flops / Device.of(
        a100, "bf16").matmul_flops
    assert ratio == pytest.approx(1 / (1 + a100.unit_speed_spread
                                       * expected_max_standard_normal(512)), rel=1e-9)


def test_simulate_prices_the_whole_jobs_slowest_part():
    """A one-GPU run has no one to wait for; the same per-GPU work on eight GPUs (data
    parallel) computes at the slowest of eight's pace; a fleet of identical parts does not."""
    model = load_model("llama3-8b")
    plan = parse_plan("tp=1,pp=1,zero=3,mbs=1,rc=full")

    def compute_s(nodes: int, gpus_per_node: int, spread: float | None = None) -> float:
        cluster = load_cluster("dgx-h100").with_nodes(nodes)
        group = cluster.node_groups[0]
        gpu = group.gpu if spread is None else group.gpu.model_copy(
            update={"unit_speed_spread": spread})
        group = group.model_copy(update={"gpu": gpu, "gpus_per_node": gpus_per_node})
        cluster = cluster.model_copy(update={"node_groups": [group]})
        n = cluster.num_gpus
        rep = simulate(model, cluster, TrainingSpec(global_batch_size=4 * n, seq_len=4096,
                                                    precision="bf16"), plan,
                       time_if_oom=True)
        return rep.time_s["compute"]

    one, eight, same = compute_s(1, 1), compute_s(1, 8), compute_s(1, 8, spread=0.0)
    assert same == pytest.approx(one, rel=1e-9)
    assert one < eight < one * (1 + 0.0156 * 1.4236) * 1.0001


def test_cli_simulate_says_how_much_slower_the_slowest_part_computes():
    """The real entry point: the JSON report carries each GPU type's pace, the text output
    says it in words (32 DGX H100 nodes: the slowest of 256 parts, 0.0156 x 2.83 = 4.4%)."""
    import json
    import os
    import subprocess
    import sys

    args = ["simulate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "32",
            "--global-batch", "1024", "--seq-len", "8192",
            "--plan", "tp=8,pp=2,vpp=10,sp=1,mbs=2,zero=1"]
    env = {**os.environ, "COLUMNS": "200"}
    res = subprocess.run([sys.executable, "-m", "paraplan", *args, "--format", "json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    pace = json.loads(res.stdout)["slowest_part_pace"]["h100-sxm"]
    assert 1 / pace - 1 == pytest.approx(0.0156 * expected_max_standard_normal(256), rel=1e-9)
    text = subprocess.run([sys.executable, "-m", "paraplan", *args], capture_output=True,
                          text=True, timeout=120, env=env)
    assert text.returncode == 0, text.stderr
    assert "h100-sxm 4.4% slower than a median part" in text.stdout


def test_a_part_of_a_larger_job_runs_at_the_whole_jobs_pace():
    """simulate(job_gpus=n): one replica group of a larger job (the data ILP prices each GPU
    type's group on a cluster of its own) computes at the pace of the job's n parts."""
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100")
    training = TrainingSpec(global_batch_size=16, seq_len=4096, precision="bf16")
    plan = parse_plan("tp=1,pp=1,zero=3,mbs=1,rc=full")
    alone = simulate(model, cluster, training, plan, time_if_oom=True)
    part = simulate(model, cluster, training, plan, time_if_oom=True, job_gpus=1024)
    spread = cluster.gpu.unit_speed_spread
    assert alone.extra["slowest_part_pace"]["h100-sxm"] == pytest.approx(
        1 / (1 + spread * expected_max_standard_normal(8)))
    assert part.extra["slowest_part_pace"]["h100-sxm"] == pytest.approx(
        1 / (1 + spread * expected_max_standard_normal(1024)))
    assert part.time_s["compute"] > alone.time_s["compute"]
