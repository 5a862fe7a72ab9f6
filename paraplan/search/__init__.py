"""Searchers over parallel plans: vectorized exhaustive, dynamic programming, ILP, evolutionary.

``search(model, cluster, training, searcher="auto")`` is the entry point (``paraplan best``):
``auto`` runs the exhaustive search on a cluster with one GPU type and uniform links, the ILP
on one that mixes GPU types, and the evolutionary (DT-FM placement) search on one GPU type
spread over regions or uneven links.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from paraplan.search.dispatch import SEARCHERS, search
from paraplan.search.exhaustive import SearchResult, exhaustive_search
from paraplan.search.moe_runs import run_training
from paraplan.search.space import SpaceOptions, parse_fix


class _CallableModule(types.ModuleType):
    """Lets ``from paraplan import search; search(model, cluster, training)`` call the entry
    point (the DESIGN contract) while ``paraplan.search.space`` etc. stay submodules."""

    def __call__(self, *args: Any, **kwargs: Any) -> SearchResult:
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["SEARCHERS", "SearchResult", "SpaceOptions", "exhaustive_search", "parse_fix",
           "run_training",
           "search"]
