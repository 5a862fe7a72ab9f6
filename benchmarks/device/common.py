"""What the H200 measurement scripts share: a power-limit warm-up and the section runner that
writes the JSON after every section (so a failure or a time-out keeps what ran)."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable

import torch


def heat(seconds: float) -> None:
    """8192^3 bf16 GEMMs back to back for ``seconds``: the GPU settles at the clock its power
    limit sustains."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()


def run_sections(out_path: str, res: dict, sections: list[tuple[str, Callable[[], object]]]
                 ) -> None:
    """Run each (name, fn), store its result (or its traceback) under ``res[name]`` with the
    seconds it took, and rewrite ``out_path`` after each."""
    for name, fn in sections:
        t0 = time.perf_counter()
        try:
            res[name] = fn()
        except Exception:  # noqa: BLE001
            res[name] = {"error": traceback.format_exc()[-2000:]}
        res.setdefault("elapsed_s", {})[name] = time.perf_counter() - t0
        print(name, "done in", round(time.perf_counter() - t0, 1), "s", flush=True)
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
