"""Shared fixtures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs the same examples every time (a red build must mean a change broke something);
# `pytest --hypothesis-profile=explore` draws new random examples to hunt for bugs.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None, max_examples=500)
settings.load_profile("ci")

DATA = Path(__file__).parent / "data"


@pytest.fixture()
def hf_dir() -> Path:
    return DATA / "hf"


@pytest.fixture(scope="session")
def quick_calibration(tmp_path_factory) -> tuple[str, dict]:
    """One ``paraplan calibrate --quick`` of this machine through the real entry point, shared
    by every test that needs a calibrated profile (each run measures for ~25 s on 2 cores):
    (profile path, the ``measurements`` it printed)."""
    pytest.importorskip("torch.distributed")
    path = tmp_path_factory.mktemp("cal") / "here.yaml"
    proc = subprocess.run([sys.executable, "-m", "paraplan", "calibrate", "--quick", "--out",
                           str(path), "--format", "json"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["profile"] == str(path)
    return str(path), data["measurements"]
