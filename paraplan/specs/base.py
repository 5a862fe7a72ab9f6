"""Shared pydantic base: frozen value types that reject unknown keys."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Immutable spec value; unknown keys are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
