"""A session's first checkpoint, taken ahead of its first prompt (`start_agent`).

It is only a candidate for the first turn's "before" state: whatever reaches the workspace
between it and the first prompt (the agent, anything else in the sandbox) must be in that
state, never counted as the first turn's change. Real demo agent, real git.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from django.db import IntegrityError

from craft import services
from craft.models import TurnRecord
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import writer
from craft.turns.registry import runners
from sandboxes import services as sandbox_services
from sandboxes.workspace import Workspace
from tests.ready import open_ready_session

from ..wsclient import open_socket, receive_until
from .test_turn_changes import write

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

NOTES_ADDED = [{"path": "notes.txt", "status": "added", "added": 1, "removed": 0, "binary": False}]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "early checkpoint")


def folder_of(session) -> Path:
    return Path(session.sandbox.reference) / "sessions" / str(session.pk)


@db_sync_to_async
def first_turn(session) -> TurnRecord:
    return TurnRecord.objects.filter(session=session).order_by("prompt_seq").first()


@db_sync_to_async
def recorded_in(session, commit: str) -> set[str]:
    workspace = sandbox_services.session_workspace(session.sandbox, session.pk)
    return {entry["path"] for entry in workspace.changes("", commit)["files"]}


async def start_agent(comm) -> None:
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "start_agent"})
    await receive_until(comm, lambda f: f.get("kind") == "available_commands_update")


async def first_changes(comm) -> list[dict]:
    await write(comm, "w1", "write notes.txt hello")
    frames = await receive_until(comm, lambda f: f.get("kind") == "turn_changes")
    return frames[-1]["data"]["files"]


async def test_an_early_checkpoint_still_true_is_the_first_turns_before(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await start_agent(comm)
    early = runners.get(session.pk).checkpoints._early
    assert early is not None
    taken, _ = await asyncio.shield(early)
    assert await first_changes(comm) == NOTES_ADDED
    assert (await first_turn(session)).checkpoint_before == taken.commit
    await comm.disconnect()


async def test_a_file_written_after_the_early_checkpoint_is_before_the_first_turn(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await start_agent(comm)
    taken, _ = await asyncio.shield(runners.get(session.pk).checkpoints._early)
    (folder_of(session) / "meanwhile.txt").write_text("written before the prompt\n")
    assert await first_changes(comm) == NOTES_ADDED  # not meanwhile.txt
    before = (await first_turn(session)).checkpoint_before
    assert before and before != taken.commit
    assert "meanwhile.txt" in await recorded_in(session, before)
    await comm.disconnect()


async def test_a_prompt_that_comes_while_the_early_checkpoint_is_written_waits_for_it(
    session, cookie, monkeypatch
):
    # The early checkpoint is recorded, then held before it is handed back.
    recorded, release = threading.Event(), threading.Event()
    real = Workspace.watched_checkpoint

    def held(workspace: Workspace, message: str, seconds: float):
        taken = real(workspace, message, seconds)
        if not recorded.is_set():
            recorded.set()
            release.wait(60)
        return taken

    monkeypatch.setattr(Workspace, "watched_checkpoint", held)
    comm, _ = await open_socket(session.pk, cookie)
    await start_agent(comm)
    await asyncio.get_running_loop().run_in_executor(None, recorded.wait, 60)
    (folder_of(session) / "late.txt").write_text("written while it was being stored\n")
    await comm.send_json_to({"type": "prompt", "id": "w1", "text": "write notes.txt hello"})
    await receive_until(comm, lambda f: f.get("kind") == "user_message")  # stored, waiting
    release.set()
    frames = await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    request = frames[-1]["data"]["request"]
    await comm.send_json_to({"type": "permission", "request": request, "option": "allow"})
    changes = await receive_until(comm, lambda f: f.get("kind") == "turn_changes")
    assert changes[-1]["data"]["files"] == NOTES_ADDED  # not late.txt
    before = (await first_turn(session)).checkpoint_before
    assert "late.txt" in await recorded_in(session, before)
    await comm.disconnect()


async def test_a_first_prompt_that_was_not_stored_leaves_no_answer_for_the_next(
    session, cookie, monkeypatch
):
    # The first prompt's confirmation is asked beside storing it; the store is then refused
    # (as when another turn is in the database's way). A file written afterwards is before
    # the next prompt's turn: that answer must not stand for it.
    comm, _ = await open_socket(session.pk, cookie)
    await start_agent(comm)
    runner = runners.get(session.pk)
    await asyncio.shield(runner.checkpoints._early)
    storing = writer.append

    async def refused_once(session_id, events, *, client_id=None, fence=None):
        if client_id == "p1":
            assert await asyncio.shield(runner.checkpoints._confirming) is not None
            raise IntegrityError("another turn is running")
        return await storing(session_id, events, client_id=client_id, fence=fence)

    monkeypatch.setattr(writer, "append", refused_once)
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "write notes.txt hello"})
    error = await receive_until(comm, lambda f: f.get("type") == "error")
    assert error[-1]["code"] == "turn_running"
    (folder_of(session) / "meanwhile.txt").write_text("written after the refused prompt\n")
    assert await first_changes(comm) == NOTES_ADDED  # not meanwhile.txt
    before = (await first_turn(session)).checkpoint_before
    assert "meanwhile.txt" in await recorded_in(session, before)
    await comm.disconnect()


def watching(session) -> list[int]:
    """The pids of the tools watching the session's workspace since its early checkpoint."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"checkpoint-watch" in command and str(session.pk).encode() in command:
            found.append(int(entry.name))
    return found


def still_there(pids: list[int]) -> bool:
    """Whether any of these processes is there, a zombie too (one never waited for)."""
    return any(Path(f"/proc/{pid}").exists() for pid in pids)


async def test_a_deleted_sessions_workspace_watch_ends_with_it(session, cookie):
    # The watch would otherwise wait for a first prompt for EARLY_WATCH_SECONDS (15 min),
    # a process of a session that is gone.
    comm, _ = await open_socket(session.pk, cookie)
    await start_agent(comm)
    await asyncio.shield(runners.get(session.pk).checkpoints._early)
    pids = watching(session)
    assert pids
    await comm.disconnect()
    await db_sync_to_async(services.delete_session)(session)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while still_there(pids):
        assert loop.time() < deadline, "the watch outlived its session"
        await asyncio.sleep(0.05)


async def test_a_watch_started_once_its_loop_gave_up_is_stopped(session, cookie, monkeypatch):
    # A test's (or a worker's) event loop that closes cancels the early checkpoint's task
    # while its tool is being started on a thread: the tool must not watch on for 15 min.
    entered, gate, started = threading.Event(), threading.Event(), []
    real = Workspace.watched_checkpoint

    def held(workspace, message, seconds):
        entered.set()
        gate.wait(30)
        taken = real(workspace, message, seconds)
        started.extend(watching(session))
        return taken

    monkeypatch.setattr(Workspace, "watched_checkpoint", held)
    comm, _ = await open_socket(session.pk, cookie)
    await start_agent(comm)
    assert await asyncio.to_thread(entered.wait, 30)
    early = runners.get(session.pk).checkpoints._early
    early.cancel()
    with pytest.raises(asyncio.CancelledError):
        await early
    gate.set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not started or still_there(started):
        assert loop.time() < deadline, "the watch outlived the task that was to take it"
        await asyncio.sleep(0.05)
    await comm.disconnect()
