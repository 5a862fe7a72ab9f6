"""Shared fixtures."""

from __future__ import annotations

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
