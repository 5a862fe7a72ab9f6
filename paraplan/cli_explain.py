"""``paraplan explain`` (registered on ``paraplan.cli.app``)."""

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table


def register(app: typer.Typer, fmt_enum: Any, format_opt: Any, emit_json: Any) -> None:
    """Add ``paraplan explain`` to ``app``."""

    @app.command("explain")
    def explain_cmd(
        model: Annotated[str, typer.Option("--model", "-m", help="Preset, YAML or HF "
                                           "config.json.")],
        cluster: Annotated[str, typer.Option("--cluster", "-c", help="Preset or cluster "
                                             "YAML.")],
        plan: Annotated[str, typer.Option("--plan", "-p", help="Inline tp=8,pp=4,mbs=1,... "
                                          "or a plan file / plan JSON.")],
        global_batch: Annotated[int, typer.Option("--global-batch", "-b",
                                                  help="Sequences per step.")],
        seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Tokens per sequence.")],
        nodes: Annotated[int | None, typer.Option("--nodes", "-n",
                                                  help="Number of nodes.")] = None,
        precision: Annotated[str, typer.Option(help="bf16, fp16, fp8 or fp32.")] = "bf16",
        top: Annotated[int, typer.Option("--top", "-k", min=1, max=50,
                                         help="How many better changes to list.")] = 5,
        fmt: format_opt = fmt_enum.table,
    ) -> None:
        """Explain one plan in plain words (where the step goes and why) and list the one-knob
        changes that make it faster or make it fit, each simulated.

        Example: paraplan explain --model llama3-70b --cluster dgx-h100 --nodes 32
        --plan tp=8,pp=8,mbs=4,sp=1,rc=full --global-batch 1024 --seq-len 8192
        """
        from pydantic import ValidationError

        from paraplan.cli import _read_plan
        from paraplan.explain import explain
        from paraplan.specs import load_cluster, load_model
        from paraplan.specs.errors import from_validation_error
        from paraplan.specs.training import TrainingSpec

        spec_plan = _read_plan(plan)
        spec_model, spec_cluster = load_model(model), load_cluster(cluster, nodes=nodes)
        try:
            training = TrainingSpec(global_batch_size=global_batch, seq_len=seq_len,
                                    precision=precision)
        except ValidationError as exc:
            raise from_validation_error(exc, "training") from None
        data = explain(spec_model, spec_cluster, training, spec_plan, top=top)
        if fmt is fmt_enum.json:
            emit_json(data)
            return
        out = Console()
        out.print(f"[bold]{data['plan']}[/] for {spec_model.name} on {spec_cluster.num_gpus}x "
                  f"{'+'.join(spec_cluster.gpu_types)}")
        for line in data["findings"]:
            out.print(f"  - {line}")
        alts = data["alternatives"]
        if not alts:
            out.print("no single change of micro-batch size, SP, recompute, ZeRO stage, "
                      "virtual stages or tp/pp/dp degrees " + ("is faster" if data["feasible"]
                                                                else "makes it fit"))
            return
        table = Table(title="one-knob changes that help (simulated)", title_justify="left")
        for col, just in (("change", "left"), ("plan", "left"), ("step", "right"),
                          ("speedup", "right"), ("MFU", "right"), ("mem GiB", "right")):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        for a in alts:
            table.add_row(a["change"], a["plan"], f"{a['step_time_s']:.4g} s",
                          "-" if a["speedup"] is None else f"{a['speedup']:.2f}x",
                          f"{100 * a['mfu']:.1f}%", f"{a['memory_peak_gb']:.1f}")
        out.print(table)
