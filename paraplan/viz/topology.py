"""Cluster topology figure: nodes grouped by region, the intra-node link tier, NIC links into
each region's fabric and WAN links between regions, labelled with bandwidth and latency.

:func:`topology_graph` summarises a ClusterSpec as a small networkx graph (one vertex per
region fabric and per node box; a node group with many nodes becomes one box "x N nodes", so
a 4,096-node cluster draws as quickly and as legibly as a 2-node one); :func:`topology_figure`
draws it. With more than three regions the WAN links are also shown as a region x region
matrix of bandwidth and latency (labels on 28 crossing lines would not be readable).

Bandwidths are one direction: networks in Gb/s, scale-up links (NVLink, xGMI, PCIe) in GB/s.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

from paraplan.specs.cluster import ClusterSpec, LinkSpec  # noqa: E402

SCALE_UP_KINDS = ("nvlink", "xgmi", "pcie")
"""Link kinds quoted in GB/s (the others are networks, quoted in Gb/s)."""

BOX_W, BOX_H = 2.3, 1.25
"""Size of a node box in data units."""
_GAP_X, _ROW_H, _PER_ROW = 0.5, 2.0, 4
_FABRIC_Y, _FABRIC_H = 0.75, 0.5  # fabric bar: centre below the panel top, height
_GPU_COLORS = ("#AEC7E8", "#FFBB78", "#98DF8A", "#FF9896", "#C5B0D5", "#C49C94", "#F7B6D2")


def fmt_bandwidth(gbytes_per_s: float, network: bool = True) -> str:
    """``gbytes_per_s`` (GB/s, 1e9 bytes/s) as Gb/s for a network, GB/s for a scale-up link."""
    if network:
        gbit = gbytes_per_s * 8
        return f"{gbit / 1000:.3g} Tb/s" if gbit >= 1000 else f"{gbit:.3g} Gb/s"
    return f"{gbytes_per_s:.3g} GB/s"


def fmt_latency(seconds: float) -> str:
    """A latency in the unit that keeps it short (ns, us or ms)."""
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.3g} us"
    return f"{seconds * 1e9:.3g} ns"


def _link_text(link: LinkSpec, count: int = 1) -> str:
    """``[N x ]name bandwidth, latency`` of one link (bandwidth per link, one direction)."""
    bw = fmt_bandwidth(link.bandwidth_GBps, network=link.kind not in SCALE_UP_KINDS)
    return f"{count}x " * (count > 1) + f"{link.name} {bw}, {fmt_latency(link.latency_s)}"


def topology_graph(cluster: ClusterSpec, max_nodes_shown: int = 4) -> nx.Graph:
    """The cluster summarised for drawing.

    Vertices: ``fabric:<region>`` (kind ``fabric``: the region's network; ``link`` describes
    the cluster's fixed intra-region pair link, or None) and ``box:<group>:<k>`` (kind ``nodes``:
    ``count`` identical nodes of node group ``group``; one box per node when the group has at
    most ``max_nodes_shown`` nodes and the cluster at most 4 * ``max_nodes_shown``, else one
    box for the whole group). Edges: box -> its region's fabric (``tier="nic"``) and fabric ->
    fabric (``tier="wan"``), each with ``bandwidth_GBps`` (one direction, GB/s), ``latency_s``
    and a ``label``.
    """
    g = nx.Graph()
    irl = cluster.intra_region_link
    for region in cluster.regions:
        g.add_node(f"fabric:{region}", kind="fabric", region=region,
                   label=f"{region} fabric" if region != "default" else "network fabric",
                   link=None if irl is None else f"{_link_text(irl)} per GPU pair")
    expand = cluster.num_nodes <= 4 * max_nodes_shown
    for gi, group in enumerate(cluster.node_groups):
        per_box = 1 if expand and group.num_nodes <= max_nodes_shown else group.num_nodes
        nic = group.inter_node_link
        for k in range(group.num_nodes // per_box):
            name = f"box:{gi}:{k}"
            head = f"{group.name}: " if group.name and k == 0 else ""
            lines = [f"{head}{group.gpus_per_node}x {group.gpu.name}",
                     f"x {per_box} nodes" if per_box > 1 else f"node {k}"]
            if group.intra_node_link is not None:
                lines.append(f"{group.intra_node_link.name} "
                             f"{fmt_bandwidth(group.intra_node_link.bandwidth_GBps, False)}/GPU")
            g.add_node(name, kind="nodes", group=gi, region=group.region, count=per_box,
                       gpu=group.gpu.name, gpus_per_node=group.gpus_per_node,
                       label="\n".join(lines))
            bw = group.nics_per_node * nic.bandwidth_GBps
            g.add_edge(name, f"fabric:{group.region}", tier="nic", bandwidth_GBps=bw,
                       latency_s=nic.latency_s,
                       label=_link_text(nic, group.nics_per_node)
                       + (" per node" if per_box > 1 else ""))
    for link in cluster.region_links:
        bw, lat = link.bandwidth_Gbps / 8, link.latency_ms * 1e-3
        g.add_edge(f"fabric:{link.a}", f"fabric:{link.b}", tier="wan", bandwidth_GBps=bw,
                   latency_s=lat, label=f"{fmt_bandwidth(bw)}, {fmt_latency(lat)}")
    return g


def _layout(g: nx.Graph, regions: list[str]) -> tuple[dict[str, tuple[float, float]],
                                                       dict[str, tuple[float, float]]]:
    """Positions of every vertex, and each region's panel size (width, height)."""
    boxes = {r: [v for v, d in g.nodes(data=True) if d["kind"] == "nodes" and d["region"] == r]
             for r in regions}
    size = {}
    for r in regions:
        cols = max(1, min(_PER_ROW, len(boxes[r])))
        rows = max(1, math.ceil(len(boxes[r]) / _PER_ROW))
        size[r] = (cols * (BOX_W + _GAP_X) + 0.6, rows * _ROW_H + 1.5)
    n = len(regions)
    big = max(math.hypot(w, h) for w, h in size.values())
    if n == 1:
        centres = {regions[0]: (0.0, 0.0)}
    else:
        radius = 1.05 * big / (2 * math.sin(math.pi / n)) if n > 2 else 0.5 * big + 0.6
        pos0 = nx.circular_layout(regions, scale=radius)
        centres = {r: (float(pos0[r][0]), float(pos0[r][1])) for r in regions}
    pos: dict[str, tuple[float, float]] = {}
    for r in regions:
        cx, cy = centres[r]
        w, h = size[r]
        top = cy + h / 2
        pos[f"fabric:{r}"] = (cx, top - _FABRIC_Y)
        for i, v in enumerate(boxes[r]):
            row, col = divmod(i, _PER_ROW)
            in_row = min(_PER_ROW, len(boxes[r]) - row * _PER_ROW)
            x = cx + (col - (in_row - 1) / 2) * (BOX_W + _GAP_X)
            pos[v] = (x, top - 1.9 - BOX_H / 2 - row * _ROW_H + 0.1)
    return pos, {r: (*centres[r], *size[r]) for r in regions}  # type: ignore[misc]


def _wan_matrix(ax: Axes, cluster: ClusterSpec) -> None:
    """Region x region matrix of WAN bandwidth (colour, Gb/s) and latency (ms)."""
    regions = cluster.regions
    idx = {r: i for i, r in enumerate(regions)}
    n = len(regions)
    bw = [[math.nan] * n for _ in range(n)]
    lat = [[math.nan] * n for _ in range(n)]
    for link in cluster.region_links:
        i, j = idx[link.a], idx[link.b]
        bw[i][j] = bw[j][i] = link.bandwidth_Gbps
        lat[i][j] = lat[j][i] = link.latency_ms
    finite = [x for row in bw for x in row if not math.isnan(x)]
    norm = Normalize(vmin=min(finite), vmax=max(finite) * 1.0001) if finite else None
    im = ax.imshow(bw, cmap="viridis", norm=norm)
    size = 7 if n <= 6 else 6
    for i in range(n):
        for j in range(n):
            if i != j and not math.isnan(bw[i][j]):
                ax.text(j, i, f"{bw[i][j]:.3g} Gb/s\n{lat[i][j]:.3g} ms", ha="center",
                        va="center", fontsize=size, color="white" if norm and
                        norm(bw[i][j]) < 0.5 else "black")
    ax.set_xticks(range(n), regions, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n), regions, fontsize=8)
    ax.set_title("WAN between regions (per GPU pair)", fontsize=10)
    plt.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="Gb/s")


def topology_figure(cluster: ClusterSpec, title: str = "", max_nodes_shown: int = 4
                    ) -> plt.Figure:
    """Draw ``cluster``: region panels holding node boxes (coloured by GPU type, labelled with
    GPUs per node, node count and the intra-node link), NIC links into the region fabric, and
    WAN links between regions labelled (or, above three regions, tabulated) with bandwidth and
    latency."""
    g = topology_graph(cluster, max_nodes_shown)
    regions = cluster.regions
    pos, panels = _layout(g, regions)
    matrix = len(regions) > 3 and bool(cluster.region_links)
    xs = [x for cx, _, w, _ in panels.values() for x in (cx - w / 2, cx + w / 2)]
    ys = [y for _, cy, _, h in panels.values() for y in (cy - h / 2, cy + h / 2)]
    span_x, span_y = max(xs) - min(xs) + 1.0, max(ys) - min(ys) + 1.0
    scale = min(1.0, 13.0 / span_x, 11.0 / span_y) * 0.85
    fig_w, fig_h = max(6.0, span_x * scale), max(4.0, span_y * scale + 0.8)
    if matrix:
        fig, (ax, axm) = plt.subplots(1, 2, figsize=(fig_w + 6.5, max(fig_h, 6.5)),
                                      gridspec_kw={"width_ratios": [fig_w, 6.0]})
    else:
        fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    gpu_colors = {name: _GPU_COLORS[i % len(_GPU_COLORS)]
                  for i, name in enumerate(cluster.gpu_types)}

    wan = [(u, v, d) for u, v, d in g.edges(data=True) if d["tier"] == "wan"]
    if wan:
        bws = [d["bandwidth_GBps"] for _, _, d in wan]
        lo, hi = min(bws), max(bws)
        cmap = plt.get_cmap("viridis")
        for u, v, d in wan:
            frac = 0.5 if hi <= lo else math.log(d["bandwidth_GBps"] / lo) / math.log(hi / lo)
            (x0, y0), (x1, y1) = pos[u], pos[v]
            ax.plot([x0, x1], [y0, y1], color=cmap(frac), linewidth=1.0 + 2.0 * frac,
                    alpha=0.5 if matrix else 0.9, zorder=0)
            if not matrix:
                ax.text((x0 + x1) / 2, (y0 + y1) / 2, "WAN " + d["label"], fontsize=8,
                        ha="center", va="center", zorder=5,
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "#999999"})
    for cx, cy, w, h in panels.values():
        ax.add_patch(FancyBboxPatch((cx - w / 2, cy - h / 2), w, h,
                                    boxstyle="round,pad=0.05,rounding_size=0.3",
                                    fc="#F4F4F4", ec="#888888", lw=1.0, zorder=1))
    for v, d in g.nodes(data=True):
        x, y = pos[v]
        if d["kind"] == "fabric":  # a bar across the top of the region's panel
            w = panels[d["region"]][2] - 0.5
            ax.add_patch(FancyBboxPatch((x - w / 2, y - _FABRIC_H / 2), w, _FABRIC_H,
                                        boxstyle="round,pad=0.02,rounding_size=0.1",
                                        fc="#D0D0D0", ec="#555555", lw=1.0, zorder=3))
            ax.text(x, y, d["label"], ha="center", va="center", fontsize=8, zorder=4,
                    fontweight="bold")
            continue
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H,
                                    boxstyle="round,pad=0.03,rounding_size=0.12",
                                    fc=gpu_colors[d["gpu"]], ec="#333333",
                                    lw=2.0 if d["count"] > 1 else 1.0, zorder=3))
        ax.text(x, y, d["label"], ha="center", va="center", fontsize=7, zorder=4)
    for u, v, d in g.edges(data=True):
        if d["tier"] != "nic":
            continue
        box, fabric = (u, v) if u.startswith("box:") else (v, u)
        x0, y0 = pos[box]
        ax.plot([x0, x0], [y0 + BOX_H / 2, pos[fabric][1] - _FABRIC_H / 2], color="#555555",
                linewidth=1.5 if g.nodes[box]["count"] > 1 else 1.0, zorder=2)
    for gi in {d["group"] for _, d in g.nodes(data=True) if d["kind"] == "nodes"}:
        # One NIC label per node group (every node of a group has the same NIC link).
        box = f"box:{gi}:0"
        edge = next(iter(g.edges(box, data=True)))
        x0, y0 = pos[box]
        ax.text(x0, y0 + BOX_H / 2 + 0.15, edge[2]["label"], ha="center", va="bottom",
                fontsize=6.5, color="#333333", zorder=5,
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none",
                      "alpha": 0.85})
    ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
    ax.set_ylim(min(ys) - 0.5, max(ys) + 0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, fc=c, ec="#333333") for c in gpu_colors.values()]
    ax.legend(handles, list(gpu_colors), fontsize=8, loc="lower right", title="GPU",
              title_fontsize=8, framealpha=0.9)
    peak = sum(grp.num_gpus * max(grp.gpu.peak_tflops.get("bf16", 0.0),
                                  grp.gpu.peak_tflops.get("fp16", 0.0))
               for grp in cluster.node_groups)
    irl = cluster.intra_region_link
    ax.set_title(title or f"{cluster.name}: {cluster.num_gpus} GPUs on {cluster.num_nodes} "
                 f"nodes in {len(regions)} region{'s' * (len(regions) > 1)}, "
                 f"{peak / 1000:{',.0f' if peak >= 1e5 else '.3g'}} PFLOP/s 16-bit peak"
                 + ("" if irl is None else f"\nbetween nodes of a region: {_link_text(irl)} "
                    "per GPU pair"), fontsize=10)
    if matrix:
        _wan_matrix(axm, cluster)
    fig.tight_layout()
    return fig

