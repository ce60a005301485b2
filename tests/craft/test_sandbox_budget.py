"""What a person sees of their sandbox's budget: a turn ended by the memory limit.

Real agents as sandbox users in their jail, the real consumer and runner: the hostile agent
allocates past its sandbox's memory.
"""

from __future__ import annotations

import pytest

from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session
from tests.sandboxes.hostile import contain, needs_root

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
