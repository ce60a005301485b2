"""The workspace's host path never leaves the server for a non-staff user; staff see it.

Agents report absolute paths (tool call locations, file links, errors); the local backend's
workspaces live under the server's own sandbox folder. The page, the websocket and the HTTP
events API show a person who is not staff `/workspace` in its place (craft.workspace_paths).
"""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events
from sandboxes.services import workspace_path
from tests.ready import open_ready_session

from ..wsclient import is_turn_end, open_socket, receive_until, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

NEUTRAL = "/workspace"  # what a person sees instead of the workspace's host path


def events_naming(session, workspace, earlier):
    """Events that carry the session's workspace path, as agents write them, and the path of
    the folder it had in an earlier sandbox (a session moves when its sandbox is stopped)."""
    said = f"see file://{workspace}/notes.txt and {earlier}/old.txt"
    return [
        ("user_message", {"id": "p1", "text": "read notes.txt"}),
        ("tool_call", {"toolCallId": "c1", "title": f"Read {workspace}/notes.txt",
                       "locations": [{"path": f"{workspace}/notes.txt"}]}),
        ("agent_message_chunk", {"content": {"type": "text", "text": said}}),
        ("agent_error", {"message": f"could not open {workspace}/missing.txt"}),
        ("turn_end", {"stop_reason": "error"}),
    ]  # fmt: skip


def earlier_folder(session):
    return f"/srv/elsewhere/old-sandbox/sessions/{session.pk}"


def test_the_page_and_the_events_api_show_the_host_path_to_staff_only(client, owner, staff):
    session = open_ready_session(owner)
    workspace = workspace_path(session.sandbox, session.pk)
    assert workspace.startswith(session.sandbox.reference)
    append_events(session.pk, events_naming(session, workspace, earlier_folder(session)))
    client.force_login(owner)

    page = client.get(reverse("session", args=[session.pk])).content.decode()
    assert f'data-workspace="{NEUTRAL}"' in page
    assert session.sandbox.reference not in page

    events = client.get(reverse("api_session_events", args=[session.pk])).content.decode()
    one = client.get(reverse("api_session_event", args=[session.pk, 3])).content.decode()
    for body in (events, one):
        assert session.sandbox.reference not in body
        assert "/srv/elsewhere" not in body
        assert f"file://{NEUTRAL}/notes.txt and {NEUTRAL}/old.txt" in body
    data = json.loads(events)["events"]
    assert data[1]["data"]["locations"] == [{"path": f"{NEUTRAL}/notes.txt"}]
    assert data[1]["data"]["title"] == f"Read {NEUTRAL}/notes.txt"
    assert data[3]["data"]["message"] == f"could not open {NEUTRAL}/missing.txt"

    # Staff see the real path in their own sessions.
    theirs = open_ready_session(staff)
    real = workspace_path(theirs.sandbox, theirs.pk)
    append_events(theirs.pk, events_naming(theirs, real, earlier_folder(theirs)))
    client.force_login(staff)
    page = client.get(reverse("session", args=[theirs.pk])).content.decode()
    assert f'data-workspace="{real}"' in page
    events = client.get(reverse("api_session_events", args=[theirs.pk])).json()["events"]
    assert events[1]["data"]["locations"] == [{"path": f"{real}/notes.txt"}]


async def turn_frames(user, text):
    """Run one turn of the real demo agent in a new session of `user`; return the session,
    its workspace and the frames its socket received, as JSON text."""
    session = await db_sync_to_async(open_ready_session)(user)
    workspace = await db_sync_to_async(workspace_path)(session.sandbox, session.pk)
    comm, hello = await open_socket(session.pk, await db_sync_to_async(session_cookie)(user))
    await comm.send_json_to({"type": "resume", "after": 0})
    prompt = {"type": "prompt", "id": "p1", "text": text,
              "attachments": [{"type": "file", "path": "notes.txt"}]}  # fmt: skip
    await comm.send_json_to(prompt)
    frames = await receive_until(comm, is_turn_end)
    await comm.disconnect()
    return session, workspace, json.dumps([hello, *frames])


@pytest.mark.asyncio
async def test_a_real_turn_s_frames_carry_the_host_path_to_staff_only(owner, staff):
    session, _, frames = await turn_frames(owner, "read notes.txt")
    assert session.sandbox.reference not in frames
    assert '"locations": [{"path": "/workspace/notes.txt"}]' in frames
    assert "file:///workspace/notes.txt" in frames  # the link the agent was sent

    _, workspace, frames = await turn_frames(staff, "read notes.txt")
    assert f'"locations": [{{"path": "{workspace}/notes.txt"}}]' in frames
