"""A real third-party ACP agent, fast-agent, through Craft: a turn, a SIGKILL, and a reattach.

Opt in: `make realagent` installs the pinned fast-agent (FAST_AGENT_VERSION in the Makefile)
into a Python 3.13 virtualenv at tests/realagent/fast-agent, as its releases with an ACP
server do not install on this project's Python; `make test` then runs these; by hand,
`.venv/bin/pytest -m realagent`. They are skipped when fast-agent is not installed. Nothing
is downloaded while they run: fast-agent's "generic" (OpenAI-compatible) provider talks to
the fake model on loopback (tests/agents/fake_model.py), which answers "recall" from the
conversation it is sent, so a right answer proves that fast-agent got its context back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from craft.models import Session
from craft.storage.db import db_sync_to_async

from ..craft.wsclient import receive_until
from .common import (
    agent_connection,
    agent_name,
    kill,
    realagent_marks,
    recall_mango,
    start_session,
    turn,
    use_agent,
    workspace_of,
)

FAST_AGENT = Path(__file__).parent / "fast-agent" / "bin" / "fast-agent"

pytestmark = realagent_marks(FAST_AGENT, "fast-agent")


@pytest.fixture
def fast_agent(settings, fake_model):
    # The model "echo" of the generic provider, which reads its address and key from the
    # environment (no configuration file needed); no startup network checks.
    use_agent(
        settings,
        [str(FAST_AGENT), "--no-update-check", "acp", "--model", "generic.echo"],
        PATH="/usr/bin:/bin",
        GENERIC_BASE_URL=fake_model.url,
        GENERIC_API_KEY="none",
    )
    return fake_model


@db_sync_to_async
def title_of(session) -> str:
    return Session.objects.get(pk=session.pk).title


def is_title(frame: dict) -> bool:
    return frame.get("kind") == "session_title"


async def test_fast_agent_runs_a_turn_is_killed_and_is_resumed_with_its_memory(owner, fast_agent):
    session, comm = await start_session(owner, "fast-agent")

    frames, reply = await turn(comm, "f1", "remember mango")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}, frames[-3:]
    assert reply == "I will remember mango."
    assert agent_name(frames) == "fast-agent-acp"
    # It names the session after the first prompt (session_info_update); Craft takes the
    # title in a task of its own, which may end after the turn.
    if not any(is_title(f) for f in frames):
        frames += await receive_until(comm, is_title, timeout=15)
    (title,) = [f["data"] for f in frames if is_title(f)]
    assert title == {"title": "remember mango", "source": "agent"}
    assert await title_of(session) == "remember mango"
    # It keeps its sessions in the workspace, which outlives the agent's process.
    assert (workspace_of(session) / ".fast-agent" / "sessions").is_dir()

    connection = agent_connection(session)
    assert (connection.can_resume, connection.can_load) == (True, True)
    await kill(connection)

    # fast-agent replays the conversation in answer to session/resume too; none of it is
    # stored again.
    await recall_mango(comm, session, "f", "resume")
    await comm.disconnect()
