"""What the real-agent tests share: turns through the websocket (permissions answered, a
cancel), the tool call cards they showed, and the stored log."""

from __future__ import annotations

from pathlib import Path

from craft.models import Event
from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from ..craft.wsclient import is_turn_end, open_socket, receive_until, session_cookie


@db_sync_to_async
def log_of(session) -> list[tuple[str, dict]]:
    return [(e.kind, e.data) for e in Event.objects.filter(session=session).order_by("seq")]


async def turn(comm, prompt_id: str, text: str) -> tuple[list[dict], str]:
    """Send a prompt; return the frames up to its turn's end, and the agent's reply text."""
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
    frames = await receive_until(comm, is_turn_end, timeout=180)
    return frames, reply_of(frames)


def is_permission_request(frame: dict) -> bool:
    return frame.get("type") == "event" and frame.get("kind") == "permission_request"


async def turn_allowing(comm, prompt_id: str, text: str) -> tuple[list[dict], str]:
    """Send a prompt and answer each permission request it raises with the agent's
    `allow_once` option, as a person pressing Allow; return the frames up to the turn's end
    and the agent's reply text."""
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
    frames: list[dict] = []
    while not frames or not is_turn_end(frames[-1]):
        frames += await receive_until(
            comm, lambda f: is_turn_end(f) or is_permission_request(f), timeout=180
        )
        if is_permission_request(frames[-1]):
            request = frames[-1]["data"]
            (allow,) = [o for o in request["options"] if o["kind"] == "allow_once"]
            await comm.send_json_to(
                {"type": "permission", "request": request["request"], "option": allow["optionId"]}
            )
    return frames, reply_of(frames)


def reply_of(frames: list[dict]) -> str:
    return "".join(
        f["data"]["content"].get("text", "")
        for f in frames
        if f.get("kind") == "agent_message_chunk" and isinstance(f["data"].get("content"), dict)
    )


def tool_cards(frames: list[dict]) -> dict[str, dict]:
    """Fold the tool_call and tool_call_update events into one card per tool call, as the
    page does: each update's fields replace the card's (content included)."""
    cards: dict[str, dict] = {}
    for frame in frames:
        if frame.get("kind") in ("tool_call", "tool_call_update"):
            data = frame["data"]
            cards.setdefault(data["toolCallId"], {}).update(data)
    return cards


async def cancel_a_slow_turn(comm, prompt_id: str) -> list[dict]:
    """Prompt `slow` (the fake model then streams a word every quarter second), cancel once
    the first words arrived, and return the frames up to the turn's end."""
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": "slow"})
    frames = await receive_until(comm, lambda f: "Slowly" in reply_of([f]), timeout=120)
    await comm.send_json_to({"type": "cancel"})
    frames += await receive_until(comm, is_turn_end, timeout=60)
    return frames


async def start_session(owner, title: str):
    """Open a session in a ready sandbox and its websocket; return both."""
    session = await db_sync_to_async(open_ready_session)(owner, title)
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    return session, comm


def workspace_of(session) -> Path:
    return Path(session.sandbox.reference) / "sessions" / str(session.pk)


def live_output(frames: list[dict], tool_call_id: str) -> tuple[list[str], int]:
    """Return the live output chunks (`_meta.terminal_output.data`) of a tool call, in order,
    and how many of them came before the update that completed it."""
    chunks: list[str] = []
    before = None
    for frame in frames:
        data = frame.get("data") or {}
        if frame.get("kind") not in ("tool_call", "tool_call_update"):
            continue
        if data.get("toolCallId") != tool_call_id:
            continue
        output = (data.get("_meta") or {}).get("terminal_output")
        if isinstance(output, dict):
            chunks.append(output.get("data", ""))
        if data.get("status") == "completed" and before is None:
            before = len(chunks)
    return chunks, len(chunks) if before is None else before
