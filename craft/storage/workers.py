"""Which server process this is, and whether another one is still alive.

It sits with storage, under everything that needs it: the event log and the turns stamp rows
with this worker, the leases and forwarding name it.

Every server process ("worker") runs with identical settings; its identity is derived from
where and when it runs: host name, the host's boot id, pid, and the process's start time in
clock ticks since boot (a pid is reused by a later process; the start time is not). A worker
writes its row at start, refreshes `seen_at` every `HEARTBEAT_SECONDS`, and marks itself
stopped when it shuts down cleanly.

A worker is gone when it said so (`stopped_at`), when it ran on this host since the last boot
and its process no longer exists (a restart is noticed at once), or when it has not been seen
for `CRAFT_WORKER_TIMEOUT_SECONDS` (another host, or a process that hangs).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from craft.models import Worker

HEARTBEAT_SECONDS = 5.0


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """Return the start time of process `pid` in clock ticks since boot, None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass(frozen=True)
class Identity:
    host: str
    boot: str
    pid: int
    started: int

    @property
    def key(self) -> str:
        return f"{self.host}/{self.pid}/{self.started}"


@cache
def me() -> Identity:
    """Return this process's identity."""
    pid = os.getpid()
    return Identity(socket.gethostname(), _boot_id(), pid, _start_ticks(pid) or 0)


def register() -> Worker:
    """Write (or refresh) this worker's row."""
    identity = me()
    now = timezone.now()
    worker, _ = Worker.objects.update_or_create(
        id=identity.key,
        defaults={
            "host": identity.host,
            "boot": identity.boot,
            "pid": identity.pid,
            "started": identity.started,
            "seen_at": now,
            "stopped_at": None,
        },
        create_defaults={
            "host": identity.host,
            "boot": identity.boot,
            "pid": identity.pid,
            "started": identity.started,
            "started_at": now,
            "seen_at": now,
        },
    )
    return worker


def ensure_registered() -> None:
    """Write this worker's row if it is missing (one query; a no-op when it exists)."""
    identity = me()
    Worker.objects.bulk_create(
        [Worker(id=identity.key, host=identity.host, boot=identity.boot, pid=identity.pid,
                started=identity.started)],
        ignore_conflicts=True,
    )  # fmt: skip


def heartbeat() -> None:
    if not Worker.objects.filter(pk=me().key).update(seen_at=timezone.now()):
        register()


def mark_stopped() -> None:
    Worker.objects.filter(pk=me().key).update(stopped_at=timezone.now())


def is_gone(worker_id: str, workers: dict[str, Worker]) -> bool:
    """Return whether the worker `worker_id` no longer runs (see the module docstring)."""
    if worker_id == me().key:
        return False
    worker = workers.get(worker_id)
    if worker is None or worker.stopped_at is not None:
        return True
    identity = me()
    if worker.host == identity.host and worker.boot == identity.boot and identity.boot:
        return _start_ticks(worker.pid) != worker.started
    timeout = timedelta(seconds=settings.CRAFT_WORKER_TIMEOUT_SECONDS)
    return worker.seen_at < timezone.now() - timeout
