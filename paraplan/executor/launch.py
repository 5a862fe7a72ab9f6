"""Run a function in ``nproc`` local ``torch.distributed`` processes, robustly.

``launch(fn, nproc, config)`` starts ``nproc`` fresh Python processes (``subprocess``, the
moral equivalent of the "spawn" start method: nothing is forked), each of which

1. sets ``torch.set_num_threads(num_threads)`` (and ``OMP_NUM_THREADS``); ``num_threads``
   defaults to ``config.get("num_threads", 1)``,
2. joins a process group: backend ``"gloo"`` on CPU, ``"nccl"`` when ``backend`` is None and
   CUDA has a device per rank (rank r uses ``cuda:r``); rendezvous through a FileStore in a
   private temp dir, or ``tcp://127.0.0.1:master_port`` when a port is given,
3. calls ``fn(rank, world_size, config)``, which returns a dict of plain data and tensors,
4. writes the result atomically to the temp dir (``torch.save``; the parent reads it back
   with ``torch.load(weights_only=True)``, so nothing but data is ever unpickled), destroys
   the process group and exits. The run's spec and any error go through JSON.

``fn`` must be importable by qualified name in a fresh interpreter: a top-level function of an
importable module (not ``__main__``, not a lambda or closure); ``"package.module:function"``
strings are accepted too. The parent's ``sys.path`` is passed to the workers.

Failure handling: the first rank to fail (an exception, a non-zero exit, a signal) ends the run
at once with ``ExecutorError(kind="crash")`` naming the rank, the exception type, message and
traceback tail (or the exit code and output tail); ranks still running after ``timeout_s``
seconds end it with ``ExecutorError(kind="timeout")`` naming them. Either way every worker is
killed (SIGKILL to its session, so its children die too) and reaped before the error is raised.

``run_under_torchrun(fn, config)`` runs the same ``fn`` in a process started by ``torchrun``.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from paraplan.executor.lifecycle import die_with_parent, sigterm_as_interrupt

WorkerFn = Callable[[int, int, dict], dict]
_BOOT = ("import sys; from paraplan.executor.launch import _worker_main; "
         "_worker_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))")
_POLL_S = 0.02
_GRACE_S = 0.3  # after a first failure, let near-simultaneous failures land (earliest wins)
_TAIL_LINES = 20
# glibc malloc settings for CPU (gloo) workers: serve tensors up to 32 MiB (glibc's ceiling
# for the mmap threshold on 64-bit) from the heap and never hand freed heap memory back to
# the kernel. A freed activation is then reused by the next micro-batch, as the CUDA caching
# allocator does on GPUs, instead of being unmapped and faulted in again page by page (first
# touch of fresh pages costs ~1 ns/byte in a VM, and PyTorch's CPU tuning guide recommends a
# caching allocator, jemalloc or tcmalloc, for the same reason). A value the user already set
# wins; other C libraries ignore these variables.
CPU_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024),
                     "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


class ExecutorError(RuntimeError):
    """A launched run failed. ``rank``: the failing rank (crash) or the ranks that did not
    finish (timeout); ``kind``: ``"crash"`` or ``"timeout"``; ``exitcodes``: rank -> code of
    the ranks that had exited (negative = killed by that signal)."""

    def __init__(self, message: str, *, rank: int | list[int],
                 kind: Literal["crash", "timeout"],
                 exitcodes: dict[int, int | None] | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.kind = kind
        self.exitcodes = dict(exitcodes or {})


def qualified_name(fn: WorkerFn | str) -> str:
    """``"module:qualname"`` of a top-level function; ValueError if a fresh interpreter could
    not import it (``__main__``, lambdas, nested functions)."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(f"worker {fn!r} must be 'package.module:function'")
        return fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise ValueError(
            f"worker {qualname or fn!r} (module {module!r}) must be a top-level function of an "
            "importable module: workers run in fresh interpreters that import it by name")
    return f"{module}:{qualname}"


def _resolve(target: str) -> WorkerFn:
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def default_backend(nproc: int) -> str:
    """``"nccl"`` when CUDA has at least ``nproc`` devices, else ``"gloo"``."""
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= nproc
    return "nccl" if cuda else "gloo"


def _dump_atomic(obj: Any, path: Path) -> None:
    """Write ``obj`` atomically: JSON for ``*.json``, else ``torch.save`` (data only)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    if path.suffix == ".json":
        tmp.write_text(json.dumps(obj), encoding="utf-8")
    else:
        import torch

        torch.save(obj, tmp)
    os.replace(tmp, path)


def _load_result(path: Path) -> Any:
    """A worker's result: tensors and plain data only (``weights_only=True``)."""
    import torch

    return torch.load(path, weights_only=True)


def _threads(config: Any, num_threads: int | None = None) -> int:
    """Torch threads per rank: ``num_threads``, else ``config["num_threads"]``, else 1."""
    if num_threads is None:
        num_threads = config.get("num_threads", 1) if isinstance(config, dict) else 1
    return max(1, int(num_threads or 1))


def _init_group(backend: str, rank: int, world_size: int, local_rank: int,
                init_method: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _worker_main(workdir: str, rank: int, parent_pid: int | None = None) -> None:
    """Body of one launched worker process (see the module docstring)."""
    if parent_pid is not None:
        die_with_parent(parent_pid)
    root = Path(workdir)
    try:
        spec = json.loads((root / "spec.json").read_text(encoding="utf-8"))
        import torch
        import torch.distributed as dist

        torch.set_num_threads(spec["num_threads"])
        fn = _resolve(spec["target"])
        _init_group(spec["backend"], rank, spec["world_size"], rank, spec["init_method"],
                    spec["pg_timeout_s"])
        result = fn(rank, spec["world_size"], spec["config"])
        _dump_atomic(result, root / f"result{rank}.pt")
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
        frames = traceback.extract_tb(exc.__traceback__)
        inner = frames[-1].filename if frames else ""
        record = {"type": type(exc).__name__, "message": str(exc),
                  "traceback": traceback.format_exc(), "time": time.time(),
                  "in_distributed": f"torch{os.sep}distributed" in inner}
        try:
            _dump_atomic(record, root / f"error{rank}.json")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (slow, and it can hang in backend destructors)


def _tail(text: str, lines: int = _TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every worker's session (its children too), then reap each worker."""
    for p in procs:
        if p.poll() is None:
            try:
                if os.name == "posix":
                    os.killpg(p.pid, signal.SIGKILL)
                else:
                    p.kill()
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            p.kill()
            p.wait()


def _crash_error(root: Path, failed: dict[int, tuple[int, float]],
                 codes: dict[int, int | None]) -> ExecutorError:
    """The error for the root failure among ``failed`` (rank -> (exit code, time seen)).

    A rank that fails inside a ``torch.distributed`` call is usually reacting to a peer that
    died (closed connection), so such failures rank after the others; ties go to the earliest.
    """
    reports = []
    for rank, (code, seen) in failed.items():
        path = root / f"error{rank}.json"
        record = None
        if path.is_file():
            record = json.loads(path.read_text(encoding="utf-8"))
        secondary = bool(record and record.get("in_distributed"))
        reports.append((secondary, record["time"] if record else seen, rank, code, record))
    reports.sort(key=lambda r: r[:3])
    _, _, rank, code, record = reports[0]
    if record is not None:
        msg = (f"rank {rank} raised {record['type']}: {record['message']}\n"
               f"--- rank {rank} traceback (tail) ---\n{_tail(record['traceback'])}")
    else:
        how = (f"was killed by signal {signal.Signals(-code).name}" if code and code < 0
               and -code in signal.valid_signals() else f"exited with code {code}")
        log = root / f"rank{rank}.log"
        out = _tail(log.read_text(errors="replace")) if log.is_file() else ""
        msg = f"rank {rank} {how} without a Python exception"
        if out:
            msg += f"\n--- rank {rank} output (tail) ---\n{out}"
    others = [r[2] for r in reports[1:]]
    if others:
        msg += f"\n(ranks {others} failed after it, probably as a consequence)"
    return ExecutorError(msg, rank=rank, kind="crash", exitcodes=codes)


def launch(fn: WorkerFn | str, nproc: int, config: dict, *, timeout_s: float = 300,
           backend: str | None = None, master_port: int | None = None,
           num_threads: int | None = None) -> list[dict]:
    """Run ``fn(rank, nproc, config)`` in ``nproc`` local processes; results ordered by rank.

    Args:
        fn: top-level function (or ``"module:function"``) returning a dict of plain data
            and tensors.
        nproc: number of ranks (world size), >= 1.
        config: JSON-serialisable mapping passed to every rank.
        timeout_s: wall-clock limit for the whole run, seconds (process start included).
        backend: ``"gloo"``, ``"nccl"``, or None for ``default_backend(nproc)``.
        master_port: rendezvous on ``tcp://127.0.0.1:master_port``; None = a FileStore.
        num_threads: torch intra-op threads per rank; None = ``config.get("num_threads", 1)``
            (for workers such as ``train_worker`` that refuse unknown config keys, pass it
            here).

    Raises:
        ExecutorError: a rank failed (``kind="crash"``) or did not finish in time
            (``kind="timeout"``); all workers are dead and reaped by then.
        ValueError: ``fn`` is not importable by name or ``nproc`` < 1.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc={nproc!r} must be a positive integer")
    target = qualified_name(fn)
    backend = backend or default_backend(nproc)
    root = Path(tempfile.mkdtemp(prefix="paraplan-launch-"))
    init = (f"tcp://127.0.0.1:{master_port}" if master_port else f"file://{root / 'store'}")
    procs: list[subprocess.Popen] = []
    try:
        threads = _threads(config, num_threads)
        spec = {"target": target, "config": config, "backend": backend, "world_size": nproc,
                "init_method": init, "pg_timeout_s": timeout_s + 60.0, "num_threads": threads}
        _dump_atomic(spec, root / "spec.json")
        paths = [p or os.getcwd() for p in sys.path]
        for rank in range(nproc):
            env = {**(CPU_ALLOCATOR_ENV if backend == "gloo" else {}), **os.environ}
            env.update(RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port or 0),
                       OMP_NUM_THREADS=str(threads), PYTHONPATH=os.pathsep.join(paths))
            with open(root / f"rank{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", _BOOT, str(root), str(rank), str(os.getpid())],
                    env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=os.name == "posix"))
        with sigterm_as_interrupt():
            return _supervise(procs, root, time.monotonic() + timeout_s, timeout_s)
    finally:
        _kill(procs)
        shutil.rmtree(root, ignore_errors=True)


def _supervise(procs: list[subprocess.Popen], root: Path, deadline: float,
               timeout_s: float) -> list[dict]:
    """Wait for every worker; raise ExecutorError on the first failure or at the deadline."""
    codes: dict[int, int | None] = {}
    failed: dict[int, tuple[int, float]] = {}
    fail_at = None
    while True:
        now = time.monotonic()
        for rank, p in enumerate(procs):
            if rank in codes:
                continue
            code = p.poll()
            if code is not None:
                codes[rank] = code
                if code != 0 or not (root / f"result{rank}.pt").is_file():
                    failed[rank] = (code, time.time())
                    fail_at = fail_at or now
        if fail_at is not None and (len(codes) == len(procs) or now - fail_at >= _GRACE_S):
            _kill(procs)
            raise _crash_error(root, failed, codes)
        if len(codes) == len(procs):
            break
        if now >= deadline:
            hung = [r for r in range(len(procs)) if r not in codes]
            _kill(procs)
            raise ExecutorError(
                f"ranks {hung} did not finish within timeout_s={timeout_s:g} s (hung, e.g. "
                f"deadlocked in a collective); ranks {sorted(codes)} had finished; all workers "
                "were killed", rank=hung, kind="timeout", exitcodes=codes)
        time.sleep(_POLL_S)
    results = []
    for rank in range(len(procs)):
        results.append(_load_result(root / f"result{rank}.pt"))
    return results


def run_under_torchrun(fn: WorkerFn, config: dict, *, backend: str | None = None,
                       gather: bool = False, num_threads: int | None = None) -> Any:
    """Run ``fn(rank, world_size, config)`` in a process started by ``torchrun``.

    Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the environment,
    sets torch threads (as in ``launch``), joins the process group
    (``env://``; backend as in ``launch``, CUDA device = LOCAL_RANK under nccl), runs ``fn``
    and destroys the group. Returns rank 0's result on rank 0 (the list of every rank's
    result when ``gather``) and None on the other ranks.
    """
    import torch
    import torch.distributed as dist

    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        raise RuntimeError(f"run_under_torchrun needs {missing} in the environment "
                           "(start the script with torchrun)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.set_num_threads(_threads(config, num_threads))
    if backend is None:
        cuda = torch.cuda.is_available() and torch.cuda.device_count() > local
        backend = "nccl" if cuda else "gloo"
    _init_group(backend, rank, world, local, "env://", 1800.0)
    try:
        result = fn(rank, world, config)
        if gather:
            everyone: list[Any] = [None] * world
            dist.gather_object(result, everyone if rank == 0 else None, dst=0)
            result = everyone
    finally:
        dist.destroy_process_group()
    return result if rank == 0 else None
