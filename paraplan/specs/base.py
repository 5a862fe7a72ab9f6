"""Shared pydantic base: frozen value types that reject unknown keys, non-finite numbers and
booleans where a number belongs."""

from __future__ import annotations

import types
import typing
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from paraplan.specs.errors import short_repr


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
                if _holds_bool(value) and _numeric_only(cls, str(name)):
                    raise ValueError(f"{name}={short_repr(value)} holds a boolean; give a "
                                     "number")
        return data


def _holds_bool(value: Any) -> bool:
    """``value`` is a boolean or a list/dict (one level or two) holding one."""
    if isinstance(value, bool):
        return True
    if isinstance(value, list | tuple):
        return any(isinstance(v, bool) or (isinstance(v, list | tuple) and _holds_bool(v))
                   for v in value[:10_000])
    if isinstance(value, dict):
        return any(isinstance(v, bool) for v in list(value.values())[:10_000])
    return False


@cache
def _numeric_only(cls: type[BaseModel], name: str) -> bool:
    """Whether field ``name`` of ``cls`` holds numbers (also in lists, dict values and
    numeric ``Literal`` choices) but never booleans."""
    field = cls.model_fields.get(name)
    if field is None:
        return False
    kinds = _leaf_types(field.annotation)
    return bool(kinds - {type(None)}) and bool not in kinds and kinds <= {int, float, type(None)}


def _leaf_types(annotation: Any) -> frozenset:
    if annotation is None or annotation is type(None):
        return frozenset({type(None)})
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return frozenset(type(a) for a in args)
    if origin is typing.Annotated:
        return _leaf_types(args[0])
    if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset):
        out: set = set()
        for a in args:
            if a is not Ellipsis:
                out |= _leaf_types(a)
        return frozenset(out)
    if origin is dict:
        return _leaf_types(args[1]) if len(args) == 2 else frozenset({object})
    if isinstance(annotation, type):
        return frozenset({annotation})
    return frozenset({object})
