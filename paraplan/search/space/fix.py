"""Which plan fields a search enumerates and which stay constant, and ``parse_fix`` (pins such
as ``tp=8,pp=4``)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from paraplan.specs.errors import SpecError, from_validation_error
from paraplan.specs.plan import ALIASES, ParallelPlan, _coerce_inline

RECOMPUTES: tuple[str, ...] = ("none", "selective", "op", "full")
# Plan fields that are the same for every plan of a search (set with --fix, else defaults).
CONSTANT_FIELDS = ("tp_comm_overlap", "overlap_grad_reduce", "overlap_p2p_comm",
                   "dp_sync_interval",
                   "grad_compression_ratio", "allow_cross_node_tp", "grad_compression",
                   "compression_rank", "compression_bits", "compression_topk",
                   "pseudo_grad_bits", "activation_compression_bits")
# The relaxed-synchronization knobs among them (simulator.compression prices them).
COMPRESSION_FIELDS = tuple(f for f in CONSTANT_FIELDS
                           if f not in ("tp_comm_overlap", "overlap_grad_reduce",
                                        "overlap_p2p_comm", "allow_cross_node_tp"))
def check_searched_recompute(value: Any) -> None:
    """Refuse a pinned recompute kind the searchers do not enumerate (``RECOMPUTES``)."""
    if value is not None and value not in RECOMPUTES:
        raise SpecError(f"recompute {value!r} is not searched (the searchers pick none, "
                        "selective, op or full; layer is priced by simulate, import and "
                        "export)", field="fix.recompute", value=value, allowed=list(RECOMPUTES))


SEARCHED_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "sequence_parallel", "zero_stage",
                   "micro_batch_size", "schedule", "virtual_stages", "recompute")


def parse_fix(text: str | dict[str, Any] | None) -> dict[str, Any]:
    """Parse ``--fix tp=8,pp=4,rc=full`` into plan fields (aliases as in inline plans).

    Raises:
        SpecError: unknown fields or values a plan would reject.
    """
    if not text:
        return {}
    if isinstance(text, dict):
        raw = {ALIASES.get(k, k): v for k, v in text.items()}
    else:
        raw = {}
        for item in text.replace(" ", ",").split(","):
            if not item.strip():
                continue
            if "=" not in item:
                raise SpecError(f"--fix item {item!r} is not key=value (e.g. tp=8,pp=4)",
                                field="fix", value=text)
            key, val = (x.strip() for x in item.split("=", 1))
            key = ALIASES.get(key, key)
            raw[key] = _coerce_inline(key, val)
    allowed = SEARCHED_FIELDS + CONSTANT_FIELDS
    for key in raw:
        if key not in allowed:
            raise SpecError(f"--fix cannot pin {key!r}; it can pin {', '.join(allowed)} "
                            "(or the short names tp pp dp cp ep etp sp zero mbs vpp rc)",
                            field="fix", value=key, allowed=list(allowed))
    try:
        ParallelPlan(**raw)
    except ValidationError as exc:
        raise from_validation_error(exc, "fix") from None
    return raw
