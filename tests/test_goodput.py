"""Goodput under failures: Young/Daly by hand, the optimum is an optimum, CLI end to end."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.simulator.goodput import (
    checkpoint_bytes,
    daly_interval,
    goodput,
    goodput_fraction,
    job_mtbf_s,
)
from paraplan.specs import SpecError
from tests.test_cli import CMD


def test_16k_gpus_at_50000_hour_mtbf_by_hand() -> None:
    # M = 50,000 h / 16,384 GPUs = 3.0518 h = 10,986.3 s.
    g = goodput(16_384, mtbf_h=50_000, checkpoint_write_s=60, restart_s=600)
    m = 50_000 / 16_384 * 3600
    assert g.job_mtbf_h * 3600 == pytest.approx(m)
    assert g.interruptions_per_day == pytest.approx(24 * 16_384 / 50_000)
    assert g.young_interval_s == pytest.approx(math.sqrt(2 * 60 * m))  # 1,148.2 s
    x = 60 / (2 * m)
    daly = math.sqrt(2 * 60 * m) * (1 + math.sqrt(x) / 3 + x / 9) - 60
    assert g.optimal_interval_s == pytest.approx(daly) == pytest.approx(1108.5, abs=0.1)
    wall = m * math.exp(600 / m) * (math.exp((daly + 60) / m) - 1)
    assert g.goodput == pytest.approx(daly / wall) == pytest.approx(0.8513, abs=1e-4)


def test_preemption_adds_to_the_failure_rate() -> None:
    assert job_mtbf_s(100, 1000) == pytest.approx(36.0 * 1000)
    # 100 GPUs, 1e-3 preemptions per GPU-hour: 0.1 + 0.1 per hour -> 5 h.
    assert job_mtbf_s(100, 1000, 1e-3) == pytest.approx(5 * 3600)
    slower = goodput(100, mtbf_h=1000, checkpoint_write_s=30, restart_s=120, preempt_per_h=1e-3)
    assert slower.goodput < goodput(100, mtbf_h=1000, checkpoint_write_s=30,
                                    restart_s=120).goodput


def test_checkpoint_longer_than_twice_the_mtbf_checkpoints_every_mtbf() -> None:
    assert daly_interval(1000.0, 400.0) == 400.0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 100_000), mtbf=st.floats(100, 1e6), delta=st.floats(0.1, 600),
       restart=st.floats(0, 3600), scale=st.floats(0.2, 5.0))
def test_daly_interval_is_near_optimal(n, mtbf, delta, restart, scale) -> None:
    m = job_mtbf_s(n, mtbf)
    g = goodput(n, mtbf_h=mtbf, checkpoint_write_s=delta, restart_s=restart)
    assert 0.0 <= g.goodput <= 1.0
    other = goodput_fraction(g.optimal_interval_s * scale, delta, restart, m)
    assert other <= g.goodput * (1 + 1e-3)  # Daly's estimate: optimal to high order


@pytest.mark.parametrize(("kw", "field"), [
    ({"mtbf_h": 0}, "mtbf_hours"), ({"checkpoint_write_s": -1}, "checkpoint_write_s"),
    ({"restart_s": -5}, "restart_s"), ({"preempt_per_h": -1}, "preemption_per_gpu_hour"),
])
def test_bad_inputs_name_the_field(kw, field) -> None:
    args = {"mtbf_h": 1000, "checkpoint_write_s": 10, "restart_s": 10, **kw}
    with pytest.raises(SpecError) as info:
        goodput(8, **args)
    assert info.value.field == field


def test_checkpoint_bytes() -> None:
    assert checkpoint_bytes(405e9) == pytest.approx(405e9 * 14)


BEST = ("best", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2",
        "--global-batch", "128", "--seq-len", "4096", "--top", "1", "--format", "json")


def test_cli_best_reports_goodput() -> None:
    res = subprocess.run([*CMD, *BEST, "--mtbf-hours", "50000", "--storage-GBps", "10"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    gp = data["goodput"]
    size = 14 * 8.03e9
    assert gp["checkpoint_write_s"] == pytest.approx(size / 1e10, rel=0.01)
    assert gp["restart_s"] == gp["checkpoint_write_s"] and 0.99 < gp["goodput"] < 1
    assert gp["effective_tokens_per_s"] == pytest.approx(
        data["plans"][0]["tokens_per_s"] * gp["goodput"])


@pytest.mark.parametrize(("extra", "needle"), [
    (("--mtbf-hours", "1000"), "--checkpoint-write-s"),
    (("--mtbf-hours", "1000", "--checkpoint-write-s", "10"), "--restart-s"),
    (("--restart-s", "10"), "needs --mtbf-hours"),
    (("--mtbf-hours", "-3", "--checkpoint-write-s", "1", "--restart-s", "1"), "mtbf_hours"),
])
def test_cli_goodput_bad_input_exits_2(extra, needle) -> None:
    res = subprocess.run([*CMD, *BEST, *extra], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr
