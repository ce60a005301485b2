"""A server process's life: what it does when it starts, while it runs, and when it stops.

It sits at the top of `craft`, beside `asgi.py`: start-up wires every layer below it.

`craft.asgi` hooks this into daphne's reactor, so a plain `daphne craft.asgi:application` gets
all of it:

* **Start**: register this worker and close the turns of workers that are gone (after a crash
  or SIGKILL, the restarted server closes its predecessor's turns at once, without waiting
  for anyone to prompt). Then housekeeping runs every few seconds: a heartbeat, closing the
  turns of workers that stopped answering, and starting the queued prompts of sessions where
  nothing runs (their worker died or shut down, or their sandbox has become ready): each
  through the session's owner, so a queued prompt runs once. The sandbox reaper runs beside
  it, on a thread of its own (`sandboxes.reaper`: idle agents, stuck, idle, orphan and
  vanished sandboxes).
* **Websockets**: a client frame over daphne's size limit closes that socket with 1009 ("message
  too big") rather than dropping the connection.
* **SIGTERM / SIGINT**: housekeeping stops, and the process's runtime (`craft.runtime`) lets
  go of what it holds, in order: refuse new turns; give running turns
  `CRAFT_SHUTDOWN_GRACE_SECONDS` to finish (their sockets stay open meanwhile: daphne's
  cancel of every socket waits for the end of all this); cancel the others and record them
  as interrupted; stop every agent actively (its process group is killed, or its exec
  closed: an agent need not exit when its input ends); mark the sandboxes it was
  provisioning failed (their users' "Try again" provisions them anew) and wait for their
  threads to leave the backend; commit what the event writer holds; mark this worker stopped.
  A provisioning thread still inside the backend after its wait would abort the process as
  the interpreter finalizes: the process then ends at once instead, with code 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from django.conf import settings

from craft.cluster.forwarding import Unavailable, listener, route
from craft.cluster.leases import ownership
from craft.commands import RunQueue
from craft.errors import Refused
from craft.models import Session
from craft.runtime import runtime
from craft.session_activity import session_activity
from craft.storage import workers
from craft.storage.db import db_calls
from craft.turns import queue
from craft.turns.recovery import close_turns_of_gone_workers
from craft.turns.registry import runners
from sandboxes import services as sandbox_services
from sandboxes.reaper import periodic_reaper

logger = logging.getLogger(__name__)


def start_worker() -> int:
    """Register this worker; close the turns of gone workers; return how many were closed."""
    workers.register()
    return close_turns_of_gone_workers()


def housekeeping_once() -> None:
    workers.heartbeat()
    close_turns_of_gone_workers()


class Lifecycle:
    """The start, housekeeping and shutdown of this server process (on its event loop)."""

    def __init__(self) -> None:
        self.starting: asyncio.Future[None] | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._leases: asyncio.Task[None] | None = None
        self._reaping: asyncio.Task[None] | None = None
        self._queues: dict[Any, asyncio.Task[None]] = {}  # RunQueue commands on their way

    async def start(self) -> None:
        closed = await db_calls.run(start_worker)
        if closed:
            logger.warning("closed %d turn(s) left by a server that is gone", closed)
        await listener.start()
        loop = asyncio.get_running_loop()
        self._housekeeping = loop.create_task(self._keep_house())
        self._leases = loop.create_task(self._keep_leases())
        self._reaping = loop.create_task(periodic_reaper.run(session_activity))

    async def _keep_house(self) -> None:
        while True:
            await asyncio.sleep(workers.HEARTBEAT_SECONDS)
            try:
                await db_calls.run(housekeeping_once)
                await _release_idle_sessions()
            except Exception:
                logger.exception("housekeeping failed")
            try:  # on its own: a failure here never stops the heartbeat or the closing
                await self._resume_queues()
            except Exception:
                logger.exception("starting queued prompts failed")

    async def _resume_queues(self) -> None:
        """Have each session whose queued prompts could run, and nothing runs, start them."""
        for session_id in await db_calls.run(queue.sessions_waiting):
            task = self._queues.get(session_id)
            if (task is None or task.done()) and not runners.get(session_id).busy:
                logger.info("session %s: starting its queued prompts", session_id)
                self._queues[session_id] = asyncio.get_running_loop().create_task(
                    _run_queue(session_id)
                )
        for session_id, task in list(self._queues.items()):
            if task.done():
                del self._queues[session_id]

    async def _keep_leases(self) -> None:
        """Renew this worker's leases three times per lease period."""
        while True:
            await asyncio.sleep(settings.CRAFT_SESSION_LEASE_SECONDS / 3)
            try:
                await ownership.renew()
            except Exception:
                logger.exception("renewing leases failed")

    async def shutdown(self) -> None:
        """Stop this worker cleanly; see the module docstring."""
        for task in (self._housekeeping, self._leases, self._reaping):
            if task is not None:
                task.cancel()
        await runtime.shutdown()


async def _run_queue(session_id: Any) -> None:
    try:
        await route(session_id, RunQueue())
    except (Refused, Unavailable, Session.DoesNotExist):
        pass  # the owner is busy or silent, or the session is gone: the next round tries again
    except Exception:
        logger.exception("session %s: resuming its queue failed", session_id)


async def _release_idle_sessions() -> None:
    """Release the leases of sessions this worker holds no agent for (stopped as idle, or
    gone): the next prompt may go to any worker."""
    for session_id in list(ownership.held):
        runner = runners.get(session_id)
        connection = runner.connection
        if not runner.busy and (connection is None or not connection.is_running):
            runner.released()
            await ownership.release(session_id)


lifecycle = Lifecycle()


def install_in_daphne() -> None:
    """Run `lifecycle` inside daphne's reactor, if this process is daphne."""
    if "twisted.internet.reactor" not in sys.modules:
        return  # not under daphne (tests, management commands): nothing to hook into
    from daphne.server import Server
    from daphne.ws_protocol import WebSocketProtocol
    from twisted.internet import defer, reactor

    # autobahn fails a websocket by dropping its TCP connection unless told otherwise
    # (`failByDrop`, which daphne leaves on): a client frame over daphne's
    # --websocket-max-message-size would end in a reset instead of the close code 1009
    # ("message too big") that docs/websocket-api.md promises. autobahn takes a protocol's
    # own setting over its factory's.
    WebSocketProtocol.failByDrop = False

    def on_start() -> None:
        lifecycle.starting = asyncio.ensure_future(lifecycle.start())

    stopping: list[asyncio.Future[None]] = []

    def on_stop() -> defer.Deferred[None]:
        stopping.append(asyncio.ensure_future(lifecycle.shutdown()))
        return defer.Deferred.fromFuture(stopping[-1])

    # Daphne cancels every application instance (every open socket) as its reactor stops, at
    # the same moment as `on_stop`: a person answering a permission during the shutdown grace
    # would not be heard, and the turn waiting for it would end interrupted. Its sockets go
    # once the lifecycle's shutdown is over instead.
    kill_all_applications = Server.kill_all_applications

    def kill_after_shutdown(server: Server) -> defer.Deferred[None]:
        if not stopping:
            return kill_all_applications(server)
        waiting = defer.Deferred.fromFuture(asyncio.ensure_future(_settled(stopping[-1])))
        return waiting.addCallback(lambda _: kill_all_applications(server))

    Server.kill_all_applications = kill_after_shutdown
    reactor.callWhenRunning(on_start)
    # zope.interface's declaration of this method confuses the type checker (twice).
    reactor.addSystemEventTrigger("before", "shutdown", on_stop)  # type: ignore[arg-type]
    reactor.addSystemEventTrigger("after", "shutdown", _exit_before_stuck_threads_wake)  # type: ignore[arg-type]


def _exit_before_stuck_threads_wake() -> None:
    """End the process here, without finalizing the interpreter, if a provisioning thread
    is still inside the backend once the shutdown is over (`stop_provisioning` gave up on
    it: the Kubernetes API did not answer within its wait).

    Such a thread, waking while the interpreter finalizes, aborts the process (SIGABRT; see
    `sandboxes.services.stop_provisioning`). Everything worth keeping is stored by now: the
    shutdown committed the events and marked the worker stopped; only the logs are left to
    flush.
    """
    left = sandbox_services.provisioning_left()
    if not left:
        return  # the usual way out: daphne returns and the interpreter finalizes
    logger.warning("exiting at once: %d provisioning thread(s) still in the backend", left)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


async def _settled(future: asyncio.Future[None]) -> None:
    """Wait for `future` to end, however it ends (its own trigger reports its failure)."""
    await asyncio.wait([future])
