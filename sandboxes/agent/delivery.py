"""Who hears what an agent sends: its running turn, else the connection's idle listener.

An `AgentConnection` hands every item it reads (updates, the agent's requests, a turn's end) to
its one `Delivery`, on the reader thread. The delivery holds the turn slot (at most one turn
runs on a connection), the idle sink with what came before anyone listened, and the count of
a turn's updates that came after the turn's answer: those are dropped, because ACP has a
turn's updates come before its answer. A sink must not block.

The connection's lock guards the turn slot and the early items; a method that says "hold the
lock" is called with it held.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sandboxes.agent.protocol import TURN_UPDATES, Sink, TurnItem, Update

logger = logging.getLogger(__name__)

# Updates that arrive outside a turn before anyone listens (some agents send their commands
# right after the session/new answer) are held for the idle sink, up to this many.
EARLY_UPDATES = 1_000


@dataclass
class RunningTurn:
    """A prompt sent and not yet answered: who hears it, and how it stands."""

    sink: Sink
    prompt_id: int
    cancelled: bool = False
    finished: bool = False
    stderr_before: str = ""  # the kept stderr when the prompt was sent
    stderr_seen: str = ""  # the kept stderr when it was last read for a quiet turn's status
    stderr_said: str = ""  # ... and its last line worth reading, written during the turn


class Delivery:
    """The turn slot and the idle sink of one connection (see the module's docstring)."""

    def __init__(self, lock: threading.Lock, ident: str) -> None:
        self._lock = lock
        self._ident = ident  # the agent process's, for logs
        self.turn: RunningTurn | None = None
        self._idle_sink: Sink | None = None
        self._early: list[TurnItem] = []  # held until there is an idle sink
        # Whether a turn of this connection was answered: from then on, until the next
        # prompt, updates of a turn (TURN_UPDATES) come after their turn's end.
        self._answered = False
        self.late_updates_dropped = 0  # all such updates of this connection, dropped
        self._dropped_since_answer = 0

    @property
    def idle_sink(self) -> Sink | None:
        return self._idle_sink

    @idle_sink.setter
    def idle_sink(self, sink: Sink | None) -> None:
        """Set who hears updates outside turns; it first gets those that came before it."""
        while True:
            with self._lock:
                early, self._early = self._early, []
                if not early:
                    self._idle_sink = sink
                    return
            for item in early:
                if sink is not None:
                    sink(item)

    def begin(self, turn: RunningTurn) -> None:
        """Make `turn` the running one (hold the lock; the slot is free)."""
        self.turn = turn
        self.count_late_updates()

    def end(self, turn: RunningTurn) -> bool:
        """Mark `turn` answered and free its slot; False if it had ended already (hold the
        lock)."""
        if turn.finished:
            return False
        turn.finished = True
        self._answered = True
        if self.turn is turn:
            self.turn = None
        return True

    def withdraw(self, turn: RunningTurn) -> None:
        """Free the slot of a turn whose prompt was never sent (hold the lock)."""
        turn.finished = True
        if self.turn is turn:
            self.turn = None

    def deliver(self, item: TurnItem) -> None:
        """Hand `item` to the running turn's sink, else the idle sink, else keep it for the
        idle sink; drop a turn's update that comes after its turn's answer."""
        turn = self.turn
        if (
            turn is None
            and self._answered
            and isinstance(item, Update)
            and item.kind in TURN_UPDATES
        ):
            self._drop_late(item)
            return
        sink = turn.sink if turn is not None else self._idle_sink
        if sink is None:
            with self._lock:
                if self._idle_sink is None:
                    if len(self._early) < EARLY_UPDATES:
                        self._early.append(item)  # handed over when the idle sink is set
                    else:
                        logger.info("agent %s: %s outside a turn, dropped", self._ident, item)
                    return
                sink = self._idle_sink
        try:
            sink(item)
        except Exception:
            logger.exception("turn sink failed on %r", item)

    def count_late_updates(self) -> None:
        """Log how many updates of the last ended turn were dropped (a new turn begins, or
        the connection stops)."""
        dropped, self._dropped_since_answer = self._dropped_since_answer, 0
        if dropped > 1:
            logger.warning(
                "agent %s: %d updates sent after its turn's answer were dropped",
                self._ident, dropped,
            )  # fmt: skip

    def _drop_late(self, item: Update) -> None:
        """Drop an update of a turn that has ended (TURN_UPDATES); count it, say so once."""
        self.late_updates_dropped += 1
        self._dropped_since_answer += 1
        if self._dropped_since_answer == 1:
            logger.warning(
                "agent %s sent %s after answering its turn's prompt; dropped (ACP has a turn's "
                "updates come before its answer), and those after it are counted",
                self._ident, item.kind,
            )  # fmt: skip
