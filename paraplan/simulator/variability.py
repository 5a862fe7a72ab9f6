"""The pace of a synchronous step over many GPUs of one type: the slowest part sets it.

Parts of one SKU do not compute at one speed. Under the same power limit, manufacturing
variation and each chip's power management settle them at different clocks, and a job that
synchronises every step (gradient collectives, tensor- and pipeline-parallel exchanges) waits
for its slowest member at each synchronisation: a persistent spread makes the same slow part
gate every step. Single-GPU benchmarks, which the profiles' efficiencies come from, measure a
typical (median) part.

Model: per-part compute time (the measured quantity: kernel and iteration times) normal around
the median part's, relative standard deviation ``spread`` (``GPUSpec.unit_speed_spread``, from
fleet measurements cited in each profile); the expected slowest of ``n`` independent parts
takes ``spread x E[max of n standard normals]`` longer (order statistics: E[max] = integral of
x n phi(x) Phi(x)^(n-1) dx; 0.5642 for n = 2, 1.4236 for n = 8, Harter 1961's tables). The
normal body is measured on a few hundred parts; its tail at 10^4 parts (E[max] near 4) is an
extrapolation. ``n`` is the job's world size; a mixed job prices each type as if all n parts
were of it (a small over-count: E[max] of 8 is 1.42, of 24 1.95), which keeps a layout's
price independent of how many stages each type takes (the ILP's costs are linear). Pure
functions; dimensionless factors.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

# Integration grid for E[max]: the integrand is negligible beyond |x| = 10 for any n up to
# 10^9 GPUs (the largest of 10^9 normals sits near 6) and at both ends, so a plain sum of
# 0.001 steps is the trapezoid rule, exact to ~1e-7.
_DX = 0.001


@lru_cache(maxsize=1)
def _grid() -> tuple[np.ndarray, np.ndarray]:
    """(x phi(x), Phi(x)) on the integration grid, read-only, built on first use (not at
    import: every command imports the simulator)."""
    x = np.arange(-10_000, 10_001) * _DX
    x_phi = x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    for grid in (x_phi, cdf):
        grid.setflags(write=False)
    return x_phi, cdf


@lru_cache(maxsize=4096)
def expected_max_standard_normal(n: int) -> float:
    """Expected largest of ``n`` independent standard normal draws, by numerical integration
    of ``x n phi(x) Phi(x)^(n-1)``; 0 for n <= 1."""
    if n <= 1:
        return 0.0
    x_phi, cdf = _grid()
    return float(np.sum(x_phi * np.power(cdf, n - 1)) * n * _DX)


def slowest_part_pace(spread: float, n: int) -> float:
    """Compute throughput of the slowest of ``n`` parts relative to the median part's
    (<= 1): ``1 / (1 + spread * E[max of n standard normals])``, its compute time being
    ``1 + spread * E[max]`` times the median's. ``spread``: the relative
    standard deviation of the parts' compute speed (0 = identical parts, 1.0 returned)."""
    if spread <= 0 or n <= 1:
        return 1.0
    return 1.0 / (1.0 + spread * expected_max_standard_normal(int(n)))
