"""DT-FM reproduction: scheduled vs random placement on DT-FM's worldwide network."""

from __future__ import annotations

import json
import subprocess

import pytest

from paraplan.validate.dtfm import dtfm_reference, reproduce
from tests.test_cli import CMD


def test_reference_numbers_are_dtfm_l24_b1024() -> None:
    ref = {r["scenario"]: r for r in dtfm_reference()}
    assert set(ref) == {"datacenter", "spot", "multi-university", "regional", "worldwide"}
    assert ref["worldwide"]["with_scheduler_s"] == 43.78
    assert ref["worldwide"]["without_scheduler_s"] == pytest.approx((92.29 + 89.64) / 2,
                                                                     abs=0.01)


def test_worldwide_scheduling_beats_random_placement_by_2x() -> None:
    row = reproduce(["worldwide"])["rows"][0]
    assert row["plan"].endswith("placed")
    assert row["speedup_vs_random"] >= 2.0  # issue 7: >= 2x predicted
    assert row["random_s"] > row["rank_order_s"] >= row["scheduled_s"]
    assert len(row["random_runs_s"]) == 3
    assert row["dtfm_speedup"] == pytest.approx(90.97 / 43.78)
    assert row["scheduled_error_pct"] == pytest.approx(
        100 * (row["scheduled_s"] - 43.78) / 43.78)


def test_cli_validate_dtfm_json_and_bad_scenario() -> None:
    res = subprocess.run([*CMD, "validate-dtfm", "--scenario", "multi-university", "--format",
                          "json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [r["scenario"] for r in data["rows"]] == ["multi-university"]
    res = subprocess.run([*CMD, "validate-dtfm", "--scenario", "mars"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "mars" in res.stderr and "worldwide" in res.stderr
