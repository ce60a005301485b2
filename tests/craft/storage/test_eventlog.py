"""The event log: group commits keep each session's seqs exact, and one bad item fails alone."""

from __future__ import annotations

import asyncio
import json

import pytest

from craft.live import delivery
from craft.models import Event, Session
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events, frames_after, writer
from craft.storage.normalise import MAX_FRAME_BYTES, SPLIT_CHARS
from tests.ready import open_ready_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def chunk(text: str) -> dict:
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}


@db_sync_to_async
def seqs_and_texts(session_id) -> list[tuple[int, str]]:
    events = Event.objects.filter(session_id=session_id).order_by("seq")
    return [(e.seq, e.data["content"]["text"]) for e in events]


@pytest.fixture
def sessions(owner):
    return [open_ready_session(owner, f"s{i}").pk for i in range(6)]


async def test_concurrent_appends_of_many_sessions_get_consecutive_seqs_in_order(sessions):
    async def stream(session_id, count):
        # Submitted without waiting, as the runner does: the writer batches what piles up.
        pending = [
            writer.submit(session_id, [("agent_message_chunk", chunk(f"{i}"))])
            for i in range(count)
        ]
        return await asyncio.gather(*pending)

    results = await asyncio.gather(*(stream(s, 300) for s in sessions))
    for session_id, stored in zip(sessions, results, strict=True):
        assert [s.first_seq for s in stored] == list(range(1, 301))
        assert await seqs_and_texts(session_id) == [(i + 1, str(i)) for i in range(300)]


async def test_an_append_to_a_deleted_session_fails_alone(sessions):
    gone = sessions[0]
    await db_sync_to_async(lambda: Session.objects.filter(pk=gone).delete())()
    # Queued together, so that the writer tries them in one transaction first.
    doomed = writer.submit(gone, [("agent_message_chunk", chunk("lost"))])
    kept = [writer.submit(s, [("agent_message_chunk", chunk("kept"))]) for s in sessions[1:]]
    with pytest.raises(Session.DoesNotExist):
        await doomed
    for stored in await asyncio.gather(*kept):
        assert stored is not None and stored.first_seq == 1


async def test_a_repeated_prompt_id_is_stored_once_even_from_another_writer(sessions):
    session_id = sessions[0]
    first = await writer.append(session_id, [("user_message", {"id": "p", "text": "hi"})],
                                client_id="p")  # fmt: skip
    assert first is not None and first.first_seq == 1
    again = await writer.append(session_id, [("user_message", {"id": "p", "text": "hi"})],
                                client_id="p")  # fmt: skip
    assert again is None
    # A second process's writer (here: the synchronous path) is refused the same way.
    direct = await db_sync_to_async(append_events)(
        session_id, [("user_message", {"id": "p", "text": "hi"})], client_id="p"
    )
    assert direct is None
    assert await db_sync_to_async(Event.objects.filter(session_id=session_id).count)() == 1


async def test_the_unique_index_refuses_a_duplicate_that_slipped_past_the_check(sessions):
    from django.db import IntegrityError

    session_id = sessions[0]
    await writer.append(session_id, [("user_message", {"id": "x", "text": "a"})], client_id="x")

    @db_sync_to_async
    def insert_duplicate() -> None:
        Event.objects.create(session_id=session_id, seq=99, kind="user_message", client_id="x")

    with pytest.raises(IntegrityError):
        await insert_duplicate()


async def test_a_turn_follows_a_prompt_and_its_requests_stored_in_one_commit(sessions):
    """The turn's row is made by the prompt's own statement and then changed by the events
    after it in the same commit: a permission request opens an entry, its answer and the
    turn's end close them; a second prompt while it runs is refused by the database."""
    from django.db import IntegrityError

    from craft.models import TurnRecord

    session_id = sessions[0]
    request = {"request": 7, "options": [{"optionId": "allow"}, {"optionId": "deny"}]}
    await db_sync_to_async(append_events)(
        session_id,
        [("user_message", {"id": "p", "text": "go"}), ("permission_request", request)],
        client_id="p",
    )
    turn = await db_sync_to_async(TurnRecord.objects.get)(session_id=session_id)
    assert (turn.state, turn.prompt_seq, turn.pending) == ("running", 1, {"7": ["allow", "deny"]})
    with pytest.raises(IntegrityError):
        await db_sync_to_async(append_events)(
            session_id, [("user_message", {"id": "q", "text": "again"})], client_id="q"
        )
    await db_sync_to_async(append_events)(
        session_id, [("permission_answer", {"request": 7, "option": "allow"})]
    )
    assert (await db_sync_to_async(TurnRecord.objects.get)(session_id=session_id)).pending == {}
    await writer.append(session_id, [("turn_end", {"stop_reason": "end_turn"})])
    turn = await db_sync_to_async(TurnRecord.objects.get)(session_id=session_id)
    assert (turn.state, turn.stop_reason, turn.pending) == ("ended", "end_turn", {})
    assert turn.ended_at is not None


POISON = [
    ("lone surrogate", chunk("before \ud83d after"), "before \ufffd after"),
    ("split emoji", chunk("\ud83d\ude00"), "\U0001f600"),
    ("NUL", chunk("a\x00b"), "ab"),
]


@pytest.mark.parametrize(("name", "data", "expected"), POISON, ids=[p[0] for p in POISON])
async def test_poison_text_is_cleaned_once_and_everything_after_it_is_stored(
    sessions, name, data, expected
):
    session_id = sessions[0]
    stored = await writer.append(
        session_id,
        [("agent_message_chunk", chunk("first")), ("agent_message_chunk", data),
         ("agent_message_chunk", chunk("last"))],
    )  # fmt: skip
    assert stored is not None
    assert [json.loads(f)["data"]["content"]["text"] for f in stored.frames] == [
        "first", expected, "last"
    ]  # fmt: skip
    assert await seqs_and_texts(session_id) == [(1, "first"), (2, expected), (3, "last")]
    replayed = await db_sync_to_async(frames_after)(session_id, 0, 10)
    assert [json.loads(f)["data"]["content"]["text"] for _, f in replayed] == [
        "first", expected, "last"
    ]  # fmt: skip


async def test_a_kind_that_is_no_identifier_is_replaced_and_the_data_kept(sessions):
    session_id = sessions[0]
    update = {"sessionUpdate": "x" * 65, "detail": "kept"}
    await writer.append(session_id, [("x" * 65, update), ("plan", {"entries": []})])
    events = await db_sync_to_async(lambda: list(Event.objects.filter(session_id=session_id)))()
    assert [(e.kind, e.data) for e in events] == [
        ("invalid_update", update),
        ("plan", {"entries": []}),
    ]


async def test_a_long_agent_message_becomes_several_chunks_that_join_to_the_original(sessions):
    session_id = sessions[0]
    text = "".join(f"{i:07d}é\n" for i in range(SPLIT_CHARS // 4))  # 2.5 pieces of text
    stored = await writer.append(session_id, [("agent_message_chunk", chunk(text))])
    assert stored is not None and stored.last_seq - stored.first_seq + 1 == 3
    assert all(len(f.encode()) <= MAX_FRAME_BYTES for f in stored.frames)
    assert "".join(t for _, t in await seqs_and_texts(session_id)) == text


async def test_an_event_too_big_for_a_frame_is_sent_shortened_and_stored_whole(sessions):
    session_id = sessions[0]
    output = "line\n" * 400_000  # 2 MB of tool output in one update
    content = [{"type": "content", "content": {"type": "text", "text": output}}]
    update = {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "content": content}
    stored = await writer.append(session_id, [("tool_call_update", update)])
    assert stored is not None
    (frame,) = stored.frames
    assert len(frame.encode()) <= MAX_FRAME_BYTES
    sent = json.loads(frame)
    assert sent["truncated"] is True and sent["seq"] == 1
    assert sent["data"]["content"][0]["content"]["text"].endswith("… [truncated]")
    event = await db_sync_to_async(Event.objects.get)(session_id=session_id)
    assert event.data == update


async def test_committed_events_reach_a_follower_from_memory(sessions):
    session_id = sessions[0]
    received: list[tuple[int, int, list[str] | None]] = []

    class Follower:
        def deliver(self, first, last, frames):
            received.append((first, last, frames))

    follower = Follower()
    delivery.follow(session_id, follower)
    try:
        await writer.append(session_id, [("agent_message_chunk", chunk("a")),
                                         ("agent_message_chunk", chunk("b"))])  # fmt: skip
        await asyncio.sleep(0)
    finally:
        delivery.unfollow(session_id, follower)
    ((first, last, frames),) = received
    assert (first, last) == (1, 2)
    assert [json.loads(f)["seq"] for f in frames or []] == [1, 2]


AWKWARD = ["back\\slash", "tab\there", "new\nline", "cr\rhere", "\\N", 'quote"s', "é😀", "\\\\t"]


async def test_text_that_means_something_to_copy_is_stored_as_it_was_sent(owner):
    # More events than one statement takes, so that PostgreSQL stores them with COPY, whose
    # text format gives backslashes, tabs and line ends a meaning of their own.
    session = await db_sync_to_async(open_ready_session)(owner, "awkward")
    texts = [AWKWARD[i % len(AWKWARD)] + f" {i}" for i in range(80)]
    events = [("user_message", {"id": "id\\1", "text": "prompt\t\\N"})]
    events += [("agent_message_chunk", chunk(text)) for text in texts]
    stored = await db_sync_to_async(append_events)(session.pk, events, client_id="id\\1")
    assert stored is not None
    rows = await db_sync_to_async(
        lambda: list(Event.objects.filter(session=session).order_by("seq"))
    )()
    assert rows[0].client_id == "id\\1"
    assert rows[0].data == {"id": "id\\1", "text": "prompt\t\\N"}
    assert [row.data["content"]["text"] for row in rows[1:]] == texts
    assert [row.client_id for row in rows[1:]] == [None] * len(texts)
    # The same text as the websocket replays it.
    frames = await db_sync_to_async(frames_after)(session.pk, 0, 100)
    assert [json.loads(frame)["data"]["content"]["text"] for _, frame in frames[1:]] == texts
