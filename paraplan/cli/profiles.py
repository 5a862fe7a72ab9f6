"""``paraplan profiles`` (the built-in GPUs, links, clusters and models) and ``paraplan
describe`` (a model's shape and parameters, a cluster's GPUs, links and regions)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from paraplan.cli.common import Format, FormatOpt, console, emit_json, wrote
from paraplan.cli.inputs import check_output_paths
from paraplan.specs import SpecError, list_profiles, load_cluster, load_gpu, load_link, load_model
from paraplan.specs.cluster import power_limit_label


def profiles(fmt: FormatOpt = Format.table) -> None:
    """List the built-in GPUs, links, clusters and models (names you can type).

    Example: paraplan profiles --format json
    """
    names = {kind: list_profiles(kind)
             for kind in ("gpus", "links", "clusters", "models", "trainers")}
    if fmt is Format.json:
        details = {
            "gpus": {n: _gpu_row(n) for n in names["gpus"]},
            "links": {n: _link_row(n) for n in names["links"]},
        }
        emit_json({**names, "details": details})
        return
    out = console()
    gpus = Table(title="GPUs", title_justify="left")
    for col in ("name", "bf16/fp16 TFLOP/s", "memory GiB", "mem BW GB/s", "matmul eff.",
                "part spread"):
        gpus.add_column(col, justify="left" if col == "name" else "right")
    for n in names["gpus"]:
        row = _gpu_row(n)
        gpus.add_row(n, f"{row['peak_16bit_tflops']:g}", f"{row['memory_GiB']:g}",
                     f"{row['memory_bandwidth_GBps']:g}", f"{row['matmul_efficiency']:.2f}",
                     f"{100 * row['unit_speed_spread']:.2f}%")
    out.print(gpus)
    links = Table(title="Links (bandwidth one direction)", title_justify="left")
    for col in ("name", "kind", "GB/s", "latency us", "efficiency"):
        links.add_column(col, justify="left" if col in ("name", "kind") else "right")
    for n in names["links"]:
        row = _link_row(n)
        links.add_row(n, row["kind"], f"{row['bandwidth_GBps']:g}", f"{row['latency_us']:g}",
                      f"{row['efficiency']:.2f}")
    out.print(links)
    out.print("[bold]Clusters[/] (use --nodes N for the node count): "
              + ", ".join(names["clusters"]))
    out.print("[bold]Models[/] (or a Hugging Face config.json / YAML path): "
              + ", ".join(names["models"]))
    out.print("[bold]Trainers[/] (--trainer; or a trainer profile YAML path): "
              + ", ".join(names["trainers"]))


def _gpu_row(name: str) -> dict[str, Any]:
    gpu = load_gpu(name)
    peak16 = max(gpu.peak_tflops.get("bf16", 0.0), gpu.peak_tflops.get("fp16", 0.0))
    return {
        "display_name": gpu.display_name,
        "peak_16bit_tflops": peak16,
        "peak_tflops": dict(gpu.peak_tflops),
        "memory_GiB": gpu.memory_GiB,
        "memory_bandwidth_GBps": gpu.memory_bandwidth_GBps,
        "matmul_efficiency": gpu.matmul_efficiency,
        "unit_speed_spread": gpu.unit_speed_spread,
    }


def _link_row(name: str) -> dict[str, Any]:
    link = load_link(name)
    return {
        "kind": link.kind,
        "bandwidth_GBps": link.bandwidth_GBps,
        "latency_us": link.latency_us,
        "efficiency": link.efficiency,
    }


def describe(
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Preset name, paraplan YAML or HF config.json."),
    ] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Preset name or cluster YAML.")
    ] = None,
    nodes: Annotated[
        int | None, typer.Option("--nodes", "-n", help="Number of nodes (one node type).")
    ] = None,
    plot: Annotated[str | None, typer.Option(
        "--plot", help="Draw the cluster topology to this PNG/SVG/PDF (needs --cluster).")
    ] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Show a model's shape and parameter counts, or a cluster's GPUs, peak and links.

    Examples: paraplan describe --model mixtral-8x7b;
    paraplan describe --cluster dgx-h100 --nodes 32 --format json
    """
    if model is None and cluster is None:
        raise SpecError("describe needs --model or --cluster (or both)", field="--model",
                        allowed="--model NAME|PATH, --cluster NAME|PATH")
    if nodes is not None and cluster is None:
        raise SpecError("--nodes needs --cluster", field="--nodes", value=nodes)
    if plot is not None and cluster is None:
        raise SpecError("--plot draws a cluster's topology and needs --cluster", field="--plot",
                        value=plot)
    check_output_paths(plot=plot)
    result: dict[str, Any] = {}
    if model is not None:
        result["model"] = load_model(model).describe()
    if cluster is not None:
        result["cluster"] = _describe_cluster(cluster, nodes)
    if plot is not None and cluster is not None:
        from paraplan.viz.timeline import save_figure
        from paraplan.viz.topology import topology_figure

        save_figure(topology_figure(load_cluster(cluster, nodes=nodes)), plot, field="--plot")
        wrote(plot, fmt)
    if fmt is Format.json:
        emit_json(result["model"] if len(result) == 1 and "model" in result
                  else result["cluster"] if len(result) == 1 else result)
        return
    out = console()
    if "model" in result:
        _print_model(out, result["model"])
    if "cluster" in result:
        _print_cluster(out, result["cluster"])


def _describe_cluster(ref: str, nodes: int | None) -> dict[str, Any]:
    spec = load_cluster(ref, nodes=nodes)
    info = spec.describe()
    gpu = spec.gpu
    info["gpu"] = gpu.name if spec.is_homogeneous else None
    info["peak_flops_per_gpu"] = {k: v * 1e12 for k, v in gpu.peak_tflops.items()} \
        if len(spec.gpu_types) == 1 else None
    info["memory_GiB_per_gpu"] = gpu.memory_GiB if len(spec.gpu_types) == 1 else None
    links: dict[str, Any] = {}
    for group in spec.node_groups:
        for link in (group.intra_node_link, group.inter_node_link):
            if link is not None:
                links[link.name] = link.model_dump(exclude={"sources", "notes"})
    if spec.intra_region_link is not None:
        links[spec.intra_region_link.name] = spec.intra_region_link.model_dump(
            exclude={"sources", "notes"})
    info["links"] = list(links.values())
    return info


def _print_model(out: Console, info: dict[str, Any]) -> None:
    shape = info["shape"]
    table = Table(title=f"model {info['name']}", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", justify="right")
    table.add_row("parameters", f"{info['num_params']:,} ({info['num_params_b']:.2f} B)")
    if info["num_active_params"] != info["num_params"]:
        table.add_row("active parameters", f"{info['num_active_params']:,} "
                      f"({info['num_active_params_b']:.2f} B)")
        no_emb = info["num_active_params_excl_embedding"]
        table.add_row("active without input embedding", f"{no_emb:,} ({no_emb / 1e9:.2f} B)")
    if info.get("mtp_params"):
        table.add_row("multi-token prediction (apart)",
                      f"{info['mtp_params']:,} ({info['mtp_params'] / 1e9:.2f} B)")
    for key, value in shape.items():
        if key not in ("name", "display_name"):
            table.add_row(key, str(value))
    out.print(table)


def _print_cluster(out: Console, info: dict[str, Any]) -> None:
    out.print(f"[bold]cluster {info['name']}[/]: {info['num_gpus']} GPUs on {info['num_nodes']} "
              f"nodes, {info['total_peak_16bit_pflops']:g} PFLOP/s 16-bit peak, "
              f"{info['total_memory_GiB']:g} GiB GPU memory")
    if info.get("description"):
        out.print(info["description"])
    table = Table(title="node groups", title_justify="left")
    for col in ("name", "region", "GPU", "GPUs/node", "nodes", "intra link (GB/s)",
                "NIC", "NICs", "NIC GB/s per GPU"):
        table.add_column(col)
    for g in info["node_groups"]:
        intra = f"{g['intra_node_link']} ({g['intra_node_bandwidth_GBps']:g})" \
            if g["intra_node_link"] else "-"
        peers = g.get("peer_bandwidth_GBps")
        if peers:  # a switchless node: its direct links per pair (and the host path)
            links = sorted({v for row in peers for v in row if v > 0})
            intra += f", mesh {'/'.join(f'{v:g}' for v in links)} per pair"
            if g.get("host_link"):
                intra += f", else {g['host_link']}"
        gpu = g["gpu"]
        if g.get("power_limit_W") is not None:  # compute scaled by the GPU's power curve
            label = power_limit_label(g["power_limit_W"])
            if label not in gpu:  # a capped node group's GPU carries it in its name
                gpu += f" {label}"
            gpu += f" x{g['compute_at_power_limit']:.3g}"
        table.add_row(str(g["name"] or "-"), g["region"], gpu, str(g["gpus_per_node"]),
                      str(g["num_nodes"]), intra, g["inter_node_link"], str(g["nics_per_node"]),
                      f"{g['nic_bandwidth_per_gpu_GBps']:g}")
    out.print(table)
    if info["region_links"]:
        out.print(f"{len(info['region_links'])} WAN region links "
                  f"(latency {min(r['latency_ms'] for r in info['region_links']):g}-"
                  f"{max(r['latency_ms'] for r in info['region_links']):g} ms, bandwidth "
                  f"{min(r['bandwidth_Gbps'] for r in info['region_links']):g}-"
                  f"{max(r['bandwidth_Gbps'] for r in info['region_links']):g} Gb/s)")
