"""What a quiet turn's owner reads: the line the agent last wrote to stderr, while it is quiet.

An agent retrying a model call for minutes sends nothing over ACP; what it is doing is on its
stderr. A `QuietStatus` belongs to one turn: once the agent has sent nothing for
`CRAFT_AGENT_QUIET_SECONDS`, `look` is called every LOOK_SECONDS and tells the owner's pages
the last line worth reading of what the agent wrote to stderr during the turn (cleaned and cut
by `sandboxes.stderr_text`), when it changed, and again every REFRESH_SECONDS for pages opened
since; `heard` (the agent sent something) and `end` (the turn ended) clear it. Nothing is
stored: the line goes out as `agent_stderr_changed`, which `craft.live.status` turns into a
notice for the owner's sockets only, in every server process (`craft.apps` wires it); so a
flood of stderr costs at most one notice a LOOK_SECONDS.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from sandboxes.agent.connection import AgentConnection

logger = logging.getLogger(__name__)

# Sent with `session_id`, `owner_id` and `text` (what the agent last wrote; "" once it is no
# longer quiet): tells the owner's pages, never stored.
agent_stderr_changed = Signal()

LOOK_SECONDS = 1.0
REFRESH_SECONDS = 15.0


class QuietStatus:
    """The stderr line a turn's owner is shown while its agent is quiet (on the event loop)."""

    def __init__(self, session_id: Any, owner_id: Any, connection: AgentConnection) -> None:
        self.session_id = session_id
        self.owner_id = owner_id
        self.connection = connection
        self.shown = ""  # what the owner's pages show now
        self.shown_at = 0.0

    def look(self, now: float) -> None:
        """Show what the quiet agent last wrote to stderr, if that changed (or again, now and
        then, for pages opened since)."""
        line = self.connection.stderr_said_lately()
        if line and (line != self.shown or now - self.shown_at >= REFRESH_SECONDS):
            self.shown, self.shown_at = line, now
            self._tell(line)

    def heard(self) -> None:
        """Clear what is shown: the agent sent something, it is no longer quiet."""
        if self.shown:
            self.shown = ""
            self._tell("")

    end = heard

    def _tell(self, text: str) -> None:
        if self.owner_id is None:
            return
        for receiver, result in agent_stderr_changed.send_robust(
            sender=None, session_id=self.session_id, owner_id=self.owner_id, text=text
        ):
            if isinstance(result, Exception):
                logger.error("%r failed on session %s's quiet status", receiver, self.session_id,
                             exc_info=result)  # fmt: skip
