"""The executor's commands: ``paraplan run``, ``paraplan calibrate`` and ``paraplan
validate-executor`` (torch is imported only when one of them runs)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from paraplan.cli.common import Format, FormatOpt, RunFailed, emit_json
from paraplan.cli.inputs import read_plan
from paraplan.specs import SpecError, load_cluster, load_model


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SpecError("this command runs the executor, which needs torch: pip install "
                        "'paraplan[executor]' (CPU: pip install torch first)",
                        field="torch") from None


def _progress(enabled: bool):
    err = Console(stderr=True)
    return (lambda msg: err.print(f"[dim]{msg}[/]")) if enabled else (lambda _msg: None)


def _plan_dict(text: str) -> dict[str, Any]:
    """A plan from inline text, a plan JSON/YAML file, a plan JSON, a ``simulate`` StepReport
    JSON or a ``best`` result (its best plan), as the executor's plan dict."""
    plan = read_plan(text, field="PLAN")
    return plan.model_dump(exclude_none=True, exclude_defaults=True)


OversubscribeOpt = Annotated[bool, typer.Option(
    "--oversubscribe", help="Run more CPU ranks than this machine has cores (timings then "
    "measure contention, not the plan).")]


def _check_cores(nproc: int, oversubscribe: bool) -> None:
    """Refuse more gloo ranks than CPU cores unless the user says so (before any work)."""
    import torch

    if oversubscribe or torch.cuda.is_available():
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    if nproc > cores:
        raise SpecError(f"--nproc={nproc} is more ranks than this machine's {cores} CPU cores "
                        "(each CPU rank needs one); lower it or pass --oversubscribe",
                        field="--nproc", value=nproc, allowed=f"<= {cores}")


@contextlib.contextmanager
def _run_failures() -> Iterator[None]:
    """An executor failure (a rank crashed or hung) is a failed run: exit code 3."""
    from paraplan.executor.launch import ExecutorError

    try:
        yield
    except ExecutorError as exc:
        raise RunFailed(f"the run failed: {exc}") from None


def _check_memory(spec: Any, training: Any, plan: Any, nproc: int, layers: list[int]) -> None:
    """Refuse a run whose ranks together need more than this machine's memory (the
    simulator's per-rank peak, which the executor's CPU runs match within a few percent),
    before any rank starts: an out-of-memory kill mid-run helps nobody."""
    from paraplan.simulator.memory import pipeline_memory
    from paraplan.simulator.pipeline import inflight_microbatches

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    dp = plan.dp or 1
    m = max(1, training.global_batch_size // (dp * plan.micro_batch_size))
    inflight = [inflight_microbatches(plan.schedule, plan.pp, m, r) for r in range(plan.pp)]
    peak = max(s.peak for s in pipeline_memory(spec, training, plan, dp=dp, layers=layers,
                                               inflight=inflight))
    need = peak * nproc
    if need > 0.8 * total:
        raise SpecError(f"the run needs about {need / 2**30:.1f} GiB ({nproc} ranks x "
                        f"{peak / 2**30:.1f} GiB), over 80% of this machine's "
                        f"{total / 2**30:.1f} GiB; use a smaller --model, --seq-len or "
                        "--global-batch", field="PLAN", value=plan.short())


def _check_profile_name(name: str) -> None:
    if not (1 <= len(name) <= 128) or not name.isprintable():
        raise SpecError(f"--name={name[:60]!r} must be 1-128 printable characters",
                        field="--name", value=name[:60])


def _exec_model(model: str | None, seq_len: int) -> dict[str, Any]:
    from paraplan.executor.bridge import config_from_model_spec
    from paraplan.validate.executor import DENSE_MODEL

    if model is None:
        return dict(DENSE_MODEL, seq_len=seq_len)
    return config_from_model_spec(load_model(model), seq_len).to_dict()


def run_cmd(
    plan: Annotated[str, typer.Argument(
        help="Plan: inline (tp=2,pp=1,mbs=2), a plan JSON/YAML, a simulate report or a "
             "best --export json file.")],
    nproc: Annotated[int, typer.Option("--nproc", help="Ranks (local processes).",
                                       min=1, max=64)] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps to run.",
                                       min=1, max=10_000)] = 3,
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="A GPT-2-style model (preset, YAML or HF config.json); "
                              "default: the executor's 4-layer validation GPT.")] = None,
    global_batch: Annotated[int, typer.Option("--global-batch", min=1)] = 8,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, max=1_000_000)] = 256,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", "-c", help="Also predict the run on this cluster profile (e.g. the "
                                "YAML paraplan calibrate wrote).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds before the run is "
                                                             "ended.", min=1)] = 600,
    oversubscribe: OversubscribeOpt = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Train the executor's GPT with PLAN on NPROC real torch.distributed ranks (gloo on
    CPU, nccl with a GPU per rank) and report step time, phases, bytes per collective
    and peak memory, next to the simulator's exact byte count (and, with --cluster, its
    predicted step time).

    Example: paraplan run tp=2,mbs=4 --nproc 2 --steps 3
    """
    _need_torch()
    from paraplan.executor.bridge import model_spec, simulator_plan, training_spec
    from paraplan.executor.grid import grid_shape_error
    from paraplan.executor.launch import ExecutorError, launch
    from paraplan.executor.model import TinyGPTConfig
    from paraplan.executor.pipeline_parallel import stage_layers
    from paraplan.executor.train import check_plan, parse_plan, train_worker
    from paraplan.simulator.step import simulate
    from paraplan.simulator.volumes import comm_bytes, unsupported
    from paraplan.validate.executor import bytes_exact, measured_step_s, step_times

    raw = _plan_dict(plan)
    config = {"model": _exec_model(model, seq_len), "plan": raw,
              "global_batch_size": global_batch, "steps": steps}
    try:
        cfg = TinyGPTConfig(**config["model"])
        exec_plan = parse_plan(raw, nproc)
        error = grid_shape_error(exec_plan.dp, exec_plan.pp, exec_plan.tp, exec_plan.ep,
                                 nproc)
        if error:
            raise ValueError(f"{error} (--nproc {nproc})")
        check_plan(cfg, exec_plan, global_batch)
        stage_layers(cfg.num_layers, exec_plan.pp, exec_plan.layers_per_stage)
    except ValueError as exc:
        raise SpecError(f"plan cannot run on the executor: {exc}", field="PLAN",
                        value=plan) from None
    spec, training = model_spec(cfg), training_spec(config)
    sim_plan = simulator_plan(config, nproc)
    spec_cluster = load_cluster(cluster) if cluster else None  # before the run, not after
    _check_cores(nproc, oversubscribe)
    _check_memory(spec, training, sim_plan, nproc,
                  [len(r) for r in stage_layers(cfg.num_layers, exec_plan.pp,
                                                exec_plan.layers_per_stage)])
    say = _progress(fmt != Format.json)
    say(f"running {sim_plan.short()} on {nproc} ranks, {steps} step(s)")
    try:
        results = launch(train_worker, nproc, config, timeout_s=timeout, num_threads=1)
    except ExecutorError as exc:
        raise RunFailed(f"the run failed: {exc}") from None
    per_step, measured = step_times(results), measured_step_s(results, warmup=1)
    can_count = not unsupported(sim_plan)
    out: dict[str, Any] = {
        "plan": sim_plan.model_dump(exclude_none=True), "plan_short": sim_plan.short(),
        "nproc": nproc, "steps": steps, "model": config["model"],
        "global_batch_size": global_batch, "loss": results[0]["loss"],
        "step_times_s": per_step, "measured_step_s": measured,
        "ranks": [{k: r[k] for k in ("rank", "coords", "phase_s", "bytes_by_kind",
                                     "calls_by_kind", "peak_memory_bytes",
                                     "num_params_local")} for r in results],
    }
    if can_count:
        out["bytes_predicted_per_rank"] = [comm_bytes(spec, training, sim_plan, nproc, r)
                                           for r in range(nproc)]
        out["bytes_exact"] = bytes_exact(results, out["bytes_predicted_per_rank"], steps)
    if cluster:
        report = simulate(spec, spec_cluster, training, sim_plan,
                          time_if_oom=True)
        out["predicted_step_s"] = report.step_time_s
        out["predicted_time_s"] = report.time_s
        if report.step_time_s:
            out["error_pct"] = 100 * (report.step_time_s - measured) / measured
    if fmt == Format.json:
        emit_json(out)
        return
    _print_run(out)


def calibrate_cmd(
    out: Annotated[str, typer.Option("--out", "-o", help="Cluster profile YAML to write "
                                                         "(atomically).")
                   ] = "this-machine.yaml",
    quick: Annotated[bool, typer.Option("--quick", help="Fewer sizes and repeats "
                                                        "(about 10 s).")] = False,
    nproc: Annotated[int, typer.Option("--nproc", help="Ranks measured at once (as the "
                                                       "executor runs).", min=1,
                                       max=64)] = 2,
    threads: Annotated[int, typer.Option("--threads", help="Torch threads per rank.",
                                         min=1, max=256)] = 1,
    name: Annotated[str, typer.Option("--name", help="Profile name.")] = "this-machine",
    oversubscribe: OversubscribeOpt = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Measure this machine (GEMM grid, memory bandwidth, fused attention, eager
    elementwise kernels, gloo all-reduce / all-gather / all-to-all / p2p) and write a
    cluster profile YAML that simulate, best and validate-executor accept.

    Example: paraplan calibrate --quick --out this-machine.yaml
    """
    _need_torch()
    from paraplan.executor.calibrate import calibrate, calibration_cluster_yaml
    from paraplan.export.files import check_target, write_atomic

    if not out.endswith((".yaml", ".yml")):
        raise SpecError(f"--out={out!r} must end in .yaml or .yml", field="--out",
                        value=out)
    check_target(out, "--out")  # every option is checked before measuring starts
    _check_profile_name(name)
    _check_cores(nproc, oversubscribe)
    with _run_failures():
        meas = calibrate(quick=quick, nproc=nproc, threads=threads,
                         progress=_progress(fmt != Format.json))
    path = write_atomic(out, calibration_cluster_yaml(meas, name=name))
    load_cluster(str(path))  # what was written loads back
    if fmt == Format.json:
        emit_json({"profile": str(path), "measurements": meas})
        return
    _print_calibration(meas, str(path))


def validate_executor_cmd(
    quick: Annotated[bool, typer.Option("--quick", help="Quick calibration and 5 "
                                                        "measured steps per run.")] = False,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", "-c", help="Predict with this profile instead of calibrating "
                                "first.")] = None,
    nproc: Annotated[int, typer.Option("--nproc", help="Ranks: 2 (7 runs) or 4 (9 "
                                                       "runs).")] = 2,
    steps: Annotated[int | None, typer.Option("--steps", help="Measured steps per run "
                                                              "(after one warm-up).",
                                              min=1, max=1000)] = None,
    save_profile: Annotated[str | None, typer.Option(
        "--save-profile", help="Also write the calibrated profile here.")] = None,
    oversubscribe: OversubscribeOpt = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Run the executor with several DP/TP/PP/EP plans on this machine and compare each
    measured step time and every collective's bytes with the simulator's prediction on
    a calibrated profile: per-run error, MAPE and Spearman rank correlation.

    Example: paraplan validate-executor --quick
    """
    _need_torch()
    from paraplan.executor.calibrate import calibrate, calibration_cluster_yaml
    from paraplan.export.files import check_target, write_atomic
    from paraplan.validate.executor import validate_executor

    if nproc not in (2, 4):
        raise SpecError(f"--nproc={nproc} is not supported; use 2 or 4", field="--nproc",
                        value=nproc, allowed=[2, 4])
    if save_profile is not None:
        check_target(save_profile, "--save-profile")
    spec = load_cluster(cluster) if cluster is not None else None
    _check_cores(nproc, oversubscribe)
    say = _progress(fmt != Format.json)
    if spec is None:
        say("calibrating this machine" + (" (quick)" if quick else ""))
        with _run_failures():
            text = calibration_cluster_yaml(calibrate(quick=quick, nproc=nproc,
                                                      progress=say))
        if save_profile:
            write_atomic(save_profile, text, field="--save-profile")
        with tempfile.TemporaryDirectory() as tmp:
            profile = Path(tmp) / "this-machine.yaml"
            profile.write_text(text, encoding="utf-8")
            spec = load_cluster(str(profile))
    with _run_failures():
        result = validate_executor(spec, nproc=nproc, steps=steps or (5 if quick else 8),
                                   progress=say)
    if fmt == Format.json:
        emit_json(result)
        return
    _print_validation(result)


def _print_run(out: dict[str, Any]) -> None:
    con = Console(soft_wrap=False, width=max(100, Console().width))
    con.print(f"[bold]{out['plan_short']}[/] on {out['nproc']} ranks: median step "
              f"{out['measured_step_s']:.3f} s over {out['steps']} steps (first is warm-up); "
              f"loss {out['loss'][0]:.4f} -> {out['loss'][-1]:.4f}")
    if "predicted_step_s" in out and out["predicted_step_s"]:
        con.print(f"predicted {out['predicted_step_s']:.3f} s ({out['error_pct']:+.1f}%)")
    table = Table(title="per rank", title_justify="left")
    for col in ("rank", "pp/dp/tp", "forward s", "backward s", "dp sync s", "p2p s",
                "peak MiB", "bytes (measured = predicted?)"):
        table.add_column(col, justify="right")
    preds = out.get("bytes_predicted_per_rank")
    for i, r in enumerate(out["ranks"]):
        c = r["coords"]
        moved = {k: v for k, v in r["bytes_by_kind"].items() if v}
        same = "" if preds is None else (" =" if all(
            moved.get(k, 0) == v * out["steps"] for k, v in preds[i].items()) else " !=")
        table.add_row(str(r["rank"]), f"{c['pp']}/{c['dp']}/{c['tp']}",
                      f"{r['phase_s']['forward']:.3f}", f"{r['phase_s']['backward']:.3f}",
                      f"{r['phase_s']['dp_grad_sync']:.3f}",
                      f"{r['phase_s']['pipeline_p2p']:.3f}",
                      f"{r['peak_memory_bytes'] / 2**20:.0f}",
                      ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in moved.items()) + same)
    con.print(table)


def _print_calibration(meas: dict[str, Any], path: str) -> None:
    con = Console(soft_wrap=False, width=max(100, Console().width))
    best = max(c["tflops"] for c in meas["gemm"]["cells"])
    con.print(f"wrote [bold]{path}[/] ({meas['machine']['cpu']}, {meas['nproc']} ranks x "
              f"{meas['threads_per_rank']} thread(s), {meas['elapsed_s']:.1f} s)")
    con.print(f"GEMM fp32 up to {best * 1e3:.1f} GFLOP/s per rank; copy bandwidth "
              f"{meas['memory']['bandwidth_Bps'] / 1e9:.1f} GB/s per rank")
    for a in meas.get("attention", []):
        con.print(f"attention b={a['b']} a={a['heads']} s={a['s']} d={a['d']}: forward "
                  f"{a['forward_tflops'] * 1e3:.1f}, backward {a['backward_tflops'] * 1e3:.1f}"
                  " GFLOP/s")
    for kind, fit in meas["collectives"]["fits"].items():
        con.print(f"{kind}: latency {fit['alpha_s'] * 1e6:.0f} us, bandwidth "
                  f"{fit['bandwidth_Bps'] / 1e9:.2f} GB/s (fit rel. rms {fit['rel_rms']:.2f})")


def _print_validation(result: dict[str, Any]) -> None:
    con = Console(soft_wrap=False, width=max(100, Console().width))
    table = Table(title=f"executor runs vs simulator ({result['nproc']} ranks, median of "
                        f"{result['steps']} steps)", title_justify="left")
    for col in ("run", "plan", "measured s", "predicted s", "error %", "bytes exact"):
        table.add_column(col, justify="left" if col in ("run", "plan") else "right")
    for r in result["runs"]:
        table.add_row(r["name"], r["plan"], f"{r['measured_step_s']:.3f}",
                      "-" if r["predicted_step_s"] is None else f"{r['predicted_step_s']:.3f}",
                      "-" if r["error_pct"] is None else f"{r['error_pct']:+.1f}",
                      "yes" if r["bytes_exact"] else "NO")
    con.print(table)
    mape, rho = result["mape_pct"], result["spearman"]
    con.print(f"MAPE {'-' if mape is None else f'{mape:.1f}%'}, Spearman "
              f"{'-' if rho is None else f'{rho:.2f}'}, bytes exact on every rank of every "
              f"run: {'yes' if result['bytes_exact'] else 'NO'}")
