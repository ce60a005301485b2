"""Many sessions streaming at once: every socket gets every event of its session once, in order.

Real demo agents, the real consumer, runner and event writer: twelve sessions stream at the
same time, two sockets each, one of which drops and resumes in the middle of the stream.
Group commits mix the sessions' events in shared transactions; the seqs of each session
must still be 1..N without a gap, and each socket must see exactly that sequence.
"""

from __future__ import annotations

import asyncio

import pytest

from craft.models import Event
from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from ..wsclient import is_turn_end, open_socket, receive_until, session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SESSIONS = 12
PROMPTS = ["count 400", "slow 30 0.01", "plan"]


@db_sync_to_async
def stored_seqs(session_id) -> list[int]:
    return list(
        Event.objects.filter(session_id=session_id).order_by("seq").values_list("seq", flat=True)
    )


async def follow_to_the_end(comm) -> list[int]:
    frames = await receive_until(comm, is_turn_end, timeout=60)
    return [f["seq"] for f in frames if f["type"] == "event"]


async def test_many_sessions_streaming_at_once_keep_exact_per_session_logs(owner):
    cookie = await db_sync_to_async(session_cookie)(owner)
    sessions = [await db_sync_to_async(open_ready_session)(owner) for _ in range(SESSIONS)]
    watchers = []
    for session in sessions:
        pair = [(await open_socket(session.pk, cookie))[0] for _ in range(2)]
        for comm in pair:
            await comm.send_json_to({"type": "resume", "after": 0})
        watchers.append(pair)

    async def run(index: int) -> tuple[list[int], list[int]]:
        session = sessions[index]
        steady, flaky = watchers[index]
        text = PROMPTS[index % len(PROMPTS)]
        await steady.send_json_to({"type": "prompt", "id": f"p{index}", "text": text})
        # The flaky socket drops after a few events and a new one resumes from there.
        first = await receive_until(flaky, lambda f: f.get("seq", 0) >= 3)
        seen = [f["seq"] for f in first if f["type"] == "event"]
        await flaky.disconnect()
        again, _ = await open_socket(session.pk, cookie)
        await again.send_json_to({"type": "resume", "after": seen[-1]})
        rest = await follow_to_the_end(again)
        await again.disconnect()
        steady_seqs = await follow_to_the_end(steady)
        await steady.disconnect()
        return steady_seqs, seen + rest

    results = await asyncio.gather(*(run(i) for i in range(SESSIONS)))
    for session, (steady_seqs, flaky_seqs) in zip(sessions, results, strict=True):
        stored = await stored_seqs(session.pk)
        assert stored == list(range(1, len(stored) + 1)), "seqs must have no gap"
        assert steady_seqs == stored
        assert flaky_seqs == stored
