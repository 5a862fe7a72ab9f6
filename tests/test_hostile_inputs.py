"""Hostile input through the real entry point: every malformed input is exit code 2 with one
line naming the field and value, never a traceback, a hang, unbounded memory or a non-finite
number in JSON (issue 16). Hand-written cases run the console script in a subprocess under a
memory limit; the generated corpus calls ``paraplan.cli.app.main`` in-process (the same code
the console script runs) so hundreds of inputs fit in the suite's time."""

from __future__ import annotations

import io
import json
import os
import resource
import string
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan.cli.app import main

CMD = [sys.executable, "-m", "paraplan"]
MEMORY_LIMIT = 2 * 2**30
SIM = ("simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "8",
       "--seq-len", "2048")
LLAMA = (Path(__file__).resolve().parents[1] / "paraplan" / "hardware_profiles" / "models"
         / "llama3-8b.yaml").read_text()
BOMB = ("a: &a [1,1,1,1,1,1,1,1,1]\n"
        + "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n"
                  for p, n in zip("abcdefgh", "bcdefghi", strict=True))
        + "num_layers: *i\n")
NODE = ("name: x\nnode:\n  gpu: h100-sxm\n  gpus_per_node: 8\n  intra_node_link: {LINK}\n"
        "  inter_node_link: ib-ndr\n  nics_per_node: 8\n  num_nodes: 1\n")


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=env, preexec_fn=_limit_memory)


FILES = {
    "bomb.yaml": BOMB,
    "cycle.yaml": "a: &a [1, *a]\nnum_layers: *a\n",
    "deep.yaml": "[" * 100_000 + "]" * 100_000,
    "deep.json": "[" * 100_000 + "]" * 100_000,
    "bigint.yaml": "num_layers: " + "9" * 5000 + "\n",
    "hexint.yaml": "num_layers: 0x" + "f" * 5000 + "\n",
    "dots.toml": "[parallelism]\n" + ".".join(["a"] * 5000) + " = 1\n",
    "dup.yaml": LLAMA + "\nnum_layers: 4\n",
    "bool.yaml": LLAMA.replace("num_layers: 32", "num_layers: true"),
    "tag.yaml": "num_layers: !!python/object/apply:os.system ['true']\n",
    "hf0.json": json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                            "num_attention_heads": 0, "head_dim": 16,
                            "intermediate_size": 128, "vocab_size": 100}),
    "hfmoe.json": json.dumps({"model_type": "qwen2_moe", "num_hidden_layers": 2,
                              "hidden_size": 64, "num_attention_heads": 4,
                              "num_key_value_heads": 4, "intermediate_size": 128,
                              "moe_intermediate_size": 32, "num_experts": 4,
                              "shared_expert_intermediate_size": [1],
                              "num_experts_per_tok": 2, "vocab_size": 100}),
    "list.json": "[1, 2]",
    "big.yaml": ("name: big-gpt\nnum_layers: 96\nhidden_size: 12288\nnum_attention_heads: 96\n"
                 "ffn_hidden_size: 49152\nvocab_size: 50304\nactivation: gelu\n"
                 "norm: layernorm\nposition_embedding: learned\n"
                 "max_position_embeddings: 2048\nuse_bias: true\n"
                 "tie_word_embeddings: false\n"),
    "regions.yaml": ("name: two\nnode_groups:\n"
                     "  - {name: a, gpu: a100-sxm-80gb, gpus_per_node: 8, num_nodes: 1, "
                     "intra_node_link: nvlink3, inter_node_link: ib-hdr, region: A}\n"
                     "  - {name: b, gpu: a100-sxm-80gb, gpus_per_node: 8, num_nodes: 1, "
                     "intra_node_link: nvlink3, inter_node_link: ib-hdr, region: B}\n"
                     "region_links:\n"
                     "  - {a: A, b: B, latency_ms: 10, bandwidth_Gbps: 10}\n"
                     "  - {a: B, b: A, latency_ms: 80, bandwidth_Gbps: 1}\n"),
    "inf.yaml": NODE.replace("{LINK}", "{name: nv, kind: nvlink, bandwidth_GBps: 450, "
                                       "latency_us: .inf}"),
    "huge.yaml": NODE.replace("{LINK}", "{name: nv, kind: nvlink, bandwidth_GBps: 450, "
                                        "latency_us: 1.0e+300}"),
    "duplink.yaml": NODE.replace("{LINK}", "{name: nv, kind: nvlink, bandwidth_GBps: 450, "
                                           "latency_us: 5, latency_us: 9}"),
}

CASES = [
    (("describe", "--model", "bomb.yaml"), "aliases are followed"),
    (("describe", "--model", "cycle.yaml"), "anchor inside its own value"),
    (("describe", "--model", "deep.yaml"), "64 deep"),
    (("describe", "--model", "deep.json"), "64 deep"),
    (("describe", "--model", "bigint.yaml"), "integer of more than 4,300"),
    (("describe", "--model", "hexint.yaml"), "integer of more than 4,300"),
    ((*SIM, "--plan", "dots.toml"), "64 deep"),
    (("describe", "--model", "/dev/zero"), "not a regular file"),
    (("describe", "--model", "A" * 300), "unknown model"),
    (("describe", "--model", "hf0.json"), "num_attention_heads=0"),
    (("describe", "--model", "hfmoe.json"), "shared_expert_intermediate_size"),
    (("describe", "--model", "dup.yaml"), "'num_layers' twice"),
    (("describe", "--model", "bool.yaml"), "num_layers=True holds a boolean"),
    (("describe", "--model", "tag.yaml"), "tags are refused"),
    (("describe", "--cluster", "inf.yaml"), "latency_us=inf"),
    (("describe", "--cluster", "huge.yaml"), "latency_us"),
    (("describe", "--cluster", "duplink.yaml"), "'latency_us' twice"),
    (("describe", "--cluster", "dgx-h100", "--nodes", "10000000"), "--nodes"),
    (("describe", "--cluster", "regions.yaml"), "twice"),
    (("run", "tp=1", "--nproc", "2", "--model", "big.yaml", "--seq-len", "256"),
     "of this machine's"),
    (("run", "tp=1,compress=powersgd,rank=4", "--nproc", "2"), "not something the executor"),
    (("run", "tp=1", "--nproc", "2", "--cluster", "bogus-cluster"), "unknown cluster"),
    (("calibrate", "--out", "x.yaml", "--name", ""), "--name"),
    (("validate-executor", "--save-profile", "no/such/dir/p.yaml"), "does not exist"),
    ((*SIM, "--plan", "list.json"), "not a list"),
    ((*SIM, "--plan", "tp=2,tp=4"), "tp twice"),
    ((*SIM, "--plan", ","), "plan is empty"),
    ((*SIM, "--plan", "{" * 5000), "64 deep"),
    ((*SIM, "--plan", "tp=8", "--mtbf-hours", "inf", "--checkpoint-write-s", "60",
      "--restart-s", "60"), "--mtbf-hours=inf"),
    ((*SIM, "--plan", "tp=8", "--mtbf-hours", "1e-300", "--checkpoint-write-s", "60",
      "--restart-s", "60"), "mtbf_hours=1e-300"),
    ((*SIM, "--plan", "tp=8", "--mtbf-hours", "100", "--storage-GBps", "1e-300"),
     "--storage-GBps"),
    (("best", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "8",
      "--seq-len", "2048", "--seed", "-1"), "--seed"),
    (("pareto", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "8",
      "--seq-len", "2048", "--nodes", ""), "--nodes"),
    (("export", "tp=1", "--to", "json", "--model", "llama3-8b", "--cluster", "dgx-h100",
      "--global-batch", "8", "--seq-len", "2048", "--out", ""), "--out is empty"),
    (("export", "tp=1", "--to", "json", "--model", "llama3-8b", "--cluster", "dgx-h100",
      "--global-batch", "8", "--seq-len", "2048", "--out", "no/such/dir/p.json"),
     "does not exist"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    for name, text in FILES.items():
        (root / name).write_text(text)
    return root


# Inputs that could eat memory or time run as the console script under RLIMIT_AS; the rest
# call the same entry function in-process (faster on a 2-core machine).
RISKY = {"bomb.yaml", "cycle.yaml", "deep.yaml", "deep.json", "bigint.yaml", "hexint.yaml",
         "dots.toml", "/dev/zero",
         "{" * 5000}


@pytest.mark.parametrize(("args", "needle"), CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_hostile_input_is_one_line_and_exit_2(workdir, args, needle, monkeypatch):
    if RISKY & set(args):
        res = cli(*args, cwd=workdir)
        code, err = res.returncode, res.stderr
    else:
        monkeypatch.chdir(workdir)
        code, _, err = run_main(list(args))
    lines = err.strip().splitlines()
    assert code == 2, err[-500:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-500:]
    assert needle in lines[0] and len(lines[0]) < 1000
    assert "Traceback" not in err


def test_output_targets_that_are_not_regular_files_are_refused(tmp_path):
    (tmp_path / "real.json").write_text("keep")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    os.mkfifo(tmp_path / "fifo.json")
    args = ("export", "tp=1", "--to", "json", "--model", "llama3-8b", "--cluster", "dgx-h100",
            "--global-batch", "8", "--seq-len", "2048", "--out")
    for name in ("link.json", "fifo.json"):
        res = cli(*args, name, cwd=tmp_path)
        assert res.returncode == 2 and "regular file" in res.stderr, res.stderr
    assert (tmp_path / "real.json").read_text() == "keep"
    private = tmp_path / "private.json"
    private.write_text("old")
    private.chmod(0o600)
    res = cli(*args, "private.json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert private.stat().st_mode & 0o777 == 0o600 and "paraplan-plan" in private.read_text()


def test_published_csv_rows_are_skipped_one_by_one(tmp_path):
    import csv

    src = Path(__file__).resolve().parents[1] / "paraplan" / "validate" / "data"
    rows = list(csv.DictReader((src / "published_throughput.csv").open()))
    good = rows[0]
    bad = [dict(good, **{k: v}) for k, v in (("tp", "nan"), ("num_gpus", "0"), ("tp", "0"),
                                             ("micro_batch", "inf"), ("layers", "x" * 200_000))]
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(good))
        writer.writeheader()
        writer.writerows([good, *bad])
    res = cli("validate-published", str(path), "--format", "json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["rows"][0]["status"] == "ok"
    assert [r["status"] for r in out["rows"][1:]] == ["skipped"] * 5
    assert "tp='0'" in out["rows"][3]["reason"]


# ---- generated corpus (in-process) ----------------------------------------------------------

def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> None:
    code, out, err = run_main(argv)
    assert code in (0, 2), (argv, err[-400:])
    assert "Traceback" not in err and "internal error" not in err, (argv, err[-400:])
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err[-400:])
    if "--format" in argv and code == 0 and out.strip().startswith(("{", "[")):
        assert "NaN" not in out and "Infinity" not in out
        json.loads(out)


TEXT = st.text(string.printable + "\u00e9\u2028\x00", max_size=60)
NUMBER = st.one_of(st.integers(-10**30, 10**30).map(str), st.floats().map(repr),
                   st.sampled_from(["inf", "-inf", "nan", "1e309", "0", "-1", "", " ", "1e-300",
                                    "true", "0x10", "1_000", "９"]))
PLAN_KEYS = st.sampled_from(["tp", "pp", "cp", "ep", "mbs", "zero", "vpp", "rc", "schedule",
                             "layers", "sp", "dp", "h", "compress", "bogus"])
PLAN = st.one_of(
    st.lists(st.tuples(PLAN_KEYS, NUMBER | TEXT), max_size=5).map(
        lambda items: ",".join(f"{k}={v}" for k, v in items)),
    TEXT,
)
SIM_FLAGS = st.lists(st.tuples(st.sampled_from(["--global-batch", "--seq-len", "--nodes",
                                                 "--precision", "--mtbf-hours",
                                                 "--checkpoint-write-s", "--restart-s",
                                                 "--storage-GBps", "--preemption-rate",
                                                 "--trainer"]), NUMBER | TEXT), max_size=4)


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(plan=PLAN, flags=SIM_FLAGS, fmt=st.sampled_from(["table", "json"]))
def test_generated_simulate_inputs(plan, flags, fmt):
    argv = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch",
            "16", "--seq-len", "2048", "--plan", plan, "--format", fmt]
    for flag, value in flags:
        argv += [flag, value]
    check(argv)


def _containers(children: st.SearchStrategy) -> st.SearchStrategy:
    keys = st.sampled_from(["num_layers", "hidden_size", "node", "gpu", "name", "vocab_size",
                            "num_attention_heads", "node_groups", "gpus_per_node",
                            "bandwidth_GBps"])
    return st.lists(children, max_size=3) | st.dictionaries(keys, children, max_size=4)


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["--model", "--cluster"]),
       text=st.one_of(TEXT, st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                      st.recursive(st.one_of(st.integers(-10**6, 10**6), st.floats(), TEXT,
                                             st.booleans(), st.none()),
                                   _containers, max_leaves=12).map(json.dumps)),
       suffix=st.sampled_from([".yaml", ".json"]))
def test_generated_spec_files(tmp_path_factory, kind, text, suffix):
    path = tmp_path_factory.mktemp("gen") / f"spec{suffix}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    check(["describe", kind, str(path), "--format", "json"])


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(cmd=st.sampled_from(["best", "pareto", "explain", "export"]), plan=PLAN,
       value=NUMBER | TEXT,
       flag=st.sampled_from(["--global-batch", "--seq-len", "--nodes", "--top", "--fix",
                             "--trainer", "--precision", "--to", "--seed", "--limit"]))
def test_generated_other_commands(cmd, plan, value, flag):
    base = ["--model", "gpt3-125m", "--cluster", "dgx-h100", "--global-batch", "16",
            "--seq-len", "512"]
    argv = {"best": ["best", *base, "--top", "2"],
            "pareto": ["pareto", *base, "--nodes", "1,2", "--limit", "3"],
            "explain": ["explain", *base, "--plan", plan],
            "export": ["export", plan, "--to", "json", *base]}[cmd]
    check([*argv, flag, value, "--format", "json"] if cmd != "export" else [*argv, flag, value])


MODEL_FIELDS = ["num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                "ffn_hidden_size", "vocab_size", "max_position_embeddings"]
LINK_FIELDS = ["bandwidth_GBps", "latency_us", "efficiency"]
HOSTILE = st.sampled_from([True, False, float("inf"), float("-inf"), float("nan"), -1, 0,
                           1e300, 10**400, "x", [1], {"a": 1}, None])


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(MODEL_FIELDS), value=HOSTILE,
       as_json=st.booleans(), duplicate=st.booleans())
def test_generated_model_mutations_are_refused_by_name(tmp_path_factory, field, value,
                                                       as_json, duplicate):
    # A real model with one field set to a value no model can have (a boolean, a non-finite
    # or absurd number, a string, a container) or given twice: always exit 2 naming it,
    # never a silent reading (num_layers: true was a 1-layer model).
    import yaml

    data = yaml.safe_load(LLAMA)
    if value is None and field not in ("num_kv_heads", "max_position_embeddings"):
        value = "null-is-not-a-size"
    data[field] = value
    duplicate = duplicate and not as_json  # json.dumps cannot write a key twice
    path = tmp_path_factory.mktemp("mut") / ("m.json" if as_json else "m.yaml")
    if as_json:
        text = json.dumps(data)  # inf/nan become JSON's non-standard Infinity/NaN
    else:
        text = yaml.safe_dump(data)
        if duplicate:
            text += f"{field}: 8\n"
    path.write_text(text)
    code, out, err = run_main(["describe", "--model", str(path), "--format", "json"])
    if value is None and not duplicate:
        assert code == 0, err  # an optional field left empty is fine
        return
    assert code == 2, (field, value, out[:300])
    assert err.count("\n") == 1 and (field in err or "Infinity" in err or "NaN" in err), err


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(LINK_FIELDS), value=HOSTILE.filter(lambda v: v is not None))
def test_generated_link_mutations_are_refused_by_name(tmp_path_factory, field, value):
    import yaml

    link = {"name": "nv", "kind": "nvlink", "bandwidth_GBps": 450, "latency_us": 5,
            "efficiency": 0.8, field: value}
    data = yaml.safe_load(NODE.replace("{LINK}", "X"))
    data["node"]["intra_node_link"] = link
    path = tmp_path_factory.mktemp("link") / "c.json"
    path.write_text(json.dumps(data))
    # Through the cluster loader, a JSON file is read as YAML (JSON is YAML): NaN/Infinity
    # tokens are not YAML numbers, so those arrive as strings and fail as such.
    code, out, err = run_main(["describe", "--cluster", str(path), "--format", "json"])
    if field == "latency_us" and value in (0, False):
        assert code == 2 and "boolean" in err if value is False else code == 0, err
        return
    assert code == 2, (field, value, out[:300])
    assert err.count("\n") == 1 and field in err, err


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(cmd=st.sampled_from(["profiles", "validate-dtfm", "validate-recipes", "run",
                            "calibrate", "validate-executor", "validate-published"]),
       plan=PLAN, value=NUMBER | TEXT, csv_text=TEXT)
def test_generated_remaining_commands(tmp_path_factory, cmd, plan, value, csv_text):
    # Every other subcommand with hostile values, kept cheap: the executor commands get an
    # option that is always refused before any rank starts (64 ranks on this machine, an
    # output that is not YAML, 3 ranks for validate-executor), so what runs is their input
    # checking, in the order a user meets it.
    tmp = tmp_path_factory.mktemp("cmd")
    path = tmp / "runs.csv"
    path.write_text("source_id,measured_metric\n" + csv_text, encoding="utf-8",
                    errors="surrogatepass")
    argv = {"profiles": ["profiles", "--format", value],
            "validate-dtfm": ["validate-dtfm", "--scenario", value, "--format", "json"],
            "validate-recipes": ["validate-recipes", "--source", value, "--format", "json"],
            "run": ["run", plan, "--nproc", "64", "--steps", "1", "--global-batch", value],
            "calibrate": ["calibrate", "--quick", "--out", str(tmp / f"{value}.txt"),
                          "--name", value],
            "validate-executor": ["validate-executor", "--nproc", "3", "--cluster", value],
            "validate-published": ["validate-published", str(path), "--format", "json"],
            }[cmd]
    check(argv)
