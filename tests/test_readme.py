"""The README's YAML examples are real: each loads (users copy them verbatim)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from paraplan import TrainingSpec, load_cluster, parse_plan, simulate
from paraplan.specs import load_gpu, load_model

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```yaml\n(.*?)```", README, re.S)


def test_readme_has_yaml_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("block", BLOCKS)
def test_readme_yaml_example_loads(block, tmp_path):
    path = tmp_path / "example.yaml"
    path.write_text(block)
    if "global_batches" in block:  # a sweep grid
        from paraplan.fleet import expand, load_grid

        assert expand(load_grid(str(path)))
    elif "node" in block:
        cluster = load_cluster(str(path))
        # A cluster from the README runs through the simulator.
        rep = simulate(load_model("llama3-8b"), cluster,
                       TrainingSpec(global_batch_size=cluster.num_gpus * 2, seq_len=2048,
                                    precision="fp16"),
                       parse_plan("tp=1,pp=1,zero=3,mbs=1,rc=full"))
        assert rep.step_time_s is not None, rep.reasons
    else:
        assert load_gpu(str(path)).peak_tflops
