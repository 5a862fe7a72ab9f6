"""The StepReport (the one result type of the simulator), its time and memory keys, and the
infeasible report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from paraplan.simulator.memory import GiB, StageMemory
from paraplan.specs.plan import ParallelPlan

if TYPE_CHECKING:
    import pandas as pd

TIME_KEYS = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble",
             "optimizer", "exposed_comm")
STEP_PARTS = ("compute", "bubble", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm",
              "optimizer")
"""The additive parts of a step (``exposed_comm`` is their communication subtotal), in the
order the reports show them. ``ep_comm`` is the MoE dispatch: its exposed all-to-alls and the
host stall after the dispatcher's sync (``TrainingSpec.moe_host_sync_s``)."""
MEMORY_KEYS = ("weights", "grads", "optimizer", "activations", "other", "peak")


@dataclass(frozen=True)
class StepReport:
    """The one result type: a simulated optimizer step of a plan (the JSON contract)."""

    feasible: bool
    reasons: list[str]
    step_time_s: float | None
    tokens_per_s: float | None
    model_tflops_per_gpu: float | None
    hardware_tflops_per_gpu: float | None
    mfu: float | None
    hfu: float | None
    memory_gb: dict[str, float]
    """Worst rank's memory by kind, GiB (2^30 bytes, as nvidia-smi/PyTorch report)."""
    memory_per_stage_gb: list[float]
    time_s: dict[str, float]
    plan: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    """Derived quantities: dp, micro-batches, layers per stage, memory capacity, headroom."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("extra"))
        return out

    def to_frame(self) -> pd.DataFrame:
        """Time and memory breakdown as a tidy pandas DataFrame.

        Columns ``category`` ("time" or "memory"), ``part`` (a key of ``time_s`` or
        ``memory_gb``, in their order), ``value`` and ``unit`` ("s" for time, "GiB" for the
        worst rank's memory, 2^30 bytes). Time parts are those of the critical stage; an
        infeasible report has zero times. pandas is imported here, not with the simulator.
        """
        import pandas as pd

        rows = [("time", part, float(value), "s") for part, value in self.time_s.items()]
        rows += [("memory", part, float(value), "GiB") for part, value in self.memory_gb.items()]
        return pd.DataFrame(rows, columns=["category", "part", "value", "unit"])


def gib(mem: StageMemory) -> dict[str, float]:
    """A stage's memory by kind in GiB (without the peak)."""
    return {"weights": mem.weights / GiB, "grads": mem.grads / GiB,
            "optimizer": mem.optimizer / GiB, "activations": mem.activations / GiB,
            "other": mem.other / GiB}


def infeasible(plan: ParallelPlan, reasons: list[str], extra: dict[str, Any] | None = None,
               memory: dict[str, float] | None = None,
               per_stage: list[float] | None = None) -> StepReport:
    return StepReport(False, reasons, None, None, None, None, None, None,
                      memory or dict.fromkeys(MEMORY_KEYS, 0.0), per_stage or [],
                      dict.fromkeys(TIME_KEYS, 0.0), plan.model_dump(),
                      {"plan_short": plan.short(), **(extra or {})})
