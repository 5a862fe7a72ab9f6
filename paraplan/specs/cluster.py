# longer than 400 lines: the GPU, link, node-group and cluster specs validate each other.
"""GPU, Link and Cluster specs.

A cluster is one or more *node groups* (a GPU type, GPUs per node, node count, the link inside
a node and the NICs that leave it), each in a *region*. Nodes of one region meet in a fabric
(each GPU gets its share of its node's NIC bandwidth) unless ``intra_region_link`` says every
GPU pair gets a fixed link (the DT-FM simulation model); regions meet over WAN links given per
region pair. Bandwidths are one-direction GB/s (1e9 bytes/s) throughout: vendors often quote
the bidirectional sum (e.g. "900 GB/s" NVLink4 is 450 each way).
"""

from __future__ import annotations

import bisect
import math
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, model_validator

from paraplan.specs.base import StrictModel
from paraplan.specs.mesh import check_peer_matrix

if TYPE_CHECKING:
    from paraplan.specs.topology import Topology

DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8")


SUSTAINED_GEMM_SQUARES = (4096, 8192, 16384)
"""n of the n^3 GEMMs whose best a ``GPUSpec.sustained_matmul_efficiency`` figure is
(tile-ai/TileOPs gemm_throughput.py: best of these, after the clock settles)."""


class GemmTable(StrictModel):
    """Measured GEMM throughput on a grid of shapes (TFLOP/s), for one GPU architecture.

    ``tflops`` is flattened m-major over the ``m`` x ``n`` x ``k`` grid; ``m`` folds batched
    entries in (a batch of b GEMMs of m rows counts as b*m rows). Lookups interpolate
    trilinearly in log2(shape), fold an output dimension beyond the grid's edge into the other
    one (``_fold``), clamp at the largest output and extrapolate k beyond the longest measured
    one by the per-tile time's trend in k (``_interpolate``).
    """

    name: str
    reference_peak_tflops: float = Field(gt=0, le=1e6)
    """Dense peak of the table's dtype on the GPU it was measured on (to scale to other
    parts)."""
    reference_matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Best large-GEMM efficiency of that GPU measured the way ``GPUSpec.matmul_efficiency``
    is (stas00's mamf-finder), where one exists: a part's table is then the reference's shape
    profile at the part's own measured level (``Device.of``), not at the reference's level
    times the ratio of rated peaks. None = scale by the rated peaks alone."""
    m: list[int] = Field(min_length=1)
    n: list[int] = Field(min_length=1)
    k: list[int] = Field(min_length=1)
    tflops: list[float]
    sources: list[str] = Field(default_factory=list)

    @cached_property
    def memo(self) -> dict[tuple[float, float, float], float]:
        """Lookup cache (a plain dict: pydantic private attributes are slow to reach)."""
        return {}

    @model_validator(mode="after")
    def _grid(self) -> GemmTable:
        if len(self.tflops) != len(self.m) * len(self.n) * len(self.k):
            raise ValueError("tflops must have len(m)*len(n)*len(k) entries")
        bad = next((t for t in self.tflops if not 0 < t <= self.reference_peak_tflops * 1.5),
                   None)
        if bad is not None:
            raise ValueError(f"tflops={bad} must be > 0 and at most 1.5x "
                             f"reference_peak_tflops={self.reference_peak_tflops:g}")
        for axis in (self.m, self.n, self.k):
            if axis != sorted(set(axis)) or axis[0] <= 0:
                raise ValueError("grid axes must be strictly increasing positive sizes")
        return self

    def best_square_efficiency(self, sizes: tuple[int, ...] = SUSTAINED_GEMM_SQUARES) -> float:
        """Best efficiency (0..1) over the square shapes ``sizes`` (as ``efficiency`` looks
        them up): the table's value where a sustained measurement picked its best."""
        return max(self.efficiency(n, n, n) for n in sizes)

    def efficiency(self, m: float, n: float, k: float) -> float:
        """Measured TFLOP/s at (m, n, k) divided by the reference peak (0..1)."""
        memo = self.memo
        key = (m, n, k)
        hit = memo.get(key)
        if hit is None:
            hit = self._interpolate(m, n, k) / self.reference_peak_tflops
            if len(memo) > 65536:
                memo.clear()
            memo[key] = hit
        return hit

    @staticmethod
    def _bracket(axis: list[int], x: float) -> tuple[int, int, float]:
        lx = math.log2(min(max(x, axis[0]), axis[-1]))
        i = min(max(bisect.bisect_right(axis, 2**lx) - 1, 0), len(axis) - 1)
        j = min(i + 1, len(axis) - 1)
        if i == j:
            return i, j, 0.0
        lo, hi = math.log2(axis[i]), math.log2(axis[j])
        return i, j, (lx - lo) / (hi - lo)

    @cached_property
    def best_tflops(self) -> float:
        """The table's fastest measured shape, TFLOP/s."""
        return max(self.tflops)

    def _fold(self, m: float, n: float) -> tuple[float, float]:
        """(m, n) with an output dimension beyond the grid's edge folded into the other,
        keeping the output's m x n (its tile count) while the other has room: at a given k
        the measured throughput follows the output's area, not its aspect ratio (OpenXLA's
        sm_90 table, bf16, k = 2048 and 4096: 512x4096, 1024x2048, 2048x1024 and 4096x512 all
        within 1.0%; 1024x4096, 2048x2048, 4096x1024 within 0.1%), so a 2048 x 9216 output
        is read at 4608 x 4096, not at the 2048 x 4096 a clamp would read. The grid's rows
        beyond 4,096 are batched entries (b = 2, 4 folded into m): a folded output lands on
        them, a few percent below or above a plain GEMM of that area."""
        m_max, n_max = self.m[-1], self.n[-1]
        if n > n_max and m < m_max:
            return min(m_max, m * n / n_max), n_max
        if m > m_max and n < n_max:
            return m_max, min(n_max, n * m / m_max)
        return m, n

    def _interpolate(self, m: float, n: float, k: float) -> float:
        m, n = self._fold(m, n)
        if k > self.k[-1] and len(self.k) > 1:
            # Beyond the grid's longest inner dimension the output tiles only loop longer:
            # time = fixed per-tile work (prologue, epilogue, waves) + a part linear in k,
            # read off the two longest measured k at this (m, n), never faster than the
            # table's fastest shape (large GEMMs saturate).
            k1, k2 = self.k[-2], self.k[-1]
            t1 = k1 / self._interpolate(m, n, k1)
            t2 = k2 / self._interpolate(m, n, k2)
            per_k = (t2 - t1) / (k2 - k1)
            if per_k <= 0:  # a launch-bound shape whose time does not grow: keep k2's rate
                return k2 / t2
            return min(self.best_tflops, k / (t2 + per_k * (k - k2)))
        (i0, i1, fm), (j0, j1, fn), (l0, l1, fk) = (
            self._bracket(self.m, m), self._bracket(self.n, n), self._bracket(self.k, k))
        nn, nk = len(self.n), len(self.k)

        def at(i: int, j: int, l_: int) -> float:
            return self.tflops[(i * nn + j) * nk + l_]

        total = 0.0
        for i, wi in ((i0, 1 - fm), (i1, fm)):
            for j, wj in ((j0, 1 - fn), (j1, fn)):
                for l_, wl in ((l0, 1 - fk), (l1, fk)):
                    w = wi * wj * wl
                    if w:
                        total += w * at(i, j, l_)
        return total


def power_limit_label(limit_W: float) -> str:
    """How a power limit is written after a GPU's name: ``@500W`` (a capped node group's GPU
    is named so, and ``describe`` shows it)."""
    return f"@{limit_W:g}W"


class GPUSpec(StrictModel):
    """One accelerator type. Peaks are dense (no sparsity) TFLOP/s."""

    name: str = Field(min_length=1)
    display_name: str | None = None
    vendor: Literal["nvidia", "amd", "intel", "other"] = "nvidia"
    architecture: str | None = None
    sm_count: int | None = Field(default=None, gt=0, le=10_000)
    """Streaming multiprocessors (compute units): GEMM tiles run in waves of this many."""
    memory_GiB: float = Field(gt=0, le=100_000)
    """Device memory capacity, GiB (2^30 bytes)."""
    memory_bandwidth_GBps: float = Field(gt=0, le=1e6)
    """Peak device-memory bandwidth, GB/s (1e9 bytes/s)."""
    peak_tflops: dict[Literal["bf16", "fp16", "fp32", "tf32", "fp8"], float]
    """Dense tensor-core peak per dtype, TFLOP/s (1e12 FLOP/s)."""
    matmul_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Achievable fraction of the 16-bit peak on large GEMMs (published measurement)."""
    gemm_table: GemmTable | None = None
    """Measured GEMM throughput by shape for this architecture (YAML: a table name such as
    ``sm_90``); when present it replaces the roofline + wave-quantization estimate."""
    gemm_table_fp8: GemmTable | None = None
    """Measured fp8 (e4m3) GEMM throughput by shape (YAML: a table name such as
    ``sm_100_fp8``); fp8 training uses it instead of scaling ``gemm_table``, since small
    GEMMs gain little from fp8 (the tables show it)."""
    matmul_efficiency_fp8: float | None = Field(default=None, gt=0, le=1)
    """Achievable fraction of the fp8 peak on large GEMMs; None = matmul_efficiency."""
    attention_efficiency_fwd: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the 16-bit peak a fused (Flash) attention forward reaches on this GPU;
    None = matmul_efficiency scaled by FlashAttention-2's A100 ratio (73% vs 87%)."""
    attention_efficiency_bwd: float | None = Field(default=None, gt=0, le=1)
    """Same for the attention backward (FlashAttention-2 on A100: 63%)."""
    sustained_clock_fraction: float = Field(default=1.0, gt=0, le=1)
    """Fraction of the short-burst compute throughput (the GEMM and attention efficiencies
    above, measured in seconds-long benchmarks near boost clock) that compute-bound kernels
    keep once the clock has settled at the power limit in hours-long training; 1.0 where no
    public figure exists. Memory bandwidth is not scaled."""
    sustained_matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the 16-bit peak cuBLAS sustains on large square GEMMs (the best over
    ``SUSTAINED_GEMM_SQUARES``) once the clock has settled at the power limit, measured directly
    (seconds-long timed runs after a settle); where set it replaces ``matmul_efficiency *
    sustained_clock_fraction`` for GEMMs, and ``gemm_table`` is scaled so that its best value
    over those shapes equals it. None = that product."""
    sustained_matmul_efficiency_fp8: float | None = Field(default=None, gt=0, le=1)
    """Same for fp8 GEMMs, as a fraction of the fp8 peak; None = the 16-bit figure scaled by
    ``matmul_efficiency_fp8 / matmul_efficiency`` (or the product above without it)."""
    unit_speed_spread: float = Field(default=0.0, ge=0, le=0.5)
    """Relative standard deviation of compute-bound speed between parts of this SKU in one
    fleet at the same power limit (manufacturing variation under power management; fleet
    measurements in ``sources``). A step synchronised over n parts runs its GEMMs and
    attention at the slowest one's pace (``simulator.variability``); memory-bound kernels'
    bandwidth is not scaled (a measured GEMM table's small shapes are: the table is
    scaled as a whole). 0 = identical parts."""
    host_time_factor: float = Field(default=1.0, gt=0, le=100)
    """Host (CPU) time of one framework op on this GPU's host over a DGX H100's Xeon 8480C
    (1.0): Grace-hosted parts (GH200, GB200) issue PyTorch ops more slowly. Scales
    ``TrainingSpec.moe_host_sync_s``."""
    memory_bandwidth_efficiency: float = Field(default=0.9, gt=0, le=1)
    """Achievable fraction of peak memory bandwidth on streaming kernels."""
    nccl_channels: int | None = Field(default=None, gt=0, le=1024)
    """Thread blocks (one per channel, each on its own SM) an NCCL collective runs on this
    GPU in its usual box: compute overlapped with a collective loses that share of the SMs
    (``Device.nccl_slowdown``). NCCL sizes it from the NVLink bandwidth it finds (its ring
    search, then doubled); None = 16, its usual count for one NVLink/IB ring pair."""
    tdp_W: float | None = Field(default=None, gt=0, le=1e5)
    power_limit_W: float | None = Field(default=None, gt=0, le=1e5)
    """Board power limit the GPUs run at, W (``nvidia-smi -pl``; some hosts ship below the
    TDP). None = the TDP. A limit below the top of ``power_curve`` scales every compute-bound
    kernel (GEMMs, attention) by the curve's throughput there; memory bandwidth is kept."""
    power_curve: list[tuple[float, float]] = Field(default_factory=list)
    """(power limit W, compute throughput relative to this profile) points for the same die,
    ascending in W and ending at 1.0: the vendor's rated dense peaks of its lower-power parts
    over this part's (``sources`` cites them); linear between points."""
    price_per_hour_usd: float | None = Field(default=None, ge=0, le=1e6)
    scale_up_link: str | None = None
    form_factor: Literal["sxm", "pcie", "oam", "other"] | None = None
    notes: str | None = None
    sources: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _peaks_positive(self) -> GPUSpec:
        if not self.peak_tflops:
            raise ValueError("peak_tflops needs at least one dtype (bf16, fp16, fp32, tf32, fp8)")
        for dtype, value in self.peak_tflops.items():
            if not 0 < value <= 1e6:
                raise ValueError(f"peak_tflops.{dtype}={value} must be > 0 and <= 1e6")
        return self

    @model_validator(mode="after")
    def _power_limit_priced(self) -> GPUSpec:
        curve = self.power_curve
        for (w0, f0), (w1, f1) in zip(curve, curve[1:], strict=False):
            if not (w0 < w1 and f0 <= f1):
                raise ValueError("power_curve points must rise in power_limit_W and throughput")
        if curve and not (curve[0][1] > 0 and curve[-1][1] == 1.0):
            raise ValueError("power_curve throughputs must be in (0, 1] and end at 1.0")
        limit, lowest = self.power_limit_W, self.lowest_power_limit_W
        if limit is None:
            return self
        if lowest is None:
            raise ValueError(f"power_limit_W={limit:g} cannot be priced: the profile has no "
                             "tdp_W and no power_curve")
        if limit < lowest:
            raise ValueError(f"power_limit_W={limit:g} is below what this profile can price "
                             f"(lowest point: {f'{lowest:g} W' if curve else 'no power_curve'}"
                             f"); allowed: {self.power_limits_allowed}")
        return self

    @property
    def lowest_power_limit_W(self) -> float | None:
        """The lowest limit this profile can price: its power curve's first point, else its
        TDP (no curve: no cap below it); None with neither."""
        return self.power_curve[0][0] if self.power_curve else self.tdp_W

    @property
    def power_limits_allowed(self) -> str:
        """The power limits this profile can price, in words (for errors)."""
        lowest = self.lowest_power_limit_W
        if lowest is None:
            return "none (the profile has no tdp_W and no power_curve)"
        return f"{lowest:g} W or more" + ("" if self.power_curve else " (no power_curve)")

    @property
    def power_fraction(self) -> float:
        """Compute throughput at ``power_limit_W`` relative to the profile (1.0 at or above
        the curve's top point, or without a limit)."""
        limit, curve = self.power_limit_W, self.power_curve
        if limit is None or not curve or limit >= curve[-1][0]:
            return 1.0
        for (w0, f0), (w1, f1) in zip(curve, curve[1:], strict=False):
            if w0 <= limit <= w1:
                return f0 + (f1 - f0) * (limit - w0) / (w1 - w0)
        return curve[0][1]  # unreachable: the validator keeps the limit on the curve

    def peak_flops(self, dtype: str) -> float:
        """Dense peak for ``dtype`` in FLOP/s. KeyError if the GPU lacks that dtype."""
        return self.peak_tflops[dtype] * 1e12  # type: ignore[index]

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * 2**30


class LinkSpec(StrictModel):
    """A link: a GPU's scale-up port, a NIC port or a WAN path. Bandwidth one direction."""

    name: str = Field(min_length=1)
    display_name: str | None = None
    kind: Literal["nvlink", "xgmi", "pcie", "infiniband", "roce", "ethernet", "efa", "wan"]
    bandwidth_GBps: float = Field(gt=0, le=1e6)
    """One-direction bandwidth, GB/s (1e9 bytes/s)."""
    latency_us: float = Field(ge=0, le=1e7)
    """Per-message latency an alpha-beta model should charge, microseconds."""
    efficiency: float = Field(default=0.8, gt=0, le=1.2)
    """Fraction of bandwidth large collectives achieve (NCCL busbw / spec); >1 with SHARP."""
    notes: str | None = None
    sources: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _gbps(cls, data: Any) -> Any:
        # Networks are quoted in Gb/s; accept bandwidth_Gbps as a convenience (8 bits a byte).
        if isinstance(data, dict) and "bandwidth_Gbps" in data:
            data = dict(data)
            gbps = data.pop("bandwidth_Gbps")
            if "bandwidth_GBps" in data:
                raise ValueError("give bandwidth_GBps or bandwidth_Gbps, not both")
            if isinstance(gbps, int | float) and not isinstance(gbps, bool):
                data["bandwidth_GBps"] = gbps / 8
            else:
                data["bandwidth_GBps"] = gbps
        return data

    @property
    def bandwidth_Bps(self) -> float:
        """One-direction bandwidth in bytes/s."""
        return self.bandwidth_GBps * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


class NodeGroup(StrictModel):
    """``num_nodes`` identical nodes of ``gpus_per_node`` GPUs in one region."""

    name: str | None = None
    gpu: GPUSpec
    gpus_per_node: int = Field(gt=0, le=1024)
    num_nodes: int = Field(default=1, gt=0, le=1_000_000)
    intra_node_link: LinkSpec | None = None
    """Each GPU's scale-up link (NVLink, PCIe); required when gpus_per_node > 1."""
    inter_node_link: LinkSpec
    """One NIC port leaving the node."""
    nics_per_node: int = Field(default=1, gt=0, le=1024)
    region: str = "default"
    peer_bandwidth_GBps: list[list[float]] | None = None
    """A node without a switch (DGX-1's NVLink hybrid cube mesh, AMD's xGMI full mesh): the
    one-direction GB/s of the direct links between each pair of its GPUs (gpus_per_node x
    gpus_per_node, symmetric, 0 on the diagonal and where no link joins a pair). A ring
    collective over some of a node's GPUs can only use the links between them, so it runs at
    the least member's bandwidth to the other members (``specs.mesh``), at most the
    ``intra_node_link``'s. None: a switch gives any group of the node the full link."""
    host_link: LinkSpec | None = None
    """In a switchless node, the path between two GPUs with no direct link, and from a GPU
    to its NICs: the host's PCIe (DGX-1's ``SYS`` pairs cross PCIe and the CPU sockets).
    None: the ``intra_node_link`` figure stands in (optimistic)."""

    @model_validator(mode="after")
    def _intra(self) -> NodeGroup:
        if self.gpus_per_node > 1 and self.intra_node_link is None:
            raise ValueError(
                f"intra_node_link is required when gpus_per_node={self.gpus_per_node} > 1"
            )
        if self.peer_bandwidth_GBps is not None:
            check_peer_matrix(self.peer_bandwidth_GBps, self.gpus_per_node,
                              host=self.host_link is not None)
        elif self.host_link is not None:
            raise ValueError("host_link is the path between GPUs of a switchless node with no "
                             "direct link: give peer_bandwidth_GBps with it")
        return self

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def nic_bandwidth_per_gpu_GBps(self) -> float:
        """Each GPU's fair share of the node's NIC bandwidth when all GPUs send at once."""
        return self.nics_per_node * self.inter_node_link.bandwidth_GBps / self.gpus_per_node


class RegionLink(StrictModel):
    """WAN path between two regions, per pair of GPUs (the DT-FM convention)."""

    a: str
    b: str
    latency_ms: float = Field(ge=0, le=1e6)
    bandwidth_Gbps: float = Field(gt=0, le=1e7)


class ClusterSpec(StrictModel):
    """A cluster: node groups, optional fixed intra-region pair link, WAN links between regions."""

    name: str = Field(min_length=1)
    description: str | None = None
    node_groups: list[NodeGroup] = Field(min_length=1)
    intra_region_link: LinkSpec | None = None
    """If set, two GPUs on different nodes of one region talk over this link (per pair)."""
    region_links: list[RegionLink] = Field(default_factory=list)
    collective_efficiency: dict[
        Literal["all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p"],
        Annotated[float, Field(gt=0, le=4)]] = Field(default_factory=dict)
    """Bandwidth the communication library achieves on a collective kind, relative to the ring
    model calibrated by all-reduce (1 = as the link's ``efficiency`` says). A property of the
    library on this cluster: gloo's reduce-scatter runs at about a third of its all-reduce's
    ring bandwidth, NCCL's collectives all sit near the ring model. Kinds left out are 1.
    ``paraplan calibrate`` measures them."""
    sources: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _regions(self) -> ClusterSpec:
        regions = {g.region for g in self.node_groups}
        pairs = set()
        for link in self.region_links:
            for end in (link.a, link.b):
                if end not in regions:
                    raise ValueError(
                        f"region_links names region {end!r}, which no node group is in; "
                        f"regions are {sorted(regions)}"
                    )
            pair = frozenset((link.a, link.b))
            if pair in pairs:
                raise ValueError(f"region_links gives the pair {link.a!r}-{link.b!r} twice "
                                 "(the answer would depend on their order); give it once")
            pairs.add(pair)
        if len(regions) > 1:
            missing = [
                (a, b)
                for i, a in enumerate(sorted(regions))
                for b in sorted(regions)[i + 1 :]
                if frozenset((a, b)) not in pairs
            ]
            if missing:
                raise ValueError(
                    f"no region_links entry for region pair(s) {missing[:3]}; every pair of "
                    "regions needs latency_ms and bandwidth_Gbps"
                )
        return self

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    @property
    def num_nodes(self) -> int:
        return sum(g.num_nodes for g in self.node_groups)

    @property
    def gpu_types(self) -> list[str]:
        seen: dict[str, None] = {}
        for g in self.node_groups:
            seen.setdefault(g.gpu.name, None)
        return list(seen)

    @property
    def is_homogeneous(self) -> bool:
        """One GPU type, one node shape, one region: the searchers' fast path applies."""
        first = self.node_groups[0]
        return len(self.regions) == 1 and all(
            g.gpu == first.gpu
            and g.gpus_per_node == first.gpus_per_node
            and g.intra_node_link == first.intra_node_link
            and g.inter_node_link == first.inter_node_link
            and g.nics_per_node == first.nics_per_node
            for g in self.node_groups
        )

    @property
    def regions(self) -> list[str]:
        seen: dict[str, None] = {}
        for g in self.node_groups:
            seen.setdefault(g.region, None)
        return list(seen)

    @property
    def gpu(self) -> GPUSpec:
        """The GPU of the first node group (the only one in a homogeneous cluster)."""
        return self.node_groups[0].gpu

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node of the first node group."""
        return self.node_groups[0].gpus_per_node

    def model_copy(self, *, update: dict[str, Any] | None = None,
                   deep: bool = False) -> ClusterSpec:
        """pydantic's model_copy, minus the cached ``topology`` (model_copy copies the
        instance ``__dict__``, so a copy with other node groups would keep the old one)."""
        out = super().model_copy(update=update, deep=deep)
        out.__dict__.pop("topology", None)
        return out

    @cached_property
    def topology(self) -> Topology:
        """The cluster's Topology, built once per spec instance (specs are immutable)."""
        from paraplan.specs.topology import Topology

        return Topology(self)

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        """Same node type, ``num_nodes`` nodes. Only for single-group clusters."""
        from paraplan.specs.errors import SpecError

        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise SpecError(
                f"--nodes={num_nodes!r} must be a positive integer",
                field="nodes",
                value=num_nodes,
                allowed="integer >= 1",
            )
        if len(self.node_groups) != 1:
            raise SpecError(
                f"--nodes={num_nodes} applies to clusters of one node type; cluster "
                f"{self.name!r} has {len(self.node_groups)} node groups (edit its YAML instead)",
                field="nodes",
                value=num_nodes,
                allowed="omit --nodes for multi-group clusters",
            )
        # Validated like a YAML cluster (model_copy would skip the field limits).
        from pydantic import ValidationError

        group = self.node_groups[0]
        try:
            group = type(group).model_validate(
                {**{k: getattr(group, k) for k in type(group).model_fields},
                 "num_nodes": num_nodes})
            return type(self).model_validate(
                {**{k: getattr(self, k) for k in type(self).model_fields},
                 "node_groups": [group]})
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            raise SpecError(f"--nodes={num_nodes}: {err.get('msg', 'invalid')}", field="nodes",
                            value=num_nodes) from None

    def describe(self) -> dict:
        """JSON-ready summary for ``paraplan describe --cluster``."""
        groups = []
        for g in self.node_groups:
            groups.append(
                {
                    "name": g.name,
                    "region": g.region,
                    "gpu": g.gpu.name,
                    "gpus_per_node": g.gpus_per_node,
                    "num_nodes": g.num_nodes,
                    "num_gpus": g.num_gpus,
                    "memory_GiB_per_gpu": g.gpu.memory_GiB,
                    "peak_tflops_per_gpu": dict(g.gpu.peak_tflops),
                    "power_limit_W": g.gpu.power_limit_W,
                    "compute_at_power_limit": round(g.gpu.power_fraction, 4),
                    "intra_node_link": g.intra_node_link.name if g.intra_node_link else None,
                    "intra_node_bandwidth_GBps": (
                        g.intra_node_link.bandwidth_GBps if g.intra_node_link else None
                    ),
                    "peer_bandwidth_GBps": g.peer_bandwidth_GBps,  # None: a switch
                    "host_link": g.host_link.name if g.host_link else None,
                    "inter_node_link": g.inter_node_link.name,
                    "nics_per_node": g.nics_per_node,
                    "nic_bandwidth_per_gpu_GBps": round(g.nic_bandwidth_per_gpu_GBps, 4),
                }
            )
        peak = sum(
            g.num_gpus * max(g.gpu.peak_tflops.get("bf16", 0), g.gpu.peak_tflops.get("fp16", 0))
            for g in self.node_groups
        )
        return {
            "name": self.name,
            "description": self.description,
            "num_gpus": self.num_gpus,
            "num_nodes": self.num_nodes,
            "gpu_types": self.gpu_types,
            "homogeneous": self.is_homogeneous,
            "regions": self.regions,
            "total_peak_16bit_pflops": round(peak / 1000, 3),
            "total_memory_GiB": sum(g.num_gpus * g.gpu.memory_GiB for g in self.node_groups),
            "node_groups": groups,
            "intra_region_link": (
                self.intra_region_link.model_dump(exclude={"sources", "notes"})
                if self.intra_region_link
                else None
            ),
            "region_links": [r.model_dump() for r in self.region_links],
            "sources": list(self.sources),
        }
