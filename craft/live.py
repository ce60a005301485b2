"""The doorbell: after events commit, tell every listening consumer of that session.

The message carries only the highest stored seq. Consumers read the events themselves from the
database, so a dropped or coalesced doorbell loses nothing: the next one (or a resume) brings
everything after the last seq the consumer sent.
"""

from __future__ import annotations

import logging
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def session_group(session_id: UUID) -> str:
    return f"session.{UUID(str(session_id)).hex}"


def ring(session_id: UUID, last_seq: int) -> None:
    """Announce that events up to `last_seq` are stored (called after commit, in any thread)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            session_group(session_id), {"type": "events.available", "last_seq": last_seq}
        )
    except Exception:
        # The log is already committed; listeners catch up on the next doorbell or resume.
        logger.exception("doorbell for session %s failed", session_id)
