"""Going back with a real agent, Claude Code (claude-agent-acp), over the API.

A fork and a rewind of a conversation with Claude Code (against the fake Anthropic API,
tests/agents/fake_vendors.py, which remembers and recalls words from what it is sent), the
workspace checked file by file. Claude Code offers ACP's `session/fork`; Craft does not use
it yet: the fork's (and the rewound session's) new agent session is given the transcript of
the turns kept (docs/workbench.md), and Claude Code answers from it. Run as root with sandbox
users, the jail and the sandbox's network on, as the other realagent tests.
"""

from __future__ import annotations

import json

from django.test import AsyncClient

from craft.models import Session
from craft.storage.db import db_sync_to_async

from .common import realagent_marks, start_session, turn, turn_allowing, workspace_of
from .test_claude_code import CLAUDE, claude_code  # noqa: F401 (a fixture)

pytestmark = realagent_marks(CLAUDE, "Claude Code (claude-agent-acp)")


def files_of(session) -> dict[str, str]:
    folder = workspace_of(session)
    return {
        path.relative_to(folder).as_posix(): path.read_text()
        for path in folder.rglob("*")
        if path.is_file() and not path.relative_to(folder).parts[0].startswith(".")
    }


async def post(client: AsyncClient, session, how: str, body: dict) -> tuple[int, dict]:
    answer = await client.post(
        f"/api/sessions/{session.pk}/{how}/", json.dumps(body), content_type="application/json"
    )
    return answer.status_code, answer.json()


async def test_claude_code_forks_and_rewinds_and_its_next_answers_know_only_the_turns_kept(
    owner,
    claude_code,  # noqa: F811
):
    session, comm = await start_session(owner, "claude going back")
    _, reply = await turn(comm, "g1", "remember mango")
    assert reply == "I will remember mango."
    await turn_allowing(comm, "g2", "write notes.txt mango")
    first = await db_sync_to_async(_seq_of)(session, "write notes.txt mango")
    _, reply = await turn(comm, "g3", "remember kiwi")
    assert reply == "I will remember kiwi."
    await turn_allowing(comm, "g4", "write notes.txt kiwi")
    assert files_of(session) == {"notes.txt": "kiwi\n"}

    client = AsyncClient()
    await client.aforce_login(owner)
    status, answer = await post(client, session, "fork", {"seq": first})
    assert status == 201, answer
    fork = await db_sync_to_async(Session.objects.select_related("sandbox").get)(pk=answer["id"])
    assert files_of(fork) == {"notes.txt": "mango\n"}
    assert files_of(session) == {"notes.txt": "kiwi\n"}
    fork_comm = await _socket(owner, fork)
    _, reply = await turn(fork_comm, "f1", "recall")
    assert reply == "You asked me to remember: mango."
    await fork_comm.disconnect()

    # The original's agent knows both; rewound to the first write, only mango.
    _, reply = await turn(comm, "g5", "recall")
    assert reply == "You asked me to remember: mango kiwi."
    status, answer = await post(client, session, "rewind", {"seq": first})
    assert status == 200, answer
    assert files_of(session) == {"notes.txt": "mango\n"}
    _, reply = await turn(comm, "g6", "recall")
    assert reply == "You asked me to remember: mango."
    await comm.disconnect()


def _seq_of(session, text: str) -> int:
    from craft.models import Event

    return Event.objects.get(session=session, kind="user_message", data__text=text).seq


async def _socket(owner, session):
    """The session's websocket, following it from its last event (a fork's copied turns
    are not this test's)."""
    from ..craft.wsclient import open_socket, session_cookie

    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": session.last_seq})
    return comm
