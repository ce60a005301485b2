"""What the real-agent tests share: a turn through the websocket, and the stored log."""

from __future__ import annotations

from craft.models import Event
from craft.storage.db import db_sync_to_async

from ..craft.wsclient import is_turn_end, receive_until


@db_sync_to_async
def log_of(session) -> list[tuple[str, dict]]:
    return [(e.kind, e.data) for e in Event.objects.filter(session=session).order_by("seq")]


async def turn(comm, prompt_id: str, text: str) -> tuple[list[dict], str]:
    """Send a prompt; return the frames up to its turn's end, and the agent's reply text."""
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
    frames = await receive_until(comm, is_turn_end, timeout=180)
    reply = "".join(
        f["data"]["content"].get("text", "")
        for f in frames
        if f.get("kind") == "agent_message_chunk" and isinstance(f["data"].get("content"), dict)
    )
    return frames, reply
