"""The launcher: real worker processes (gloo, CPU), results, crashes, hangs, no orphans."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from paraplan.executor.launch import ExecutorError, launch, qualified_name  # noqa: E402
from tests import executor_workers as workers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _pids(pid_dir: Path, n: int) -> list[int]:
    return [int((pid_dir / f"{r}.pid").read_text()) for r in range(n)
            if (pid_dir / f"{r}.pid").is_file()]


def _assert_gone(pids: list[int]) -> None:
    assert pids, "workers never published their PIDs"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_two_ranks_all_reduce_ordered_by_rank():
    out = launch(workers.all_reduce_worker, 2, {"tag": "x"}, timeout_s=120)
    assert [r["rank"] for r in out] == [0, 1]
    assert all(r["sum"] == [3.0] * 4 and r["world_size"] == 2 for r in out)
    assert all(r["threads"] == 1 and r["tag"] == "x" for r in out)
    _assert_gone([r["pid"] for r in out])


def test_cpu_workers_get_a_caching_allocator_unless_the_user_chose(monkeypatch):
    from paraplan.executor.launch import CPU_ALLOCATOR_ENV

    out = launch(workers.all_reduce_worker, 2, {}, timeout_s=120, backend="gloo")
    assert all(r["malloc_env"] == CPU_ALLOCATOR_ENV for r in out)
    assert int(CPU_ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]) == 32 * 2**20  # glibc's ceiling
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4096")
    out = launch(workers.all_reduce_worker, 2, {}, timeout_s=120, backend="gloo")
    assert all(r["malloc_env"]["MALLOC_TRIM_THRESHOLD_"] == "4096" for r in out)


def test_world_size_four_over_tcp():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = launch("tests.executor_workers:all_reduce_worker", 4, {"num_threads": 1},
                 timeout_s=120, backend="gloo", master_port=port)
    assert [r["rank"] for r in out] == [0, 1, 2, 3]
    assert all(r["sum"] == [10.0] * 4 for r in out)


def test_raising_rank_is_reported_quickly(tmp_path):
    start = time.monotonic()
    with pytest.raises(ExecutorError) as info:
        launch(workers.raise_on_rank_worker, 2, {"bad": 1, "pid_dir": str(tmp_path)},
               timeout_s=120)
    assert time.monotonic() - start < 30  # startup plus a prompt report, not the timeout
    err = info.value
    assert err.kind == "crash" and err.rank == 1
    assert "rank 1" in str(err) and "ValueError" in str(err) and "boom" in str(err)
    assert "raise ValueError" in str(err)  # the traceback tail
    _assert_gone(_pids(tmp_path, 2))


def test_hung_ranks_time_out_and_are_killed(tmp_path):
    # Rank 2 must start (torch import, process group) and return inside the timeout even on
    # a loaded 2-core machine, where 5 s was not always enough for it.
    start = time.monotonic()
    with pytest.raises(ExecutorError) as info:
        launch(workers.hang_worker, 3, {"pid_dir": str(tmp_path)}, timeout_s=20)
    assert time.monotonic() - start < 60  # the timeout plus reaping, not a hang
    err = info.value
    assert err.kind == "timeout" and err.rank == [0, 1]
    assert "[0, 1]" in str(err) and "timeout" in str(err)
    pids = _pids(tmp_path, 3)
    assert len(pids) == 3
    _assert_gone(pids)


def test_hard_exit_is_a_crash_with_its_exit_code(tmp_path):
    with pytest.raises(ExecutorError) as info:
        launch(workers.hard_exit_worker, 2, {"bad": 0, "pid_dir": str(tmp_path)},
               timeout_s=120)
    err = info.value
    assert err.kind == "crash" and err.rank == 0 and err.exitcodes[0] == 3
    assert "rank 0 exited with code 3" in str(err) and "about to exit hard" in str(err)
    _assert_gone(_pids(tmp_path, 2))


def test_unimportable_worker_is_refused():
    with pytest.raises(ValueError, match="top-level"):
        qualified_name(lambda r, w, c: {})


def test_run_under_torchrun():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port), "-m",
           "tests.executor_workers"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    assert [r["rank"] for r in out] == [0, 1]
    assert all(r["sum"] == [3.0] * 4 and r["tag"] == "torchrun" for r in out)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan's zombie may wait for a reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_ranks_never_outlive_their_launcher(tmp_path, sig):
    # A launcher killed by any signal (SIGKILL cannot be caught) takes its ranks with it:
    # the kernel's parent-death signal plus each rank's parent watch; SIGTERM also runs the
    # launcher's own cleanup (ranks killed, temporary directory removed).
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from tests import executor_workers "
            "as w; from paraplan.executor.launch import launch; "
            "launch(w.hang_worker, 2, {'pid_dir': sys.argv[1]}, timeout_s=120)")
    root = str(Path(__file__).resolve().parents[1])
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), root],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(_pids(tmp_path, 2)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = _pids(tmp_path, 2)
    assert len(pids) == 2, parent.stderr.read().decode() if parent.poll() is not None else ""
    parent.send_signal(sig)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), f"ranks {pids} outlived their launcher"
