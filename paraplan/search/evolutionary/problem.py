"""A validated placement problem (pp groups of dp GPUs, bytes per boundary and group) and the
placement result."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from paraplan.search.evolutionary.inputs import Network, PairMatrices
from paraplan.specs.cluster import ClusterSpec
from paraplan.specs.errors import SpecError


@dataclass(frozen=True)
class PlacementResult:
    """A placement and its communication cost per step (DT-FM sec 3).

    ``groups[k][i]`` is the GPU running stage ``k`` (pipeline order) of replica ``i``: row
    ``k`` is stage ``k``'s data-parallel group, column ``i`` is replica ``i``'s pipeline.
    ``cost_s = dp_cost_s + pp_cost_s`` (seconds per step). ``stage_dp_cost_s[k]`` is stage
    ``k``'s ring all-reduce (``dp_cost_s`` is their max) and ``boundary_cost_s[k]`` the
    per-message cost of boundary ``k -> k+1`` (``pp_cost_s = 2 m sum``). ``history`` holds
    ``(best cost, mean cost)`` of the population, seconds, for the initial population and
    after each of the ``generations_run`` generations (empty for non-evolutionary results).
    ``seed`` is the integer seed the search ran with (None for a Generator or no search).
    """

    groups: list[list[int]]
    cost_s: float
    dp_cost_s: float
    pp_cost_s: float
    history: list[tuple[float, float]] = field(default_factory=list)
    generations_run: int = 0
    seed: int | None = None
    stage_dp_cost_s: tuple[float, ...] = ()
    boundary_cost_s: tuple[float, ...] = ()
    evaluations: int = 0
    """Distinct partitions whose cost was computed."""
    search_time_s: float = field(default=0.0, compare=False)
    """Wall-clock seconds of the search (not compared: equal seeds give equal results)."""

    @property
    def pp(self) -> int:
        return len(self.groups)

    @property
    def dp(self) -> int:
        return len(self.groups[0]) if self.groups else 0




@dataclass(frozen=True, eq=False)
class Problem:
    pairs: PairMatrices
    pp: int
    dp: int
    dp_bytes: np.ndarray  # (pp,) bytes
    pp_bytes: float
    m: int
    dp_algorithm: str


def int_at_least(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise SpecError(f"{name}={value!r} must be an integer >= {low}", field=name,
                        value=value, allowed=f"integer >= {low}")
    return int(value)


def _nonneg_bytes(name: str, value: object) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SpecError(f"{name}={value!r} must be a number of bytes >= 0", field=name,
                        value=value, allowed="finite number >= 0") from None
    if not math.isfinite(x) or x < 0:
        raise SpecError(f"{name}={value!r} must be a finite number of bytes >= 0", field=name,
                        value=value, allowed="finite number >= 0")
    return x


def make_problem(network: Network, pp: int, dp: int, dp_bytes: float | Sequence[float],
             pp_bytes: float, num_microbatches: int, num_gpus: int | None,
             dp_algorithm: str) -> Problem:
    pp = int_at_least("pp", pp, 1)
    dp = int_at_least("dp", dp, 1)
    m = int_at_least("num_microbatches", num_microbatches, 1)
    if dp_algorithm not in ("ring", "scatter_gather"):
        raise SpecError(f"dp_algorithm={dp_algorithm!r} is not one of 'ring', 'scatter_gather'",
                        field="dp_algorithm", value=dp_algorithm,
                        allowed=["ring", "scatter_gather"])
    if isinstance(network, ClusterSpec):
        total, name = network.num_gpus, f"cluster {network.name!r}"
    elif isinstance(network, PairMatrices):
        total, name = network.num_gpus, "the pair matrices"
    else:
        raise SpecError(f"network must be a ClusterSpec or PairMatrices, not "
                        f"{type(network).__name__}", field="network")
    used = total if num_gpus is None else int_at_least("num_gpus", num_gpus, 1)
    if used > total:
        raise SpecError(f"num_gpus={used} exceeds the {total} GPUs of {name}",
                        field="num_gpus", value=used, allowed=f"1..{total}")
    if pp * dp != used:
        hint = "" if num_gpus is not None or pp * dp > total else (
            f"; pass num_gpus={pp * dp} to place on GPUs 0..{pp * dp - 1} only")
        raise SpecError(
            f"pp*dp = {pp}*{dp} = {pp * dp} must equal the number of GPUs placed ({used} of "
            f"{name}){hint}", field="pp*dp", value=pp * dp, allowed=used,
        )
    if np.ndim(dp_bytes) == 0:
        per_stage = [_nonneg_bytes("dp_bytes", dp_bytes)] * pp
    else:
        seq = list(dp_bytes)  # type: ignore[arg-type]
        if len(seq) != pp:
            raise SpecError(f"dp_bytes has {len(seq)} entries; it needs one per stage (pp={pp})",
                            field="dp_bytes", value=len(seq), allowed=pp)
        per_stage = [_nonneg_bytes(f"dp_bytes[{k}]", x) for k, x in enumerate(seq)]
    ppb = _nonneg_bytes("pp_bytes", pp_bytes)
    pairs = (PairMatrices.from_cluster(network, used) if isinstance(network, ClusterSpec)
             else network)
    if pairs.num_gpus != used:
        pairs = PairMatrices(pairs.bandwidth_Bps[:used, :used], pairs.latency_s[:used, :used])
    return Problem(pairs, pp, dp, np.array(per_stage, float), ppb, m, dp_algorithm)


def rng_from_seed(seed: int | np.random.Generator | None) -> tuple[np.random.Generator, int | None]:
    if isinstance(seed, np.random.Generator):
        return seed, None
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
        raise SpecError(f"seed={seed!r} must be an integer, a numpy Generator or None",
                        field="seed", value=seed)
    return np.random.default_rng(seed), None if seed is None else int(seed)
