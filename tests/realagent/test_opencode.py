"""A real third-party ACP agent, opencode, through Craft, as root with sandbox users, the jail
and the sandbox's network on: a turn, a shell command and a file written once a person
allowed them, a cancel mid turn, a follow-up, and a SIGKILL and a reattach.

`make test` installs the pinned opencode (tests/realagent/package.json) and runs these; by
hand, `.venv/bin/pytest -m realagent tests/realagent/test_opencode.py`. Nothing is downloaded
while they run: opencode talks to a fake OpenAI-compatible API on loopback
(tests/agents/fake_vendors.py), allowed to its sandbox, which answers "recall" from the
conversation it is sent (so a right answer proves that opencode got its context back) and
calls opencode's own `bash` and `write` tools as a real model would. opencode serves its own
API on the sandbox's loopback and talks to it: under the network rule without a network of
the sandbox's own, it could not open a session at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agents.fake_model import opencode_config

from .common import (
    NODE_PATH,
    agent_connection,
    agent_name,
    cancelled_mid_turn_then_answered,
    kill,
    realagent_marks,
    recall_mango,
    start_session,
    tool_cards,
    turn,
    turn_allowing,
    use_agent,
    workspace_of,
    write_in_sandbox,
)

OPENCODE = Path(__file__).parent / "node_modules" / ".bin" / "opencode"

pytestmark = realagent_marks(OPENCODE, "opencode")


@pytest.fixture
def opencode(settings, fake_vendors):
    use_agent(
        settings,
        [str(OPENCODE), "acp"],
        # Node for opencode's launcher; no update checks, no model list from the network.
        PATH=NODE_PATH,
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
    )
    return fake_vendors


async def start_opencode(owner, fake, title: str):
    """Open a session whose workspace points opencode at the fake API (its project
    configuration), asking before it runs a command or edits a file."""
    session, comm = await start_session(owner, title)
    config = {**opencode_config(f"{fake.url}/v1"), "permission": {"bash": "ask", "edit": "ask"}}
    write_in_sandbox(session, f"sessions/{session.pk}/opencode.json", json.dumps(config))
    return session, comm


async def test_opencode_runs_a_command_and_writes_a_file_once_allowed(owner, opencode):
    session, comm = await start_opencode(owner, opencode, "opencode")

    frames, reply = await turn(comm, "o1", "hello there")
    assert reply == "Echo: hello there", frames[-3:]
    assert agent_name(frames) == "OpenCode"

    frames, reply = await turn_allowing(comm, "o2", "run: mkdir -p made && echo tick")
    assert [f for f in frames if f.get("kind") == "permission_answer"], "no permission asked"
    (card,) = tool_cards(frames).values()
    assert card["kind"] == "execute" and card["status"] == "completed"
    assert reply.startswith("The tool said:") and "tick" in reply
    assert (workspace_of(session) / "made").is_dir()

    frames, reply = await turn_allowing(comm, "o3", "write notes.txt hello from opencode")
    assert [f for f in frames if f.get("kind") == "permission_answer"], "no permission asked"
    assert (workspace_of(session) / "notes.txt").read_text() == "hello from opencode\n"
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()


async def test_opencode_is_cancelled_mid_turn(owner, opencode):
    _, comm = await start_opencode(owner, opencode, "opencode")
    await cancelled_mid_turn_then_answered(comm, "o")
    await comm.disconnect()


async def test_opencode_runs_a_turn_is_killed_and_is_reattached_with_its_memory(owner, opencode):
    session, comm = await start_opencode(owner, opencode, "opencode")

    frames, reply = await turn(comm, "o1", "remember mango")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}, frames[-3:]
    assert reply == "I will remember mango."

    connection = agent_connection(session)
    can_resume = connection.can_resume
    await kill(connection)

    # Nothing opencode replayed is stored again.
    await recall_mango(comm, session, "o", "resume" if can_resume else "load")
    await comm.disconnect()
