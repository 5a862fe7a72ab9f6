"""Lifetime of launched worker processes: they never outlive the process that launched them.

``launch`` starts each rank in its own session (so it can kill the rank's whole process
group); without more, a SIGKILL of ``paraplan run`` would leave the ranks training, re-parented
to PID 1. ``die_with_parent`` (in the worker) and ``sigterm_as_interrupt`` (in the launcher)
close that gap.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

PR_SET_PDEATHSIG = 1
"""``prctl`` option (linux/prctl.h): signal this process when its parent thread exits."""
WATCH_INTERVAL_S = 0.5


def die_with_parent(parent_pid: int) -> None:
    """End this worker when the launching process dies, however it dies (SIGKILL included):
    the kernel's parent-death signal on Linux, and on every OS a thread that exits once the
    worker has been re-parented (its parent pid changed)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(WATCH_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="paraplan-parent-watch", daemon=True).start()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while the workers run, so ``launch``'s cleanup (kill the
    ranks, remove the temporary directory) runs; only the main thread can install it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
