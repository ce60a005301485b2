"""The agent's own controls and prompt attachments through the websocket API, end to end:
the real consumer, runner and demo agent, every state checked in the stored log."""

from __future__ import annotations

import base64

import pytest

from craft import services
from craft.commands import MAX_ATTACHMENTS, MAX_IMAGE_BYTES
from craft.models import Event, Session
from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from ..wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# A 1x1 transparent PNG.
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "")


@db_sync_to_async
def stored(session, kind: str) -> list[dict]:
    return [e.data for e in Event.objects.filter(session=session, kind=kind).order_by("seq")]


@db_sync_to_async
def title_of(session) -> str:
    return Session.objects.get(pk=session.pk).title


async def connected(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    return comm


async def turn(comm, prompt_id: str, text: str, **extra) -> tuple[list[dict], str]:
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text, **extra})
    frames = await receive_until(comm, is_turn_end)
    reply = "".join(
        f["data"]["content"]["text"] for f in frames if f.get("kind") == "agent_message_chunk"
    )
    return frames, reply


async def error(comm) -> dict:
    return (await receive_until(comm, lambda f: f["type"] == "error"))[-1]


async def event(comm, kind: str) -> dict:
    return (await receive_until(comm, lambda f: f.get("kind") == kind))[-1]["data"]


async def test_the_agent_s_controls_are_stored_when_it_starts(session, cookie):
    comm = await connected(session, cookie)
    await turn(comm, "a1", "hello")
    (info,) = await stored(session, "agent_info")
    assert info["agent"]["name"] == "craft-demo-agent"
    assert info["promptCapabilities"] == {"image": True, "audio": False, "embeddedContext": True}
    assert [(o["id"], o["currentValue"]) for o in info["configOptions"]] == [
        ("model", "fast"), ("mode", "ask"),
    ]  # fmt: skip
    assert info["modes"]["currentModeId"] == "ask"
    (commands,) = await stored(session, "available_commands_update")
    assert [c["name"] for c in commands["availableCommands"]][:3] == [
        "remember", "recall", "config",
    ]  # fmt: skip
    (usage,) = await stored(session, "usage_update")
    assert usage["size"] == 100_000 and usage["used"] > 0
    await comm.disconnect()


async def test_a_config_option_is_set_through_the_socket_and_the_agent_uses_it(session, cookie):
    comm = await connected(session, cookie)
    # No agent runs yet: setting an option starts it.
    await comm.send_json_to({"type": "set_config_option", "config": "model", "value": "careful"})
    update = await event(comm, "config_option_update")
    assert [o["currentValue"] for o in update["configOptions"]] == ["careful", "ask"]
    _, reply = await turn(comm, "c1", "config")
    assert reply == "Model: careful. Mode: ask."

    await comm.send_json_to({"type": "set_config_option", "config": "speed", "value": "x"})
    assert (await error(comm))["code"] == "unknown_config"
    await comm.send_json_to({"type": "set_config_option", "config": "model", "value": "huge"})
    assert (await error(comm))["code"] == "invalid_value"
    await comm.send_json_to({"type": "set_config_option", "config": "model"})
    assert (await error(comm))["code"] == "bad_frame"
    await comm.send_json_to({"type": "set_mode", "mode": "code"})
    assert await event(comm, "current_mode_update") == {
        "sessionUpdate": "current_mode_update", "currentModeId": "code"
    }  # fmt: skip
    _, reply = await turn(comm, "c2", "config")
    assert reply == "Model: careful. Mode: code."
    await comm.disconnect()


async def test_an_agent_with_modes_only_gets_set_mode(session, cookie, settings):
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent", "--controls", "modes"]
    comm = await connected(session, cookie)
    await turn(comm, "m1", "hello")
    (info,) = await stored(session, "agent_info")
    assert "configOptions" not in info and info["modes"]["currentModeId"] == "ask"
    await comm.send_json_to({"type": "set_config_option", "config": "mode", "value": "code"})
    assert (await error(comm))["code"] == "no_config_options"
    await comm.send_json_to({"type": "set_mode", "mode": "architect"})
    assert (await error(comm))["code"] == "unknown_mode"
    await comm.send_json_to({"type": "set_mode", "mode": "code"})
    await event(comm, "current_mode_update")
    _, reply = await turn(comm, "m2", "config")
    assert reply == "Model: fast. Mode: code."
    await comm.disconnect()


async def test_the_title_follows_the_agent_until_its_owner_renames_it(session, cookie):
    comm = await connected(session, cookie)
    frames, _ = await turn(comm, "t1", "title Tidy the garden")
    # The agent's title is stored once the update that named it is: before or after the
    # turn's end, whichever is stored first.
    titles = [f["data"] for f in frames if f.get("kind") == "session_title"]
    if not any(title["source"] == "agent" for title in titles):
        titles.append(await event(comm, "session_title"))
    assert titles[-1] == {"title": "Tidy the garden", "source": "agent"}
    assert await title_of(session) == "Tidy the garden"
    await db_sync_to_async(services.set_session_title)(session.pk, "Mine", "user")
    await turn(comm, "t2", "title Something else")
    assert await title_of(session) == "Mine"
    assert [t["source"] for t in await stored(session, "session_title")] == [
        "prompt", "agent", "user",
    ]  # fmt: skip
    await comm.disconnect()


async def test_every_permission_option_is_offered_by_its_own_name(session, cookie):
    comm = await connected(session, cookie)
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "ask"})
    request = await event(comm, "permission_request")
    assert [(o["name"], o["kind"]) for o in request["options"]] == [
        ("Yes, this time", "allow_once"),
        ("Yes, and don't ask again", "allow_always"),
        ("No, not this time", "reject_once"),
        ("No, and don't ask again", "reject_always"),
    ]
    await comm.send_json_to(
        {"type": "permission", "request": request["request"], "option": "never"}
    )
    frames = await receive_until(comm, is_turn_end)
    reply = "".join(
        f["data"]["content"]["text"] for f in frames if f.get("kind") == "agent_message_chunk"
    )
    assert reply == "You chose No, and don't ask again (reject_always)."
    await comm.disconnect()


async def test_files_go_as_resource_links_and_images_as_image_content(session, cookie):
    comm = await connected(session, cookie)
    attachments = [
        {"type": "file", "path": "notes/todo.txt"},
        {"type": "image", "mimeType": "image/png", "data": PIXEL, "name": "dot.png"},
    ]
    frames, reply = await turn(comm, "f1", "look", attachments=attachments)
    said = (
        "I received 2 attachment(s): link to todo.txt (file://{}/notes/todo.txt); "
        "image image/png (about 69 bytes).\nEcho: look"
    )
    # The agent was sent the workspace's real path; its owner (not staff) reads /workspace.
    assert reply == said.format("/workspace")
    workspace = f"{session.sandbox.reference}/sessions/{session.pk}"
    chunks = await stored(session, "agent_message_chunk")
    assert "".join(c["content"]["text"] for c in chunks) == said.format(workspace)
    assert frames[0]["data"] == {
        "id": "f1",
        "text": "look",
        "attachments": [
            {"type": "file", "path": "notes/todo.txt"},
            {"type": "image", "mimeType": "image/png", "name": "dot.png", "bytes": 68},
        ],
    }
    await comm.disconnect()


@pytest.mark.parametrize(
    ("attachments", "code"),
    [
        ([{"type": "file", "path": "../secret"}], "bad_attachment"),
        ([{"type": "file", "path": "/etc/passwd"}], "bad_attachment"),
        ([{"type": "sound", "data": "x"}], "bad_attachment"),
        ([{"type": "image", "mimeType": "image/png", "data": "not base64!"}], "bad_attachment"),
        ([{"type": "image", "mimeType": "text/html", "data": PIXEL}], "bad_attachment"),
        ([{"type": "file", "path": f"f{i}"} for i in range(MAX_ATTACHMENTS + 1)],
         "too_many_attachments"),
        ([{"type": "image", "mimeType": "image/png",
           "data": base64.b64encode(b"x" * (MAX_IMAGE_BYTES + 1)).decode()}],
         "attachment_too_large"),
        ("notes.txt", "bad_frame"),
    ],
)  # fmt: skip
async def test_attachments_that_do_not_fit_are_refused_and_nothing_is_stored(
    session, cookie, attachments, code
):
    comm = await connected(session, cookie)
    frame = {"type": "prompt", "id": "x1", "text": "hi", "attachments": attachments}
    await comm.send_json_to(frame)
    assert (await error(comm))["code"] == code
    assert await stored(session, "user_message") == []
    await comm.disconnect()


async def test_an_agent_without_images_never_gets_one(session, cookie, settings):
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent", "--no-images"]
    comm = await connected(session, cookie)
    image = [{"type": "image", "mimeType": "image/png", "data": PIXEL}]
    # Before the agent ever started, Craft does not know: the turn says why it failed.
    frames, _ = await turn(comm, "n1", "see this", attachments=image)
    assert [f["data"] for f in frames if f.get("kind") == "agent_error"] == [
        {"message": "this agent does not accept images"}
    ]
    assert frames[-1]["data"] == {"stop_reason": "error"}
    # Now it knows, and refuses the frame.
    await comm.send_json_to({"type": "prompt", "id": "n2", "text": "again", "attachments": image})
    assert (await error(comm))["code"] == "attachments_not_supported"
    await comm.disconnect()
