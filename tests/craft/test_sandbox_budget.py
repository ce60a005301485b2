"""What a person sees of their sandbox's budget: a turn ended by the memory limit, and
prompts refused while the sandbox's files take more disk than it may have.

Real agents as sandbox users in their jail, the real consumer, runner and reaper: the hostile
agent allocates past its sandbox's memory; files past `CRAFT_SANDBOX_DISK` are written into a
session's workspace and measured by the reaper's pass.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from craft import services as craft_services
from craft.models import Session
from craft.session_activity import session_activity
from craft.storage.db import db_sync_to_async
from sandboxes import reaper
from sandboxes.agent.connections import agent_connections
from tests.ready import open_ready_session
from tests.sandboxes.hostile import contain, needs_root

from .logs import stored_log
from .wsclient import is_turn_end, open_socket, receive_until, session_cookie

pytestmark = [needs_root, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

MiB = 1 << 20


async def prompt(comm, prompt_id: str, text: str) -> list[dict]:
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
    return await receive_until(comm, lambda f: is_turn_end(f) or f["type"] == "error", 60)


async def test_an_agent_out_of_memory_ends_its_turn_saying_so_and_the_next_prompt_works(
    settings, machine, owner
):
    contain(settings, "on")
    settings.CRAFT_SANDBOX_MEMORY = 256 * MiB
    session = await db_sync_to_async(open_ready_session)(owner, "memory")
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})

    frames = await prompt(comm, "p1", "hog 1024")
    ending = [(f["kind"], f["data"]) for f in frames[-2:]]
    assert ending == [
        ("agent_error", {"message": "the agent ran out of memory (limit 256 MiB)"}),
        ("turn_end", {"stop_reason": "error"}),
    ]
    frames = await prompt(comm, "p2", "hello again")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    chunks = [f["data"]["content"] for f in frames if f.get("kind") == "agent_message_chunk"]
    assert {"type": "text", "text": "hostile: hello again"} in chunks
    await comm.disconnect()


def fill(workspace: Path, size: int) -> Path:
    """Write `size` bytes of data (no sparse holes) into a session's workspace, as its
    agent would: the folder and the file belong to the sandbox's user."""
    uid = workspace.parent.parent.stat().st_uid
    workspace.mkdir(mode=0o700)
    os.chown(workspace, uid, uid)
    path = workspace / "big.bin"
    with open(path, "wb") as handle:
        for _ in range(size // MiB):
            handle.write(os.urandom(MiB))
    os.chown(path, uid, uid)
    return path


async def test_past_its_disk_limit_a_sandbox_takes_no_new_prompt_and_nothing_is_deleted(
    settings, machine, owner
):
    contain(settings, "on")
    settings.CRAFT_SANDBOX_DISK = 2 * MiB
    session = await db_sync_to_async(open_ready_session)(owner, "disk")
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    frames = await prompt(comm, "p1", "hello")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}  # its agent runs

    # Another session of the owner fills the sandbox; the reaper's pass measures it.
    filler = await db_sync_to_async(open_ready_session)(owner, "filler")
    big = await asyncio.to_thread(
        fill, Path(session.sandbox.reference) / "sessions" / str(filler.pk), 3 * MiB
    )
    await db_sync_to_async(reaper.reap_sandboxes)(session_activity)
    log = await stored_log(session)

    # Refused while its agent runs, and once it is stopped (a prompt that would start one).
    for prompt_id in ("p2", "p3"):
        frames = await prompt(comm, prompt_id, "write more")
        assert frames[-1]["type"] == "error"
        assert frames[-1]["code"] == "disk_full"
        message = frames[-1]["message"]
        # Measured as `du` counts it: the file's blocks and those of its folders.
        assert message.startswith("Your sandbox's files take 3.")
        assert "MiB of disk, over its limit of 2 MiB" in message
        assert "deleting sessions you no longer need" in message
        await db_sync_to_async(agent_connections.stop_session)(session.sandbox_id, session.pk)
    assert await stored_log(session) == log  # nothing stored
    assert (await asyncio.to_thread(big.stat)).st_size == 3 * MiB  # nothing deleted

    # Deleting the session that holds the files frees the sandbox at the next pass.
    delete = lambda: craft_services.delete_session(Session.objects.get(pk=filler.pk))  # noqa: E731
    await db_sync_to_async(delete)()
    await db_sync_to_async(reaper.reap_sandboxes)(session_activity)
    frames = await prompt(comm, "p4", "hello again")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()
