"""What every trainer-config reader returns, and the one error it raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from paraplan.specs.errors import SpecError
from paraplan.specs.plan import ParallelPlan


class ImportError_(SpecError):  # noqa: N801 - not the builtin ImportError
    """The file is a trainer config paraplan cannot read into a plan (names the key)."""


@dataclass(frozen=True)
class ImportedConfig:
    """A trainer config read back into paraplan terms.

    ``plan`` holds what the config says (parallel degrees, micro-batch, schedule, layer split,
    recompute, ZeRO stage, and the overlaps the config switches on or off, as explicit fields);
    ``training`` the TrainingSpec fields it states (global batch, sequence length, precision,
    dropout, gradient-reduction dtype, kernels), each only when the file sets it.
    """

    trainer: str
    """The trainer profile whose config this is (``hardware_profiles/trainers``)."""
    plan: ParallelPlan
    training: dict[str, Any] = field(default_factory=dict)
    model: dict[str, int] = field(default_factory=dict)
    """Model shape keys the file states (num_layers, hidden_size, ...), to check against the
    model the user names."""
    path: str = ""


def need(data: dict[str, Any], key: str, where: str) -> Any:
    """``data[key]`` or an ImportError_ naming ``where.key``."""
    if key not in data:
        raise ImportError_(f"{where} has no {key!r}; paraplan needs it to read the plan",
                           field=f"{where}.{key}")
    return data[key]


def as_int(value: Any, key: str, low: int = 1, high: int | None = None) -> int:
    """An integer >= ``low`` (and <= ``high`` when given; booleans refused), or an
    ImportError_ naming the key."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ImportError_(f"{key}={value!r} must be an integer", field=key, value=value)
    try:
        out = int(value)
    except ValueError:
        raise ImportError_(f"{key}={value!r} must be an integer", field=key,
                           value=value) from None
    if out < low:
        raise ImportError_(f"{key}={out} must be >= {low}", field=key, value=out)
    if high is not None and out > high:
        raise ImportError_(f"{key}={out} must be <= {high:.0e}", field=key, value=out)
    return out
