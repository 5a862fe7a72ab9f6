"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture()
def hf_dir() -> Path:
    return DATA / "hf"
