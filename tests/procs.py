"""Whether a test's process is still running, read from /proc without racing its end.

A process can be reaped between opening `/proc/<pid>/stat` and reading it; the read then
fails with ESRCH (ProcessLookupError) rather than FileNotFoundError. Every helper here
treats any OSError as "gone".
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def process_state(pid: int) -> str | None:
    """The one-letter state of `pid` ("R", "S", "Z", ...), or None once it is reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    """Running or stopped: not exited. A zombie has exited; only its parent has not
    collected it yet."""
    return process_state(pid) not in (None, "Z", "X")


def gone(pid: int, timeout: float = 10) -> bool:
    """Wait up to `timeout` for `pid` to exit; whether it did."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def killed(pid: int) -> None:
    """SIGKILL `pid` and wait until it has exited (its pipes are closed then)."""
    os.kill(pid, signal.SIGKILL)
    if not gone(pid):
        raise AssertionError(f"process {pid} did not die")
