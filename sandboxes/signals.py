"""What this app tells others about sandboxes, without knowing who listens.

`sandbox_changed` is sent once a change of a sandbox's state is committed: its status, its
progress detail (provisioning steps) or its error, whoever made it (a request, the background
provisioning, an admin, the reaper). Receivers get `sandbox_id` and `owner_id` and read the
row themselves when they need more: a change may be followed by another before they run, and
the row, not the signal, says what the sandbox is now. `craft` connects to it to push the
state to the owner's open pages; this app never imports `craft`.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger(__name__)

sandbox_changed = Signal()


def announce_change(sandbox_id: Any, owner_id: Any) -> None:
    """Send `sandbox_changed` once the caller's transaction commits (at once without one).

    A receiver that fails is logged: a sandbox's change never fails for want of a listener.
    """

    def send() -> None:
        for receiver, result in sandbox_changed.send_robust(
            sender=None, sandbox_id=sandbox_id, owner_id=owner_id
        ):
            if isinstance(result, Exception):
                logger.error(
                    "%r failed on the change of sandbox %s", receiver, sandbox_id,
                    exc_info=result,
                )  # fmt: skip

    transaction.on_commit(send)
