"""Plans to trainers: Megatron-LM flags, torchtitan TOML, DeepSpeed JSON, nanotron YAML and the
paraplan plan JSON, each pinned to a trainer version and checking that trainer's rules before
anything is written (``ExportError`` names the field, its value and what the trainer allows).

    from paraplan.export import export_context, export_text
    ctx = export_context(model, training, plan, cluster=cluster)
    print(export_text("megatron", ctx))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paraplan.export import deepspeed, megatron, nanotron, torchtitan
from paraplan.export.common import ExportContext, ExportError, export_context
from paraplan.export.plan_json import (
    PLAN_FORMAT,
    is_plan_document,
    plan_document,
    read_plan_document,
)


@dataclass(frozen=True)
class Exporter:
    """One output format: its writer, file suffix and the trainer version it is pinned to."""

    name: str
    trainer: str
    version: str
    suffix: str
    write: Callable[[ExportContext, list[str]], str]


EXPORTERS: dict[str, Exporter] = {
    "megatron": Exporter("megatron", megatron.TRAINER, megatron.VERSION, ".sh",
                         megatron.megatron_script),
    "torchtitan": Exporter("torchtitan", torchtitan.TRAINER, torchtitan.VERSION, ".toml",
                           torchtitan.torchtitan_toml),
    "deepspeed": Exporter("deepspeed", deepspeed.TRAINER, deepspeed.VERSION, ".json",
                          deepspeed.deepspeed_json),
    "nanotron": Exporter("nanotron", nanotron.TRAINER, nanotron.VERSION, ".yaml",
                         nanotron.nanotron_yaml),
}
FORMATS = (*EXPORTERS, "json")


def header(ctx: ExportContext, trainer: str, report: dict[str, Any] | None = None) -> list[str]:
    """Provenance lines for the top of an exported file."""
    from paraplan.version import __version__

    where = ctx.cluster_name or "a cluster"
    lines = [f"{trainer} settings written by paraplan {__version__}",
             f"model {ctx.model.name} on {where} ({ctx.world_size} GPUs), global batch "
             f"{ctx.training.global_batch_size} x {ctx.training.seq_len} tokens, "
             f"{ctx.training.precision}",
             f"plan {ctx.plan.short()}; {ctx.num_microbatches} micro-batches per step; layers "
             f"per pipeline rank {ctx.rank_layers}"]
    if report is not None and report.get("step_time_s"):
        lines.append(f"predicted {report['step_time_s']:.4g} s per step, MFU "
                     f"{100 * (report.get('mfu') or 0):.1f}%")
    return lines


def export_text(fmt: str, ctx: ExportContext, *, report: dict[str, Any] | None = None,
                search: dict[str, Any] | None = None) -> str:
    """The file text of ``ctx`` in format ``fmt`` (one of ``FORMATS``).

    Raises:
        ExportError: unknown format, or the plan cannot be written for that trainer.
    """
    from paraplan.specs.safe_io import dumps_json

    if fmt == "json":
        return dumps_json(plan_document(ctx, report=report, search=search), indent=2) + "\n"
    exporter = EXPORTERS.get(fmt)
    if exporter is None:
        raise ExportError(f"unknown export format {fmt!r}", field="--to", value=fmt,
                          allowed=list(FORMATS))
    return exporter.write(ctx, header(ctx, f"{exporter.trainer} ({exporter.version})", report))


__all__ = ["EXPORTERS", "FORMATS", "PLAN_FORMAT", "ExportContext", "ExportError", "Exporter",
           "export_context", "export_text", "header", "is_plan_document", "plan_document",
           "read_plan_document"]
