"""Live status: what a person's pages show besides a session's events, pushed as it changes.

Three notices go to every session socket a person has open, in every server process:

* `sandbox.changed`: one of their sandboxes changed state (`sandboxes.signals`, sent by
  whatever changed it: a request, the background provisioning, an admin, the reaper). A socket
  whose session lives in that sandbox reads the sandbox and sends a `sandbox` frame, unless it
  is what it sent last.
* `sessions.changed`: one of their sessions (`session`, its id) changed what the list of
  sessions shows: a turn started or ended, a permission request was opened or answered, the
  title changed, the session was created, deleted or read. A socket sends a `sessions` frame
  naming the sessions that changed, and the page fetches their items of its list again.
* `agent.stderr`: the agent of one of their sessions (`session`) is quiet mid-turn, and `text`
  is the line it last wrote to stderr (`craft.turns.quiet`; "" once it goes on or the turn
  ends). That session's sockets send an `agent_stderr` frame. This one carries what it says:
  it is never stored, and only the owner's sockets hear it.

Like the event doorbell, the first two say *that* something changed; the database says what. A
socket folds a burst of notices into one read and one frame. Inside a process, notices are
handed to the sockets of each event loop directly; other processes hear them on the channel
layer, in the user's group (`user.<id>`, which every session socket joins, see
`craft.live.accounts`), marked with this process's id so that no socket acts on one twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from craft.live.accounts import user_group
from craft.live.channel_layer import group_send_elsewhere
from craft.live.delivery import PROCESS_ID
from craft.live.loops import Background, Listeners, PerLoop
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

SANDBOX_CHANGED = "sandbox.changed"
SESSIONS_CHANGED = "sessions.changed"
AGENT_STDERR = "agent.stderr"


class Listener(Protocol):
    """A socket that shows a person's status (see craft.live.consumer.SessionConsumer)."""

    def notice(self, message: dict[str, Any]) -> None: ...


class StatusHub:
    """The listening sockets of one event loop, by user; used on that loop only."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.listeners: Listeners[Listener] = Listeners()
        self._rings = Background()

    def hand(self, user_id: Any, message: dict[str, Any], ring: bool) -> None:
        for listener in self.listeners.of(user_id):
            try:
                listener.notice(message)
            except Exception:
                logger.exception("a status notice for user %s failed", user_id)
        if ring:
            layer = get_channel_layer()
            if layer is not None and not isinstance(layer, InMemoryChannelLayer):
                self._rings.start(self.loop, _ring(layer, user_id, message))


async def _ring(layer: Any, user_id: Any, message: dict[str, Any]) -> None:
    try:  # this process's own sockets were handed the notice (`StatusHub.hand`)
        await group_send_elsewhere(layer, user_group(user_id), message)
    except Exception:
        # What is committed stays: the next notice, or a reconnect's hello, shows it.
        logger.exception("a status notice for user %s did not reach other processes", user_id)


_hubs: PerLoop[StatusHub] = PerLoop(StatusHub)


def listen(user_id: Any, listener: Listener) -> None:
    """Have `listener` hear the notices for `user_id` (on the running loop)."""
    _hubs.here().listeners.add(user_id, listener)


def stop_listening(user_id: Any, listener: Listener) -> None:
    _hubs.here().listeners.discard(user_id, listener)


def tell_user(user_id: Any, kind: str, **fields: Any) -> None:
    """Hand a notice to every socket of the user, in every process (from any thread)."""
    message = {"type": kind, "origin": PROCESS_ID, **fields}
    try:
        current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        current = None
    rung = False
    for loop, each in _hubs.items():
        # One loop of this process rings the others, off the caller's thread (often the
        # event writer's, which must not wait on Redis).
        if loop is current:
            each.hand(user_id, message, not rung)
        else:
            loop.call_soon_threadsafe(each.hand, user_id, message, not rung)
        rung = True
    if rung:
        return
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        return
    if current is not None:
        _unowned.start(current, _ring(layer, user_id, message))
        return
    try:
        async_to_sync(layer.group_send)(user_group(user_id), message)
    except Exception:
        logger.exception("a status notice for user %s did not reach other processes", user_id)


_unowned = Background()  # rung from a loop that has no hub


def sessions_changed(user_id: Any, session_id: Any) -> None:
    """Tell the user's pages that session `session_id` changed what their list of sessions
    shows, once the caller's transaction commits (at once without one)."""
    session = str(session_id)
    transaction.on_commit(lambda: tell_user(user_id, SESSIONS_CHANGED, session=session))


def on_agent_stderr(sender: Any, session_id: Any, owner_id: Any, text: str, **kwargs: Any) -> None:
    """Receive `craft.turns.quiet.agent_stderr_changed` (on the turn's event loop): tell the
    session's owner, and no one else, what its quiet agent last wrote to stderr."""
    tell_user(owner_id, AGENT_STDERR, session=UUID(str(session_id)).hex, text=text)


def on_sandbox_changed(sender: Any, sandbox_id: Any, owner_id: Any, **kwargs: Any) -> None:
    """Receive `sandboxes.signals.sandbox_changed` (sent after commit): tell the owner."""
    if owner_id is not None:
        tell_user(owner_id, SANDBOX_CHANGED, sandbox=UUID(str(sandbox_id)).hex)


def sandbox_state(sandbox: Sandbox) -> dict[str, str]:
    """Return a sandbox's state as the `hello` and `sandbox` frames carry it: with its id, since
    a session whose sandbox was stopped moves to a new one at its next prompt."""
    return {
        "id": str(sandbox.pk),
        "status": sandbox.status,
        "detail": sandbox.status_detail,
        "error": sandbox.error,
    }
