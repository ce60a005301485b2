"""A real third-party ACP agent, fast-agent, through Craft, as root with sandbox users, the
jail and the sandbox's network on: a turn, a tool of its MCP server run once a person allowed
it, a cancel mid turn, a follow-up, and a SIGKILL and a reattach.

`make test` installs the pinned fast-agent (FAST_AGENT_VERSION in the Makefile) into a Python
3.13 virtualenv at tests/realagent/fast-agent (its releases with an ACP server do not install
on this project's Python), with a Python sandbox users can run, and runs these; by hand,
`.venv/bin/pytest -m realagent tests/realagent/test_fast_agent.py`. Nothing is downloaded
while they run: fast-agent's "generic" (OpenAI-compatible) provider talks to a fake API on
loopback (tests/agents/fake_vendors.py), allowed to its sandbox, which answers "recall" from
the conversation it is sent (so a right answer proves that fast-agent got its context back)
and calls the `run_command` tool of the MCP server fast-agent starts beside it
(tests/agents/mcp_tools.py), as a real model would.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from craft.models import Session
from craft.storage.db import db_sync_to_async

from ..craft.wsclient import receive_until
from .common import (
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

FAST_AGENT = Path(__file__).parent / "fast-agent" / "bin" / "fast-agent"
MCP_TOOLS = Path(__file__).parent.parent / "agents" / "mcp_tools.py"

pytestmark = realagent_marks(FAST_AGENT, "fast-agent")


@pytest.fixture
def fast_agent(settings, fake_vendors):
    # The model "echo" of the generic provider, which reads its address and key from the
    # environment; the MCP server `tools` of its configuration file (in the workspace, written
    # by `start_fast_agent`); no startup network checks.
    use_agent(
        settings,
        [str(FAST_AGENT), "--no-update-check", "acp", "--model", "generic.echo",
         "--servers", "tools"],
        PATH="/usr/bin:/bin",
        GENERIC_BASE_URL=f"{fake_vendors.url}/v1",
        GENERIC_API_KEY="none",
    )  # fmt: skip
    return fake_vendors


async def start_fast_agent(owner, title: str):
    """Open a session whose workspace holds fast-agent's configuration, with one MCP server
    (tests/agents/mcp_tools.py: `run_command`), which fast-agent runs in the jail beside it."""
    session, comm = await start_session(owner, title)
    folder = f"sessions/{session.pk}"
    server = write_in_sandbox(session, f"{folder}/mcp_tools.py", MCP_TOOLS.read_text())
    config = (
        f"mcp:\n  servers:\n    tools:\n      command: /usr/bin/python3\n      args: [{server}]\n"
    )
    write_in_sandbox(session, f"{folder}/fastagent.config.yaml", config)
    return session, comm


@db_sync_to_async
def title_of(session) -> str:
    return Session.objects.get(pk=session.pk).title


def is_title(frame: dict) -> bool:
    return frame.get("kind") == "session_title"


async def test_fast_agent_runs_a_turn_is_killed_and_is_resumed_with_its_memory(owner, fast_agent):
    session, comm = await start_fast_agent(owner, "fast-agent")

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


async def test_fast_agent_asks_before_an_mcp_tool_runs_it_and_is_cancelled_mid_turn(
    owner, fast_agent
):
    """fast-agent asks a person before it uses a tool of its MCP servers (its own shell,
    `--shell`, would ask for nothing). The server and the command it runs are the sandbox's
    user's, in the jail, in the workspace."""
    session, comm = await start_fast_agent(owner, "fast-agent")
    frames, reply = await turn_allowing(comm, "f1", "run: mkdir -p made && id -u")
    assert [f for f in frames if f.get("kind") == "permission_answer"], "no permission asked"
    assert tool_cards(frames), "no tool call shown"
    uid = os.stat(workspace_of(session) / "made").st_uid
    assert reply.startswith("The tool said:") and str(uid) in reply
    assert uid == os.stat(session.sandbox.reference).st_uid != 0
    await cancelled_mid_turn_then_answered(comm, "g")
    await comm.disconnect()
