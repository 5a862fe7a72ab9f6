"""Shared pydantic base: frozen value types that reject unknown keys, non-finite numbers and
booleans where a number belongs."""

from __future__ import annotations

import typing
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class StrictModel(BaseModel):
    """Immutable spec value; unknown keys are an error, not silently ignored.

    Every float must be finite (``inf``/``nan`` would make a part of the step free or the
    output invalid JSON), and ``true``/``false`` are refused where a number belongs (pydantic
    would read ``num_layers: true`` as a 1-layer model).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                if isinstance(value, bool) and _numeric_only(cls, str(name)):
                    raise ValueError(f"{name}={value} is a boolean; give a number")
        return data


@cache
def _numeric_only(cls: type[BaseModel], name: str) -> bool:
    """Whether field ``name`` of ``cls`` takes numbers but not booleans."""
    field = cls.model_fields.get(name)
    if field is None:
        return False
    kinds = _leaf_types(field.annotation)
    return bool(kinds) and bool not in kinds and kinds <= {int, float, type(None)}


def _leaf_types(annotation: Any) -> frozenset:
    if annotation is None:
        return frozenset()
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if args and origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        out: set = set()
        for a in args:
            out |= _leaf_types(a)
        return frozenset(out)
    if isinstance(annotation, type):
        return frozenset({annotation})
    return frozenset({object})
