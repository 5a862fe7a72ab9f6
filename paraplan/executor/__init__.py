"""paraplan.executor: a small real torch.distributed trainer that runs plans and checks the
simulator.

Exports are lazy so that importing the package (or a torch-free submodule) does not need
torch, which is the optional ``executor`` extra.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Comm": "comm",
    "ProcessGrid": "grid",
    "ReferenceGPT": "model",
    "TinyGPTConfig": "model",
    "reference_run": "train",
    "train_worker": "train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'paraplan.executor' has no attribute {name!r}")
    return getattr(importlib.import_module(f"paraplan.executor.{_EXPORTS[name]}"), name)
