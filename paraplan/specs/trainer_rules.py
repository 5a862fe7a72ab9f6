"""Plan shapes a trainer runs differently from what it was asked, as predicates over the plan's
degrees (numbers or numpy arrays alike), shared by ``trainer.trainer_reasons``, the search's
vectorized ``trainer_filter.trainer_mask`` and the exporters, so the three cannot drift."""

from __future__ import annotations

from typing import Any


def ddp_beside_others(zero: Any, dp: Any, tp: Any, pp: Any, cp: Any) -> Any:
    """Replicated data parallelism (zero_stage 0) where torchtitan does not run it
    (``can.ddp_only_alone``): over dp > 1 beside tp or pp (v0.2.2 parallelize.py: "DDP has
    not supported > 1D parallelism"), or with cp > 1 (``fsdp_enabled`` then holds and it
    shards over the CP ranks)."""
    return (zero == 0) & ((cp > 1) | ((dp > 1) & ((tp > 1) | (pp > 1))))


def mixed_precision_off(zero: Any, dp: Any, tp: Any, pp: Any, cp: Any) -> Any:
    """tp or pp > 1 without FSDP (neither zero_stage >= 1 over dp > 1 nor cp > 1), where
    torchtitan v0.2.2 turns mixed precision off and trains in fp32 (distributed/utils.py
    ``maybe_enable_amp``; ``can.mixed_precision_needs_fsdp``)."""
    return ((tp > 1) | (pp > 1)) & (cp <= 1) & ((zero < 1) | (dp <= 1))
