"""What a turn changed in the workspace: checkpoints around turns and the turn_changes event.

The real demo agent writes files after a permission; its checkpoints are real git commits.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from craft import lifecycle
from craft.cluster import leases
from craft.models import TurnRecord
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events
from craft.turns.registry import runners
from sandboxes import services as sandbox_services
from tests.ready import open_ready_session

from ..logs import stored_log
from ..wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "changes")


async def write(comm, prompt_id: str, text: str, option: str = "allow") -> list[dict]:
    """Send a prompt that asks to write a file, answer its permission, return its frames."""
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
    frames = await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    request = frames[-1]["data"]["request"]
    await comm.send_json_to({"type": "permission", "request": request, "option": option})
    return frames + await receive_until(comm, is_turn_end)


async def test_a_turn_that_writes_a_file_is_followed_by_its_changes(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    frames = await write(comm, "w1", "write notes.txt hello")
    prompt_seq = next(f["seq"] for f in frames if f.get("kind") == "user_message")
    turn_end_seq = frames[-1]["seq"]
    changes = (await receive_until(comm, lambda f: f.get("kind") == "turn_changes"))[-1]
    assert changes["seq"] > turn_end_seq
    assert changes["data"] == {
        "turn": prompt_seq,
        "files": [
            {"path": "notes.txt", "status": "added", "added": 1, "removed": 0, "binary": False}
        ],
        "truncated": False,
    }
    # An edit of the same file: modified, one line out and one in.
    frames = await write(comm, "w2", "write notes.txt goodbye")
    changes = (await receive_until(comm, lambda f: f.get("kind") == "turn_changes"))[-1]
    assert changes["data"]["files"] == [
        {"path": "notes.txt", "status": "modified", "added": 1, "removed": 1, "binary": False}
    ]
    turns = await db_sync_to_async(
        lambda: list(
            TurnRecord.objects.filter(session=session).values_list(
                "checkpoint_before", "checkpoint_after"
            )
        )
    )()
    (base, first), (none, second) = turns
    assert base and first and second and none == ""  # before the first turn, after each
    assert len({base, first, second}) == 3
    await comm.disconnect()


async def test_turns_without_tools_or_without_changes_get_no_changes_event(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "h", "text": "hello"})
    await receive_until(comm, is_turn_end)
    await write(comm, "r", "write notes.txt no", option="reject")  # a tool, but nothing written
    await comm.send_json_to({"type": "prompt", "id": "h2", "text": "hello again"})
    await receive_until(comm, is_turn_end)  # after the previous turn's checkpoint, always
    kinds = [kind for _, kind, _ in await stored_log(session)]
    assert "turn_changes" not in kinds
    assert kinds.count("turn_end") == 3
    await comm.disconnect()


async def test_a_skipped_checkpoint_is_said_and_the_session_goes_on(session, cookie, settings):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "h", "text": "hello"})
    await receive_until(comm, is_turn_end)  # the base checkpoint is taken
    settings.CRAFT_CHECKPOINT_MAX_FILE_BYTES = 8 << 30
    settings.CRAFT_CHECKPOINT_TIMEOUT_SECONDS = 1
    workspace = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    (workspace / "zeros.bin").touch()
    os.truncate(workspace / "zeros.bin", 4 << 30)  # seconds of hashing for git; no disk
    await write(comm, "w", "write notes.txt hello")
    changes = (await receive_until(comm, lambda f: f.get("kind") == "turn_changes"))[-1]
    assert changes["data"]["files"] == []
    assert "longer than 1 s" in changes["data"]["skipped"]
    await comm.send_json_to({"type": "prompt", "id": "h2", "text": "hello"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()


@db_sync_to_async
def another_workers_turn(session, path: str) -> None:
    """Leave what a turn on another worker that wrote `path` leaves: its events, and the
    checkpoint after it (taken and noted as that worker's runner does)."""
    folder = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    (folder / path).write_text("written on another worker\n")
    workspace = sandbox_services.session_workspace(session.sandbox, session.pk)
    taken = workspace.checkpoint("turn on another worker")
    stored = append_events(session.pk, [("user_message", {"id": "elsewhere", "text": "…"})],
                           client_id="elsewhere")  # fmt: skip
    append_events(session.pk, [("turn_end", {"stop_reason": "end_turn"})])
    TurnRecord.objects.filter(session=session, prompt_seq=stored.first_seq).update(
        checkpoint_after=taken.commit
    )


async def test_a_turn_after_the_lease_went_elsewhere_and_back_lists_only_its_own_changes(
    session, cookie
):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await write(comm, "w1", "write one.txt 1")
    await receive_until(comm, lambda f: f.get("kind") == "turn_changes")
    # Its agent is stopped as idle and the lease given up; another worker runs a turn; this
    # worker's next lease carries the same token as its last one.
    await runners.get(session.pk).drop_connection()
    await lifecycle._release_idle_sessions()
    assert session.pk not in leases.ownership.held
    await another_workers_turn(session, "two.txt")
    frames = await write(comm, "w3", "write three.txt 3")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    changes = (await receive_until(comm, lambda f: f.get("kind") == "turn_changes"))[-1]
    assert [entry["path"] for entry in changes["data"]["files"]] == ["three.txt"]
    await comm.disconnect()
