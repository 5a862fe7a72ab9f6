"""Every bundled profile loads, cites sources, and holds plausible vendor numbers."""

from __future__ import annotations

import pytest

from paraplan.specs import list_profiles, load_cluster, load_gpu, load_link
from paraplan.specs.loaders import profiles_dir, read_yaml


@pytest.mark.parametrize("kind", ["gpus", "links", "clusters", "models"])
def test_names_match_file_stems_and_cite_sources(kind):
    for name in list_profiles(kind):
        data = read_yaml(profiles_dir() / kind / f"{name}.yaml", kind)
        assert data["name"] == name
        assert data.get("sources"), f"{kind}/{name} cites no source"


def test_counts_meet_the_catalogue_promise():
    assert len(list_profiles("gpus")) >= 10
    assert len(list_profiles("links")) >= 8
    assert len(list_profiles("models")) >= 15
    clusters = set(list_profiles("clusters"))
    for name in ("dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "dgx-b200",
                 "aws-p3.16xlarge", "aws-p3.2xlarge", "pcie-rtx4090x8", "dtfm-datacenter",
                 "dtfm-spot", "dtfm-multi-university", "dtfm-regional", "dtfm-worldwide"):
        assert name in clusters


@pytest.mark.parametrize("name", list_profiles("gpus"))
def test_gpu_numbers_plausible(name):
    gpu = load_gpu(name)
    peaks = gpu.peak_tflops
    sixteen = peaks.get("bf16", peaks.get("fp16"))
    assert sixteen and sixteen >= peaks.get("fp32", 0)
    assert 0.3 <= gpu.matmul_efficiency <= 0.95
    assert 10 <= gpu.memory_GiB <= 300
    if gpu.scale_up_link:
        load_link(gpu.scale_up_link)


def test_vendor_figures_from_hardware_facts():
    h100 = load_gpu("h100-sxm")
    assert h100.peak_tflops["bf16"] == 989 and h100.memory_bandwidth_GBps == 3350
    assert load_gpu("a100-sxm-80gb").peak_tflops["bf16"] == 312
    assert load_gpu("rtx4090").peak_tflops["bf16"] == 165.2  # FP32-accumulate rate
    assert load_link("nvlink4").bandwidth_GBps == 450  # one direction of "900 GB/s"
    assert load_link("ib-ndr").bandwidth_GBps == 50


@pytest.mark.parametrize("name", list_profiles("clusters"))
def test_every_cluster_loads(name):
    c = load_cluster(name)
    assert c.num_gpus >= 1


def test_dtfm_scenarios_have_64_v100():
    for name in ("dtfm-datacenter", "dtfm-spot", "dtfm-multi-university", "dtfm-regional",
                 "dtfm-worldwide"):
        c = load_cluster(name)
        assert c.num_gpus == 64 and c.gpu_types == ["v100-sxm2-16gb"], name
    assert len(load_cluster("dtfm-worldwide").regions) == 8
    assert len(load_cluster("dtfm-worldwide").region_links) == 28  # all pairs of 8


def test_nodes_override():
    assert load_cluster("dgx-h100", nodes=32).num_gpus == 256
