"""Reading the cells of one published CSV row: numbers, integers, specs built with the row's
position in errors, model families."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from paraplan.specs.loaders import _build


class SkipRow(Exception):
    """The row cannot be turned into specs; the message is the skip reason."""


def cell(row: dict[str, Any], key: str) -> str:
    return str(row.get(key) or "").strip()


def number(text: str, key: str) -> float:
    try:
        return float(text.replace(",", "").rstrip("%").strip())
    except ValueError:
        raise SkipRow(f"column {key}={text!r} is not a number") from None


def int_cell(row: dict[str, Any], key: str) -> int | None:
    text = cell(row, key)
    if not text:
        return None
    value = number(text, key)
    if value != int(value):
        raise SkipRow(f"column {key}={text!r} is not a whole number")
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
