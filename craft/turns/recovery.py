"""Closing turns that nobody will finish: their worker is gone.

A turn belongs to the worker (server process) that started it. If that worker dies (a crash,
SIGKILL, a lost host), its turns would stay open for good: no `turn_end`, live permission
buttons. Any worker closes them, on its start, every few seconds while it runs, and when a
prompt finds one in its way: for each open permission request a `permission_answer` with
outcome `cancelled` and reason `interrupted` (for each open elicitation an
`elicitation_answer` with action `cancel` and that reason), then an `agent_error` that says
why (with a `reason` a client can tell apart: `server_restarted`, `server_lost`), then exactly one
`turn_end` with stop reason `interrupted`. Events stored before never change. The row lock
(and the turn's state, checked again under it) makes two workers closing one turn at once
store it once.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from django.db import transaction

from craft.models import TurnRecord, Worker
from craft.storage import workers
from craft.storage.eventlog import append_events, turn_rows

logger = logging.getLogger(__name__)

RESTARTED = "This turn was interrupted: the server restarted."
LOST = "This turn was interrupted: the server running it stopped responding."
# The `reason` of each one's agent_error (docs/websocket-api.md).
REASONS = {RESTARTED: "server_restarted", LOST: "server_lost"}


def interrupted_answer(request: str) -> tuple[str, dict[str, Any]]:
    """Return the `permission_answer` of a request left open by a turn Craft cut short."""
    data = {"request": request, "option": None, "outcome": "cancelled", "reason": "interrupted"}
    return ("permission_answer", data)


def interrupted_elicitation(request: str) -> tuple[str, dict[str, Any]]:
    """Return the `elicitation_answer` of a request left open by a turn Craft cut short."""
    return ("elicitation_answer", {"request": request, "action": "cancel", "reason": "interrupted"})


def interruption(why: str, reason: str | None = None) -> tuple[str, dict[str, Any]]:
    """Return the `agent_error` that says why Craft cut a turn short."""
    reason = reason or REASONS.get(why)
    return ("agent_error", {"message": why, **({"reason": reason} if reason else {})})


def close_turns_of_gone_workers(session_id: UUID | None = None) -> int:
    """Close the running turns (of one session, or all) whose worker is gone; return how many."""
    turns = TurnRecord.objects.running()
    if session_id is not None:
        turns = turns.filter(session_id=session_id)
    candidates = list(turns.values_list("pk", "worker"))
    if not candidates:
        return 0
    known = {w.pk: w for w in Worker.objects.filter(pk__in={w for _, w in candidates})}
    closed = 0
    for turn_id, worker_id in candidates:
        if workers.is_gone(worker_id, known):
            closed += close_turn(turn_id, worker_id, _why(known.get(worker_id)))
    return closed


def close_turns_taken_over(session_id: UUID, previous: str) -> None:
    """Close the running turns of a session whose lease was just taken over from `previous`
    (in the takeover's transaction: `craft.cluster.leases.acquire`)."""
    running = TurnRecord.objects.running().filter(session_id=session_id, worker=previous)
    for turn_id in running.values_list("pk", flat=True):
        close_turn(turn_id, previous, LOST)


def _why(worker: Worker | None) -> str:
    if worker is None or worker.host != workers.me().host:
        return LOST
    return RESTARTED


def close_turn(turn_id: int, worker_id: str, why: str) -> bool:
    """Close one running turn of `worker_id` as interrupted; False if it is not running."""
    with transaction.atomic():
        turn = turn_rows.lock_running(turn_id, worker_id)
        if turn is None:
            return False
        events = [
            interrupted_elicitation(request)
            if isinstance(asked, dict) and asked.get("kind") == "elicitation"
            else interrupted_answer(request)
            for request, asked in turn.pending.items()
        ]
        events += [interruption(why), ("turn_end", {"stop_reason": "interrupted"})]
        append_events(turn.session_id, events)
    logger.warning("closed turn %s of session %s: %s", turn_id, turn.session_id, why)
    return True
