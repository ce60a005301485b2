"""A real third-party ACP agent, opencode, through Craft: a turn, a SIGKILL, and a reattach.

Opt in: `make realagent` installs the pinned opencode (tests/realagent/package.json and its
lock file) and `make test` then runs these; by hand, `.venv/bin/pytest -m realagent`. They
are skipped when opencode is not installed. Nothing is downloaded while they run: opencode
talks to a fake OpenAI-compatible model on loopback (tests/agents/fake_model.py), which
answers "recall" from the conversation it is sent, so a right answer proves that opencode
got its context back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from craft.storage.db import db_sync_to_async
from tests.agents.fake_model import opencode_config
from tests.ready import open_ready_session

from ..craft.wsclient import open_socket, session_cookie
from .common import (
    NODE_PATH,
    agent_connection,
    agent_name,
    kill,
    realagent_marks,
    recall_mango,
    turn,
    use_agent,
    workspace_of,
)

OPENCODE = Path(__file__).parent / "node_modules" / ".bin" / "opencode"

pytestmark = realagent_marks(OPENCODE, "opencode")


@pytest.fixture
def opencode(settings, fake_model):
    use_agent(
        settings,
        [str(OPENCODE), "acp"],
        # Node for opencode's launcher; no update checks, no model list from the network.
        PATH=NODE_PATH,
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
    )
    return fake_model


def configure(workspace: Path, model_url: str) -> None:
    """Point opencode at the fake model (its project configuration, in the workspace)."""
    workspace.mkdir(parents=True, exist_ok=True)  # before the agent's first start makes it
    (workspace / "opencode.json").write_text(json.dumps(opencode_config(model_url)))


async def test_opencode_runs_a_turn_is_killed_and_is_reattached_with_its_memory(owner, opencode):
    session = await db_sync_to_async(open_ready_session)(owner, "opencode")
    configure(workspace_of(session), opencode.url)
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})

    frames, reply = await turn(comm, "o1", "remember mango")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}, frames[-3:]
    assert reply == "I will remember mango."
    assert agent_name(frames) == "OpenCode"

    connection = agent_connection(session)
    can_resume = connection.can_resume
    await kill(connection)

    # Nothing opencode replayed is stored again.
    await recall_mango(comm, session, "o", "resume" if can_resume else "load")
    await comm.disconnect()
