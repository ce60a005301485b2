"""What sessions tell the sandbox reaper: which are busy, and when each sandbox was last used.

`sandboxes` never imports `craft`; the reaper asks through this object, which the server's
lifecycle and `manage.py reap` hand to it.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from uuid import UUID

from django.db.models import Max

from craft.models import QueuedPrompt, Session, TurnRecord
from sandboxes.reaper import Busy


class SessionActivity:
    """Sessions as the sandbox reaper sees them (see `sandboxes.reaper.Sessions`)."""

    def busy(self) -> Busy:
        """Return the sessions with a running turn or a queued prompt, in any server process,
        and their sandboxes.

        A turn is running from its prompt's commit to its `turn_end` (so it covers an agent
        still starting and an open permission request); a turn of a worker that is gone is
        closed by `craft.turns.recovery`, not reaped. A queued prompt waits for its turn (or
        for its sandbox or repository).
        """
        rows = list(TurnRecord.objects.running().values_list("session_id", "session__sandbox_id"))
        rows += QueuedPrompt.objects.values_list("session_id", "session__sandbox_id").distinct()
        return Busy(
            sessions=frozenset(session for session, _ in rows),
            sandboxes=frozenset(sandbox for _, sandbox in rows),
        )

    def last_activity(self, sandbox_ids: Collection[UUID]) -> dict[UUID, datetime]:
        """Return when each sandbox's sessions were last active (an event stored, a session
        created or renamed: `Session.updated_at`)."""
        latest = (
            Session.objects.filter(sandbox_id__in=list(sandbox_ids))
            .values("sandbox_id")
            .annotate(latest=Max("updated_at"))
            .values_list("sandbox_id", "latest")
        )
        return dict(latest)


session_activity = SessionActivity()
