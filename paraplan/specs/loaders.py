"""Load specs by preset name or from files (YAML, Hugging Face config.json).

Inputs are data, never code, read within bounds (``safe_io``: size limits, no alias bombs, no
duplicate keys, no tags). Every failure (unknown name, missing file, malformed YAML/JSON,
unknown key, bad value) raises ``SpecError``.
"""

from __future__ import annotations

import csv
import difflib
import functools
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from paraplan.specs.cluster import ClusterSpec, GemmTable, GPUSpec, LinkSpec, power_limit_label
from paraplan.specs.errors import SpecError, from_validation_error
from paraplan.specs.hf_config import model_from_hf_config
from paraplan.specs.model import ModelSpec
from paraplan.specs.safe_io import (
    MAX_TABLE_BYTES,
    parse_json,
    parse_yaml,
    read_user_text,
)
from paraplan.specs.trainer import TrainerSpec

KINDS = ("gpus", "links", "clusters", "models", "trainers")


def profiles_dir() -> Path:
    """Directory of the bundled hardware profiles and presets."""
    return Path(__file__).resolve().parent.parent / "hardware_profiles"


def list_profiles(kind: str) -> list[str]:
    """Names of the bundled profiles of one kind (``gpus``, ``links``, ``clusters``, ``models``,
    ``trainers``)."""
    if kind not in KINDS:
        raise SpecError(f"profile kind {kind!r} is unknown", field="kind", value=kind,
                        allowed=KINDS)
    return sorted(p.stem for p in (profiles_dir() / kind).glob("*.yaml"))


def _as_path(value: str) -> Path | None:
    """The path ``value`` names if it is an existing file or directory, else None."""
    try:
        path = Path(value).expanduser()
        return path if path.exists() else None
    except (OSError, ValueError, RuntimeError):  # NUL bytes, long names, "~nouser"
        return None


def _preset(kind: str, ref: str) -> Path | None:
    """The bundled profile file ``ref`` names, if any (a path, an over-long or odd name is not
    a preset name and never reaches the file system as one)."""
    if not ref or len(ref) > 128 or any(c in ref for c in "/\\\0") or ref.startswith("."):
        return None
    path = profiles_dir() / kind / f"{ref}.yaml"
    return path if path.is_file() else None


def _read_text(path: Path, what: str, limit: int | None = None) -> str:
    """A user file's text, bounded (``safe_io.read_user_text``)."""
    return read_user_text(path, what) if limit is None else read_user_text(path, what, limit)


def read_yaml(path: Path, what: str) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping."""
    data = parse_yaml(_read_text(path, what), what, str(path))
    if not isinstance(data, dict):
        raise SpecError(f"{what} file {str(path)!r} must hold a mapping of keys to values, got "
                        f"{type(data).__name__}", field=what, value=str(path))
    return data


def _unknown(kind: str, value: str) -> SpecError:
    names = list_profiles(kind)
    close = difflib.get_close_matches(str(value), names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    label = kind[:-1]
    return SpecError(
        f"unknown {label} {value!r}{hint} Known {kind}: {', '.join(names)} (or a YAML file path)",
        field=label, value=value, allowed=names,
    )


def _build(cls: type[BaseModel], data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise SpecError(f"{where} must be a mapping, got {type(data).__name__}", field=where,
                        value=data)
    try:
        return cls(**{str(k): v for k, v in data.items()})
    except ValidationError as exc:
        raise from_validation_error(exc, where) from None


def _load_named(kind: str, ref: Any, cls: type[BaseModel], where: str,
                resolve: Any = None) -> Any:
    """A spec given as an instance, an inline mapping, a preset name or a YAML path."""
    resolve = resolve or (lambda data: data)
    if isinstance(ref, cls):
        return ref
    if isinstance(ref, dict):
        return _build(cls, resolve(ref), where)
    if not isinstance(ref, str) or not ref:
        raise SpecError(f"{where}={ref!r} must be a {kind[:-1]} name, a YAML path or a mapping",
                        field=where, value=ref, allowed=list_profiles(kind))
    preset = _preset(kind, ref)
    if preset is not None:
        return _build(cls, resolve(read_yaml(preset, where)), where)
    path = _as_path(ref)
    if path is not None and path.is_file():
        return _build(cls, resolve(read_yaml(path, where)), where)
    raise _unknown(kind, ref)


def load_gemm_table(name: str, key: str = "gemm_table") -> GemmTable:
    """A measured-GEMM table: a bundled name (``hardware_profiles/gemm/<name>.yaml``) or the
    path of your own table YAML (``name``, ``reference_peak_tflops``, ``csv``, ``dtype``; the
    CSV has columns b,m,n,k,dtype,tflops and is read relative to the YAML). ``key``: the GPU
    field that names it (``gemm_table`` or ``gemm_table_fp8``), for errors."""
    folder = profiles_dir() / "gemm"
    known = sorted(p.stem for p in folder.glob("*.yaml"))
    if not isinstance(name, str) or not name:
        raise SpecError(f"{key}={name!r} must be a table name or a YAML path",
                        field=f"gpu.{key}", value=name, allowed=known)
    meta_path = folder / f"{name}.yaml"
    if "/" in name or "\\" in name or not meta_path.is_file():
        own = _as_path(name)
        if own is None or not own.is_file():
            raise SpecError(f"unknown {key} {name!r}; known: {', '.join(known)} (or the "
                            "path of a table YAML)", field=f"gpu.{key}", value=name,
                            allowed=known)
        meta_path, folder = own, own.parent
    meta = read_yaml(meta_path, "gemm_table")
    for key in ("csv", "dtype", "reference_peak_tflops"):
        if key not in meta:
            raise SpecError(f"gemm_table {str(meta_path)!r} lacks the key {key!r}",
                            field=f"gemm_table.{key}", value=str(meta_path))
    if not isinstance(meta["csv"], str) or not (folder / meta["csv"]).is_file():
        raise SpecError(f"gemm_table CSV {meta['csv']!r} not found next to {str(meta_path)!r}",
                        field="gemm_table.csv", value=meta["csv"])
    cells: dict[tuple[int, int, int], list[float]] = {}
    try:
        for row in csv.DictReader(_read_text(folder / meta["csv"], "gemm_table",
                                             MAX_TABLE_BYTES).splitlines()):
            if row["dtype"] != meta["dtype"]:
                continue
            key = (int(row["b"]) * int(row["m"]), int(row["n"]), int(row["k"]))
            cells.setdefault(key, []).append(float(row["tflops"]))
    except (KeyError, ValueError, TypeError) as exc:
        raise SpecError(f"gemm_table CSV {meta['csv']!r} needs columns b,m,n,k,dtype,tflops "
                        f"with numbers ({exc})", field="gemm_table.csv",
                        value=meta["csv"]) from None
    if not cells:
        raise SpecError(f"gemm_table CSV {meta['csv']!r} has no rows of dtype {meta['dtype']!r}",
                        field="gemm_table.dtype", value=meta["dtype"])
    ms, ns, ks = (sorted({key[i] for key in cells}) for i in range(3))
    missing = [(m, n, k) for m in ms for n in ns for k in ks if (m, n, k) not in cells]
    if missing:
        raise SpecError(f"gemm_table {name!r} must be a full m x n x k grid; missing (b*m, n, k) "
                        f"= {missing[:3]}", field="gemm_table.csv", value=meta["csv"])
    values = [sum(cells[(m, n, k)]) / len(cells[(m, n, k)]) for m in ms for n in ns for k in ks]
    return _build(GemmTable, {"name": name, "reference_peak_tflops":
                              meta["reference_peak_tflops"],
                              "reference_matmul_efficiency":
                              meta.get("reference_matmul_efficiency"), "m": ms, "n": ns, "k": ks,
                              "tflops": values, "sources": meta.get("sources", [])},
                  "gemm_table")


def _resolve_gpu(data: dict[str, Any]) -> dict[str, Any]:
    for key in ("gemm_table", "gemm_table_fp8"):
        if isinstance(data.get(key), str):
            data = dict(data)
            data[key] = load_gemm_table(data[key], key)
    return data


def load_gpu(ref: str | dict | GPUSpec, where: str = "gpu") -> GPUSpec:
    """A GPU by preset name (``h100-sxm``), YAML path or mapping (``where`` names it in
    errors as the user wrote it, e.g. ``node.gpu``)."""
    return _load_named("gpus", ref, GPUSpec, where, resolve=_resolve_gpu)


def _power_limited(gpu: Any, limit: Any, at: str) -> GPUSpec:
    """The node group's GPU at the board power limit its YAML sets (``gpu_power_limit_W``)."""
    where = f"{at}.gpu_power_limit_W"
    if not isinstance(gpu, GPUSpec):
        raise SpecError(f"{where} needs the group's gpu", field=where, value=limit)
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise SpecError(f"{where}={limit!r} must be a number of watts", field=where, value=limit)
    try:
        # Its own name: node groups and stages look GPU types up by name, so a capped group
        # must not share one with an uncapped group of the same part.
        return GPUSpec.model_validate({**gpu.model_dump(), "power_limit_W": float(limit),
                                       "name": gpu.name + power_limit_label(float(limit))})
    except ValidationError as exc:
        reason = "; ".join(str(e.get("msg", "")).removeprefix("Value error, ")
                           for e in exc.errors())
        raise SpecError(f"{where}={limit!r} cannot be priced for {gpu.name}: {reason}",
                        field=where, value=limit, allowed=gpu.power_limits_allowed) from None


def load_link(ref: str | dict | LinkSpec, where: str = "link") -> LinkSpec:
    """A link by preset name (``ib-ndr``), YAML path or mapping (``where`` as in load_gpu)."""
    return _load_named("links", ref, LinkSpec, where)


def load_trainer(ref: str | dict | TrainerSpec) -> TrainerSpec:
    """A trainer profile by preset name (``megatron-core``), YAML path or mapping. Bundled
    presets are read once per process (``simulate(..., trainer="megatron-core")`` in a loop
    re-read the YAML on every call)."""
    preset = _preset("trainers", ref) if isinstance(ref, str) else None
    if preset is not None:
        return _bundled_trainer(preset)
    return _load_named("trainers", ref, TrainerSpec, "trainer")


@functools.lru_cache(maxsize=32)
def _bundled_trainer(path: Path) -> TrainerSpec:
    """A bundled trainer profile (specs are frozen, so one instance serves every caller)."""
    return _build(TrainerSpec, read_yaml(path, "trainer"), "trainer")


def load_model(ref: str | ModelSpec) -> ModelSpec:
    """A model by preset name, paraplan YAML file, or Hugging Face ``config.json`` (file or dir).

    Raises:
        SpecError: unknown name, unreadable file, malformed content, inconsistent shape.
    """
    if isinstance(ref, ModelSpec):
        return ref
    if not isinstance(ref, str) or not ref:
        raise SpecError(f"model={ref!r} must be a preset name or a file path", field="model",
                        value=ref, allowed=list_profiles("models"))
    preset = _preset("models", ref)
    if preset is not None:
        return _build(ModelSpec, read_yaml(preset, "model"), "model")
    path = _as_path(ref)
    if path is None:
        raise _unknown("models", ref)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise SpecError(f"directory {ref!r} has no config.json", field="model", value=ref)
    if path.suffix.lower() == ".json":
        data = parse_json(_read_text(path, "model"), "model file", str(path))
        if isinstance(data, dict) and "num_layers" in data and "hidden_size" in data:
            return _build(ModelSpec, data, "model")  # a paraplan model written as JSON
        name = path.parent.name if path.name == "config.json" else path.stem
        return model_from_hf_config(data, name=name or "hf-model")
    data = read_yaml(path, "model")
    data.setdefault("name", path.stem)
    return _build(ModelSpec, data, "model")


def _region_links_from_csv(path: Path) -> list[dict[str, Any]]:
    text = _read_text(path, "region_links_csv", MAX_TABLE_BYTES)
    rows = []
    try:
        for row in csv.DictReader(text.splitlines()):
            rows.append({
                "a": row["region_a"], "b": row["region_b"],
                "latency_ms": float(row["latency_ms"]),
                "bandwidth_Gbps": float(row["bandwidth_gbps"]),
            })
    except (KeyError, ValueError, TypeError) as exc:
        raise SpecError(
            f"region_links_csv {str(path)!r} needs columns region_a, region_b, latency_ms, "
            f"bandwidth_gbps with numbers ({exc})", field="region_links_csv", value=str(path),
        ) from None
    return rows


def cluster_from_dict(data: dict[str, Any], base_dir: Path | None = None) -> ClusterSpec:
    """Resolve names (GPUs, links, region CSVs) in a cluster mapping and validate it."""
    data = dict(data)
    data_keys = set(data)
    if "node" in data:
        if "node_groups" in data:
            raise SpecError("cluster: give `node` (one node type) or `node_groups`, not both",
                            field="cluster.node")
        node = data.pop("node")
        if not isinstance(node, dict):
            raise SpecError("cluster.node must be a mapping", field="cluster.node", value=node)
        node = dict(node)
        if "num_nodes" in data:
            node["num_nodes"] = data.pop("num_nodes")
        data["node_groups"] = [node]
    groups = data.get("node_groups")
    if not isinstance(groups, list) or not groups:
        raise SpecError("cluster needs `node` or a non-empty `node_groups` list",
                        field="cluster.node_groups", value=groups)
    resolved = []
    single = "node" in data_keys
    for i, group in enumerate(groups):
        if not isinstance(group, dict):
            raise SpecError(f"cluster.node_groups[{i}] must be a mapping",
                            field=f"cluster.node_groups[{i}]", value=group)
        group = dict(group)
        at = "cluster.node" if single else f"cluster.node_groups[{i}]"
        if "gpu" in group:
            group["gpu"] = load_gpu(group["gpu"], f"{at}.gpu")
        if "gpu_power_limit_W" in group:
            group["gpu"] = _power_limited(group.get("gpu"), group.pop("gpu_power_limit_W"), at)
        for key in ("intra_node_link", "inter_node_link", "host_link"):
            if group.get(key) is not None:
                group[key] = load_link(group[key], f"{at}.{key}")
        resolved.append(group)
    data["node_groups"] = resolved
    if data.get("intra_region_link") is not None:
        data["intra_region_link"] = load_link(data["intra_region_link"],
                                              "cluster.intra_region_link")
    if "region_links_csv" in data:
        ref = data.pop("region_links_csv")
        if not isinstance(ref, str):
            raise SpecError("cluster.region_links_csv must be a file name",
                            field="cluster.region_links_csv", value=ref)
        candidates = [profiles_dir() / "clusters" / ref]
        if base_dir is not None:
            candidates.insert(0, base_dir / ref)
        path = next((c for c in candidates if _as_path(str(c)) and c.is_file()), None)
        if path is None:
            raise SpecError(f"region_links_csv {ref!r} not found", field="cluster.region_links_csv",
                            value=ref)
        wanted = {g.get("region", "default") for g in resolved}
        extra = [r for r in _region_links_from_csv(path) if r["a"] in wanted and r["b"] in wanted]
        data["region_links"] = list(data.get("region_links") or []) + extra
    return _build(ClusterSpec, data, "cluster")


def load_cluster(ref: str | ClusterSpec, nodes: int | None = None) -> ClusterSpec:
    """A cluster by preset name or YAML path; ``nodes`` sets the node count (one node type)."""
    if isinstance(ref, ClusterSpec):
        cluster = ref
    else:
        if not isinstance(ref, str) or not ref:
            raise SpecError(f"cluster={ref!r} must be a preset name or a YAML path",
                            field="cluster", value=ref, allowed=list_profiles("clusters"))
        preset = _preset("clusters", ref)
        if preset is not None:
            path = preset
        else:
            path = _as_path(ref)
            if path is None or not path.is_file():
                raise _unknown("clusters", ref)
        cluster = cluster_from_dict(read_yaml(path, "cluster"), base_dir=path.parent)
    if nodes is not None:
        cluster = cluster.with_nodes(nodes)
    return cluster
