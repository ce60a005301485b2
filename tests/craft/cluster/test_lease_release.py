"""An idle session's lease is released, but never under a prompt that is taking it.

Housekeeping gives up the leases of sessions this worker runs no agent for, so that their next
prompt may go to any worker. These tests run that release at the three moments it used to
break a prompt (whose first event was then refused as fenced): while the prompt is being
stored, before its turn or agent exists (and, the same way, while the page's early agent start
reads the sandbox, before it starts anything); while a release's database delete is still on its way
when the next prompt claims the lease; and while a renewal of the lease, which started before
the release, is still on its way (it brought the released lease back into memory, and the next
prompt ran under a lease that no longer existed).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from craft import lifecycle
from craft.cluster import leases
from craft.models import Event, Lease
from craft.storage import eventlog
from craft.storage.db import db_sync_to_async
from craft.turns import records
from tests.ready import open_ready_session

from ..wsclient import is_turn_end, open_socket, receive_until, session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "leases")


async def prompt(comm, prompt_id: str) -> list[dict]:
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": "count 1"})
    return await receive_until(comm, lambda f: is_turn_end(f) or f.get("type") == "error")


@db_sync_to_async
def lease_of(session_id):
    return Lease.objects.filter(session_id=session_id).first()


@pytest.fixture
def release_pass_at_sandbox_read(monkeypatch):
    """Run housekeeping's release pass whenever a command reads the session's sandbox: the
    worst moment, before the command holds a lock, a turn or an agent."""
    checked = records.sandbox_status

    async def release_pass_first(session_id):
        await lifecycle._release_idle_sessions()
        return await checked(session_id)

    monkeypatch.setattr(records, "sandbox_status", release_pass_first)


async def still_ours(session) -> None:
    lease = await lease_of(session.pk)
    assert lease is not None and lease.token == leases.ownership.token(session.pk)


async def test_a_release_pass_during_a_prompts_store_leaves_its_lease(
    session, owner, release_pass_at_sandbox_read
):
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    frames = await prompt(comm, "first")
    assert frames[-1].get("data") == {"stop_reason": "end_turn"}, frames[-2:]
    await still_ours(session)
    await comm.disconnect()


async def test_a_release_pass_during_an_early_agent_start_leaves_its_lease(
    session, owner, release_pass_at_sandbox_read
):
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "start_agent"})
    await receive_until(comm, lambda f: f.get("kind") == "agent_info")
    await still_ours(session)
    await comm.disconnect()


async def test_an_agents_start_events_refused_once_are_stored_at_its_next_use(
    session, owner, monkeypatch
):
    append = eventlog.writer.append
    refused = asyncio.Event()

    async def refuse_the_first_start_events(session_id, events, **kwargs):
        if not refused.is_set() and any(kind == "agent_info" for kind, _ in events):
            refused.set()
            raise eventlog.Fenced("refused once, as for a lease lost meanwhile")
        return await append(session_id, events, **kwargs)

    monkeypatch.setattr(eventlog.writer, "append", refuse_the_first_start_events)
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "start_agent"})
    await asyncio.wait_for(refused.wait(), 30)
    frames = await prompt(comm, "first")
    assert frames[-1].get("data") == {"stop_reason": "end_turn"}, frames[-2:]
    kinds = await db_sync_to_async(
        lambda: list(
            Event.objects.filter(session_id=session.pk)
            .order_by("seq")
            .values_list("kind", flat=True)
        )
    )()
    assert kinds.count("agent_info") == 1, kinds
    assert kinds.index("agent_info") < kinds.index("turn_end"), kinds
    await comm.disconnect()


async def test_a_prompt_waits_for_a_release_in_flight_and_takes_a_new_lease(
    session, owner, monkeypatch
):
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    assert (await prompt(comm, "first"))[-1].get("data") == {"stop_reason": "end_turn"}

    deleting = leases.release

    def slow_release(session_id, token):
        time.sleep(0.5)  # the delete is slow to arrive: the next prompt's claim comes first
        deleting(session_id, token)

    monkeypatch.setattr(leases, "release", slow_release)
    release = asyncio.ensure_future(leases.ownership.release(session.pk))
    await asyncio.sleep(0.05)
    frames = await prompt(comm, "second")
    await release
    assert frames[-1].get("data") == {"stop_reason": "end_turn"}, frames[-2:]
    lease = await lease_of(session.pk)
    assert lease is not None and lease.token == leases.ownership.token(session.pk)
    await comm.disconnect()


async def test_a_renewal_on_its_way_does_not_bring_back_a_released_lease(
    session, owner, monkeypatch
):
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    claim = await leases.ownership.claim(session.pk)
    assert claim.mine
    renewing = leases.renew

    def slow_renew(held):
        lost = renewing(held)  # the lease row is still there: renewed
        time.sleep(0.5)  # and the answer is slow to come back
        return lost

    monkeypatch.setattr(leases, "renew", slow_renew)
    renewal = asyncio.ensure_future(leases.ownership.renew())
    await asyncio.sleep(0.1)
    await leases.ownership.release(session.pk)  # housekeeping: the session is idle
    await renewal
    assert leases.ownership.token(session.pk) is None
    assert await lease_of(session.pk) is None
    frames = await prompt(comm, "after")
    assert frames[-1].get("data") == {"stop_reason": "end_turn"}, frames[-2:]
    await comm.disconnect()
