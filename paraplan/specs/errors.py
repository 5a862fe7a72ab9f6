"""One error type for every bad input, with the field, the value and what is allowed.

Users (and the CLI, which maps it to exit code 2) only ever see `SpecError` for bad input:
loaders translate pydantic's `ValidationError`, YAML/JSON parse errors and missing files
into it, so a malformed spec never surfaces as a traceback.
"""

from __future__ import annotations

import reprlib
from typing import Any

from pydantic import ValidationError


class SpecError(ValueError):
    """Bad user input: names the field, the value, the rule and (where possible) a fix.

    Args:
        message: one plain-English sentence (or several joined by '; ').
        field: dotted path of the offending field, e.g. ``plan.tp``.
        value: the offending value.
        allowed: what would be accepted, in words or as a collection.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        value: Any = None,
        allowed: Any = None,
    ) -> None:
        super().__init__(message)
        self.field = field
        self.value = value
        self.allowed = allowed


def short_repr(value: Any, limit: int = 60) -> str:
    """A bounded ``repr``: containers show a few items and long strings/ints are cut before
    they are formatted (a YAML alias bomb's value is never expanded into text)."""
    try:
        shown = _REPR.repr(value)
    except ValueError:  # an int too long for Python to print (over 4,300 digits)
        shown = f"<integer of about {int(value.bit_length() * 0.30103)} digits>"
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _bounded_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 2, 4, 4, 4, 4
    r.maxstring, r.maxlong, r.maxother = 60, 40, 60
    return r


_REPR = _bounded_repr()


def from_validation_error(exc: ValidationError, where: str) -> SpecError:
    """Turn a pydantic ValidationError into one readable SpecError.

    Each problem becomes ``<where>.<field>=<value>: <reason>``; pydantic's own wording for the
    reason is kept because it already states what is allowed ("Input should be 'none',
    'selective' or 'full'").
    """
    parts = []
    first_field = None
    first_value = None
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
        field = f"{where}.{loc}" if loc else where
        if first_field is None:
            first_field, first_value = field, err.get("input")
        msg = err.get("msg", "invalid value")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err.get("type") == "extra_forbidden":
            msg = "unknown key (check the spelling; unknown keys are rejected)"
            parts.append(f"{field}: {msg}")
        elif err.get("type") == "missing":
            parts.append(f"{field}: required field is missing")
        else:
            parts.append(f"{field}={short_repr(err.get('input'))}: {msg}")
    return SpecError("; ".join(parts), field=first_field, value=first_value)
