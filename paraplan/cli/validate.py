"""``paraplan validate-published`` (every published run predicted: per row, per source and
overall MAPE) and ``paraplan validate-dtfm`` (the DT-FM scheduling reproduction)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from paraplan.cli.common import Format, FormatOpt, console, emit_json
from paraplan.specs import SpecError
from paraplan.specs.safe_io import MAX_TABLE_BYTES, read_user_text


def validate_dtfm_cmd(
    scenario: Annotated[list[str] | None, typer.Option(
        "--scenario", help="datacenter, spot, multi-university, regional or worldwide "
        "(repeat; default: all five).")] = None,
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1,
                                      help="Seed of the evolutionary searcher.")] = 0,
    fmt: FormatOpt = Format.table,
) -> None:
    """DT-FM reproduction: GPT-3 XL on the five dtfm-* scenarios, topology-aware scheduling vs
    random placement, next to the speedups DT-FM measured.

    Example: paraplan validate-dtfm --scenario worldwide
    """
    from paraplan.validate.dtfm import dtfm_reference, reproduce

    known = [r["scenario"] for r in dtfm_reference()]
    for name in scenario or []:
        if name not in known:
            raise SpecError(f"--scenario {name!r} is not a DT-FM scenario; use one of "
                            f"{', '.join(known)}", field="--scenario", value=name,
                            allowed=known)
    err = Console(stderr=True)
    data = reproduce(scenario or None, seed=seed,
                     progress=(lambda m: err.print(f"[dim]{m}[/]")) if fmt is not Format.json
                     else None)
    if fmt is Format.json:
        emit_json(data)
        return
    table = Table(title="GPT-3 XL (24 layers, seq 2048, batch 1024, fp16), 64 V100: "
                  "scheduled vs random placement", title_justify="left")
    for col in ("scenario", "plan", "scheduled s", "random s", "rank order s", "speedup",
                "DT-FM speedup", "DT-FM scheduled s", "error %"):
        table.add_column(col, justify="left" if col in ("scenario", "plan") else "right")
    for r in data["rows"]:
        if r.get("plan") is None:
            table.add_row(r["scenario"], "no plan fits", *["-"] * 7)
            continue
        table.add_row(r["scenario"], r["plan"], f"{r['scheduled_s']:.2f}",
                      f"{r['random_s']:.2f}", f"{r['rank_order_s']:.2f}",
                      f"{r['speedup_vs_random']:.2f}x", f"{r['dtfm_speedup']:.2f}x",
                      f"{r['dtfm_with_scheduler_s']:.2f}", f"{r['scheduled_error_pct']:+.1f}")
    console().print(table)


def validate_published_cmd(
    csv_path: Annotated[str | None, typer.Argument(
        help="Published-runs CSV (throughput or memory format), or a bundled set: "
             "throughput (default), memory, holdout.")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Predict every published run in CSV and report the error (per row, per source, MAPE).

    Example: paraplan validate-published shared/validation/published_throughput.csv
    """
    from paraplan.specs.loaders import _as_path
    from paraplan.validate.predict import run_memory, run_published
    from paraplan.validate.published import DATA_DIR

    # The bundled throughput and memory sets include paraplan's own MoE additions (path None).
    is_memory = csv_path == "memory"
    if csv_path in ("throughput", "memory"):
        csv_path = None
    elif csv_path == "holdout":
        csv_path = str(DATA_DIR / "holdout" / "holdout_throughput.csv")
    if csv_path is not None:
        path = _as_path(csv_path)
        if path is None or not path.is_file():
            raise SpecError(f"CSV file {csv_path!r} not found", field="CSV", value=csv_path)
        header = read_user_text(path, "CSV", MAX_TABLE_BYTES).split("\n", 1)[0]
        if "memory_scope" in header:
            is_memory = True
        elif "measured_metric" not in header:
            raise SpecError(f"CSV {csv_path!r} is neither the throughput format (needs column "
                            "measured_metric) nor the memory format (memory_scope); see "
                            "shared/validation/README.md", field="CSV", value=csv_path)
    result = run_memory(csv_path) if is_memory else run_published(csv_path)
    if fmt is Format.json:
        emit_json(result)
        return
    _print_validation(console(), result)


def _print_validation(out: Console, result: dict[str, Any]) -> None:
    for key, label in (("by_source", "source"), ("by_trainer", "trainer"), ("by_gpu", "GPU")):
        table = Table(title=f"error vs published runs by {label} (MAPE on step time; memory "
                      "rows on GiB)", title_justify="left")
        for col in (label, "rows", "predicted", "MAPE %", "MAPE % (plan certain)",
                    "too fast", "worst row"):
            table.add_column(col, justify="left" if col == label else "right")
        for name, info in result[key].items():
            worst = info.get("worst_row")
            table.add_row(
                name, str(info.get("n_rows", "")), str(info["n"]),
                "-" if info["mape_pct"] is None else f"{info['mape_pct']:.1f}",
                "-" if info.get("mape_pct_certain") is None
                else f"{info['mape_pct_certain']:.1f}",
                f"{info['n_too_fast']}/{info['n']}",
                "-" if not worst else
                f"#{worst['index']} {worst['model']} {worst['error_pct']:+.1f}%",
            )
        overall = result["mape_pct"]
        table.add_row("[bold]all[/]", str(result["n_rows"]), str(result["n_predicted"]),
                      "-" if overall is None else f"[bold]{overall:.1f}[/]",
                      "-" if result.get("mape_pct_certain") is None
                      else f"{result['mape_pct_certain']:.1f}",
                      f"{result['n_too_fast']}/{result['n_predicted']}",
                      f"coverage {result.get('coverage_pct', 0):.0f}%")
        out.print(table)
    pairs = result.get("pair_order")  # throughput rows only
    if pairs and pairs["pairs"]:
        out.print("plans a source measured in one setting (model, cluster, trainer, training "
                  "but the batch): the model orders " + f"{pairs['agree']} of "
                  f"{pairs['decisive']} pairs measured more than 2% apart as measured ("
                  + ", ".join(f"{src} {info['agree']}/{info['decisive']}"
                              for src, info in pairs["by_source"].items())
                  + f"); median error on a pair's ratio {pairs['median_ratio_error_pct']:.1f}%")
        pick = pairs["pick"]
        out.print(f"in {pick['picked_best']} of the {pick['settings']} settings with two or "
                  "more measured plans the model's fastest is the measured fastest (within 2%); "
                  f"its pick gives up a median {pick['median_regret_pct']:.1f}%, at most "
                  f"{pick['worst']['regret_pct']:.1f}% (row #{pick['worst']['picked']} for "
                  f"#{pick['worst']['best']})")
    skipped = [r for r in result["rows"] if r["status"] != "ok"]
    if skipped:
        out.print(f"{len(skipped)} rows not predicted:")
        for r in skipped[:20]:
            out.print(f"  #{r['index']} {r['source_id']} {r['model']}: {r['status']}: "
                      f"{r['reason']}")


def validate_recipes_cmd(
    source: Annotated[list[str] | None, typer.Option(
        "--source", help="dgxc_nemo_h100, megatron_bridge_moe, megatron_bridge_moe_2608, "
        "megatron_bridge_dense, torchtitan or mosaicml_llmfoundry_mpt (repeat; default: all "
        "six).")] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Search every bundled tuned recipe again (same model, GPUs, batch, sequence, its
    trainer) and report the recipe's rank, the predicted gain of #1 over it and why.

    Example: paraplan validate-recipes --source dgxc_nemo_h100
    """
    from paraplan.validate.recipes import RECIPE_SOURCES, validate_recipes

    for name in source or []:
        if name not in RECIPE_SOURCES:
            raise SpecError(f"--source {name!r} is not a recipe source; use one of "
                            f"{', '.join(RECIPE_SOURCES)}", field="--source", value=name,
                            allowed=list(RECIPE_SOURCES))
    err = Console(stderr=True)
    result = validate_recipes(tuple(source) if source else RECIPE_SOURCES,
                              progress=(lambda d, n: err.print(f"[dim]recipe {d}/{n}[/]"))
                              if fmt is not Format.json else None)
    if fmt is Format.json:
        emit_json(result)
        return
    table = Table(title="tuned recipes vs the search (same model, GPUs, batch, sequence, trainer)",
                  title_justify="left")
    for col in ("#", "model", "recipe", "search's #1", "rank", "gain", "measured",
                "why #1 is faster", "knobs #1 changes"):
        table.add_column(col, justify="right" if col in ("#", "rank", "gain", "measured")
                         else "left", overflow="fold")
    for r in result["rows"]:
        if r["status"] != "ok":
            table.add_row(str(r["index"]), r["model"], r["recipe"], r["status"], "-", "-", "-",
                          r.get("reason", "")[:60], "-")
            continue
        why = ", ".join(f"{w['part'].replace('_comm', '')} {w['recipe_minus_best_s']:+.2f} s"
                        for w in r["why"])
        # A recipe the memory model calls out of memory (it ran) is not among the ranked plans.
        mark = "" if r["recipe_in_space"] else ("!" if not r.get("recipe_fits", True) else "*")
        rank = str(r["rank"]) + mark
        recipe, best = (f"{r['recipe']} ({r['recipe_run']})", f"{r['best']} ({r['best_run']})"
                        ) if "recipe_run" in r else (r["recipe"], r["best"])
        if "recipe_layers_per_stage" in r:  # its guessed layout priced at the DP's split
            recipe += " split=" + "/".join(str(n) for n in r["recipe_layers_per_stage"])
        gain = f"{r['gain']:.3f}" + ("m" if r["tight"] else "")
        twin = r.get("measured_twin")
        measured = "-" if twin is None else (f"{twin['measured_gain']:.3f} #{twin['index']}"
                                             + ("~" if twin["kind"] != "exact" else ""))
        table.add_row(str(r["index"]), r["model"], recipe, best, rank,
                      gain, measured, why or "-", ", ".join(r["changed"]) or "-")
    console().print(table)
    if result["n"]:
        console().print(f"{result['n']} recipes: median predicted gain of #1 "
                        f"{result['median_gain']:.3f}x (max {result['max_gain']:.3f}x); "
                        f"{result['ranked_first']} ranked first, {result['within_5pct']} within "
                        "5% of #1. * = the recipe is outside the searched space; ! = the "
                        "memory model calls the recipe out of memory (it ran), so it is not "
                        "ranked; split= = layers per stage the recipe is priced with where its "
                        "own layout is unknown (the exact layer-partition DP's); m = #1 needs "
                        "more memory than the recipe and is within 10% of the GPU's memory, "
                        "the memory model's error on measured runs: "
                        f"{result['tight_beyond_5pct']} of the claims beyond 5%.")
        twins, pairs = result["measured_twins"], result["pair_order"]
        console().print(
            f"measured = #1's gain implied by its source's own measurement of #1's plan "
            f"(#row, at any GPU count) or of #1's plan with the nearest micro-batch size "
            f"(~): of the {twins['claims']} claims beyond 5%, {twins['checked']} have one "
            f"({twins['exact']} exact); it confirms {twins['confirmed']} beyond 5% and not "
            f"{twins['not_confirmed']}.")
        if pairs["pairs"]:
            console().print(
                f"plans the sources measured in the same setting: the model orders "
                f"{pairs['agree']} of {pairs['decisive']} pairs measured more than 2% apart "
                f"as measured ({pairs['pairs']} pairs; median error on their ratio "
                f"{pairs['median_ratio_error_pct']:.1f}%); its fastest is the measured fastest "
                f"in {pairs['pick']['picked_best']} of {pairs['pick']['settings']} settings "
                f"(at most {pairs['pick']['worst']['regret_pct']:.1f}% given up).")
        if result["changed_beyond_5pct"]:
            console().print("knobs #1 changes where it claims more than 5%: " + ", ".join(
                f"{k} {n}x" for k, n in result["changed_beyond_5pct"].items()))
