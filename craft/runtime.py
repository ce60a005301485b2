"""What this server process holds beyond the database, and the one order it is let go in.

It sits at the top of `craft`, beside `lifecycle.py`, which calls `Runtime.shutdown` when the
server stops; a test's teardown calls `Runtime.reset`. The state itself lives in module
singletons beside the code that uses it:

* `turns/registry.runners`: the session runners (their turns, the agents' connections in
  use, checkpoints' watches), refused new turns once the process is closing;
* `cluster/leases.ownership`: the sessions this worker holds the lease of;
* `cluster/forwarding.listener`: this worker's channel for commands of other workers, and
  `cluster/peers.links`, the direct links to them, closed with it;
* `storage/eventlog/group_commit.writer` and `storage/db.db_calls`: the threads that hold database
  connections;
* channels' layers (`channel_layers`), one per event loop for the in-memory layer;
* the sandboxes' state, which `sandboxes.runtime` knows (agents, warm agents, terminals);
* `lifecycle.lifecycle`: start-up and housekeeping, whose shutdown calls this one's;
* nothing that must be let go of in order: `session_activity.session_activity` (what the
  reaper asks of sessions), `http/handler.request_threads` (idle request threads, kept for
  the next requests), `live/status._unowned` (status notices rung from a loop without a
  hub), `turns/quiet.agent_stderr_changed` (a signal), and the thread pools of agent, git,
  checkpoint and preview calls (`turns/agent_calls.agent_calls`, `turns/repository.git_calls`,
  `turns/checkpoints.checkpoint_calls`, `preview/proxy._connecting`), whose threads end with
  the process; `asgi.application` and `asgi.django_application` are the ASGI applications,
  holding nothing of their own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.layers import channel_layers
from django.conf import settings

from craft.cluster.forwarding import listener
from craft.cluster.leases import ownership
from craft.storage import workers
from craft.storage.db import db_calls
from craft.storage.eventlog import writer
from craft.turns.registry import runners
from sandboxes import services as sandbox_services
from sandboxes.runtime import SandboxRuntime
from sandboxes.runtime import runtime as sandbox_runtime

logger = logging.getLogger(__name__)

SHUTTING_DOWN = "The server shut down during this turn."

# After the grace period and the cancel, how long stopped agents' turns may take to be stored.
RECORD_SECONDS = 10.0
# How long the threads provisioning sandboxes get to leave the backend (one call of it).
STOP_PROVISIONING_SECONDS = 10.0


class Runtime:
    """This process's state beyond the database: stopped in order at shutdown, reset
    between tests (on the event loop)."""

    def __init__(self, sandboxes: SandboxRuntime) -> None:
        self.sandboxes = sandboxes

    async def shutdown(self) -> None:
        """Refuse new turns; give running turns `CRAFT_SHUTDOWN_GRACE_SECONDS` to finish;
        interrupt the others; stop every agent; mark the sandboxes being provisioned here
        failed and wait for their threads to leave the backend; let other workers take this
        one's sessions; commit what the event writer holds; mark this worker stopped."""
        runners.closing = True
        grace = settings.CRAFT_SHUTDOWN_GRACE_SECONDS
        running = runners.running()
        if running:
            logger.info("shutting down: %d turn(s) running; waiting %s s", len(running), grace)
            await _wait_for(running, grace)
        still = runners.running()
        for runner in still:
            await runner.interrupt(SHUTTING_DOWN, "server_shutdown")
        stopped = await asyncio.to_thread(self.sandboxes.stop)
        # Sandboxes half provisioned here say so, and their "Try again" works at once.
        abandoned = await db_calls.run(sandbox_services.abandon_provisioning)
        # Their threads must be out of the backend's client before the interpreter
        # finalizes: one waking up then kills the process (see `stop_provisioning`).
        left = await asyncio.to_thread(
            sandbox_services.stop_provisioning, STOP_PROVISIONING_SECONDS
        )
        if left:
            logger.warning(
                "%d provisioning thread(s) still in the backend after %g s",
                left, STOP_PROVISIONING_SECONDS,
            )  # fmt: skip
        await _wait_for(still, RECORD_SECONDS)
        await ownership.release_all()  # other workers take this one's sessions at once
        listener.stop()
        runners.forget_all()  # their sessions are other workers' now
        await asyncio.to_thread(writer.stop)
        await db_calls.run(workers.mark_stopped)
        # The database threads are left to end with the process (joining them here made the
        # interpreter crash at exit, in CPython 3.11's garbage collection of pending tasks);
        # the pools are closed so that PostgreSQL sees the connections go.
        await asyncio.to_thread(_close_connection_pools)
        logger.info(
            "shut down: %d turn(s) interrupted, %d agent(s) stopped, %d provisioning(s) abandoned",
            len(still), stopped, abandoned,
        )  # fmt: skip

    def reset(self) -> None:
        """Let go of what this process holds, in the order `shutdown` does, without waiting
        for turns: a test ended, and the next has an event loop of its own, which runners and
        the in-memory channel layer belong to. The threads holding database connections end,
        so that the test database can go. Sandboxes being provisioned in the background stop
        first, while the test's settings still hold: a thread that went on would make its
        folders wherever the settings restored after it say."""
        sandbox_services.stop_provisioning(STOP_PROVISIONING_SECONDS)
        self.sandboxes.reset()
        runners.forget_all()
        channel_layers.backends.clear()
        writer.stop()
        db_calls.stop()


async def _wait_for(running: list[Any], seconds: float) -> None:
    tasks = [runner.task for runner in running if runner.task is not None]
    if tasks:
        await asyncio.wait(tasks, timeout=seconds)


def _close_connection_pools() -> None:
    """Close PostgreSQL connection pools: their threads must not outlive the interpreter."""
    from django.db import connections

    for connection in connections.all():
        close_pool = getattr(connection, "close_pool", None)
        if close_pool is not None:
            close_pool()


runtime = Runtime(sandbox_runtime)
