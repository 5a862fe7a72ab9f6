"""Reading the cells of one published CSV row: numbers, integers, specs built with the row's
position in errors, model families."""

from __future__ import annotations

import functools
import math
from typing import Any

from pydantic import BaseModel

from paraplan.specs.errors import short_repr
from paraplan.specs.loaders import _build, list_profiles, load_model
from paraplan.specs.model import ModelSpec


class SkipRow(Exception):
    """The row cannot be turned into specs; the message is the skip reason."""


MAX_CELL_CHARS = 131_072
"""Longest cell a row may hold (Python csv's default field limit); a longer one skips its row."""


def cell(row: dict[str, Any], key: str) -> str:
    text = str(row.get(key) or "").strip()
    if len(text) > MAX_CELL_CHARS:
        raise SkipRow(f"column {key} holds {len(text):,} characters, over the "
                      f"{MAX_CELL_CHARS:,}-character limit")
    return text


def number(text: str, key: str) -> float:
    try:
        value = float(text.replace(",", "").rstrip("%").strip())
    except ValueError:
        raise SkipRow(f"column {key}={short_repr(text)} is not a number") from None
    if not math.isfinite(value):
        raise SkipRow(f"column {key}={short_repr(text)} is not a finite number")
    return value


def int_cell(row: dict[str, Any], key: str, minimum: int = 1) -> int | None:
    """A count column (GPUs, degrees, batch sizes, layers): a whole number >= ``minimum`` (1;
    0 where zero means "none", e.g. experts), or None when empty; anything else skips the row
    with its reason (0 is never read as "not given")."""
    text = cell(row, key)
    if not text:
        return None
    value = number(text, key)
    if value != int(value) or value < minimum or value > 1e9:
        raise SkipRow(f"column {key}={short_repr(text)} must be a whole number from {minimum} "
                      "to 1e9")
    return int(value)


def make_spec(cls: type[BaseModel], where: str, **kwargs: Any) -> Any:
    """``cls(**kwargs)`` with pydantic errors turned into SpecError (see loaders._build)."""
    return _build(cls, kwargs, where)


def model_family(name: str, source: str) -> str:
    low = name.lower()
    if low.startswith("llama") or source == "torchtitan":
        return "llama"
    if low.startswith("mpt") or source == "mosaicml_llmfoundry_mpt":
        return "mpt"
    if low.startswith("bloom"):
        return "bloom"
    return "gpt"


PRESET_MODEL_SOURCES = frozenset({"megatron_bridge_moe", "megatron_bridge_ep_overlap",
                                  "megatron_bridge_dense", "megatron_bridge_moe_2608",
                                  "stas00_h200_b200"})
"""Sources whose rows name a model preset in ``model_name`` (sources.md)."""


@functools.lru_cache(maxsize=16)
def preset_model(name: str) -> ModelSpec:
    """The model preset a row names (sources in ``PRESET_MODEL_SOURCES``)."""
    if name not in list_profiles("models"):
        raise SkipRow(f"model preset {name!r} does not exist")
    return load_model(name)
