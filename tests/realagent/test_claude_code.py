"""A real third-party ACP agent, Claude Code (claude-agent-acp), through Craft.

It answers, runs a shell command and writes a file once a person allowed it, is cancelled mid
turn, and is killed and reattached with its memory. `make test` installs (`make realagent`) the
adapter pinned in tests/realagent/package.json (it brings the Claude Agent SDK, and Claude Code
itself as a native binary from the SDK's platform dependency) and runs these as root, with
sandbox users, the jail and the sandbox's network on; by hand, `.venv/bin/pytest -m realagent`.
They are skipped when it is not installed. Nothing is downloaded while they run: Claude Code
talks to a fake Anthropic Messages API on loopback (tests/agents/fake_vendors.py), which calls
Claude Code's own `Bash` and `Write` tools as the real API would.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from .common import (
    NODE_PATH,
    agent_name,
    as_the_page_reads,
    cancelled_mid_turn_then_answered,
    kill,
    live_output,
    realagent_marks,
    recall_mango,
    remember_mango,
    start_session,
    tool_cards,
    turn,
    turn_allowing,
    use_agent,
    workspace_of,
)

CLAUDE = Path(__file__).parent / "node_modules" / ".bin" / "claude-agent-acp"

pytestmark = realagent_marks(CLAUDE, "Claude Code (claude-agent-acp)")


@pytest.fixture
def claude_code(settings, fake_vendors):
    use_agent(
        settings,
        [str(CLAUDE)],
        # Node for the adapter (Claude Code, which it starts, is a native binary).
        PATH=NODE_PATH,
        ANTHROPIC_BASE_URL=fake_vendors.url,
        ANTHROPIC_API_KEY="sk-ant-fake",
        # No update checks, telemetry, error reports or other calls home.
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
    )
    return fake_vendors


async def saved(session, agent_session_id: str, text: str, timeout: float = 15) -> None:
    """Wait until Claude Code's transcript of the session (in the sandbox's home) holds `text`."""
    projects = Path(session.sandbox.reference) / "home" / ".claude" / "projects"
    deadline = time.monotonic() + timeout
    while not any(text in t.read_text() for t in projects.glob(f"*/{agent_session_id}.jsonl")):
        assert time.monotonic() < deadline, f"no transcript holding {text!r} in {projects}"
        await asyncio.sleep(0.1)


async def test_claude_code_runs_a_command_and_writes_a_file_once_allowed(owner, claude_code):
    session, comm = await start_session(owner, "claude")

    frames, reply = await turn(comm, "c1", "hello there")
    assert reply == "Echo: hello there"
    assert agent_name(frames) == "@agentclientprotocol/claude-agent-acp"

    # Claude Code runs read-only commands (echo, ls) without asking: this one writes.
    command = "mkdir -p made && for i in 1 2 3; do echo tick$i; sleep 1; done"
    frames, reply = await turn_allowing(comm, "c2", f"run: {command}")
    assert [f for f in frames if f.get("kind") == "permission_answer"], "no permission asked"
    ((call_id, card),) = tool_cards(frames).items()
    assert card["kind"] == "execute" and card["status"] == "completed"
    assert card["rawInput"]["command"] == command
    # A terminal stands for the output, which comes in the tool call's _meta
    # (terminal_output): all of it in one piece as the command ends, not line by line.
    assert card["content"] == [{"type": "terminal", "terminalId": call_id}]
    assert card["_meta"]["terminal_exit"]["exit_code"] == 0
    chunks, before_the_end = live_output(frames, call_id)
    assert chunks == ["tick1\ntick2\ntick3"] and before_the_end == 1
    assert reply == "The tool said: tick1\ntick2\ntick3"
    assert (workspace_of(session) / "made").is_dir()

    frames, reply = await turn_allowing(comm, "c3", "write notes.txt hello from claude")
    (card,) = tool_cards(frames).values()
    assert card["kind"] == "edit" and card["status"] == "completed"
    (request,) = [f["data"] for f in frames if f.get("kind") == "permission_request"]
    (diff,) = card["content"]
    assert request["toolCall"]["content"] == [diff]
    assert diff["type"] == "diff" and diff["newText"] == "hello from claude\n"
    assert diff["path"].endswith("/notes.txt") and diff["oldText"] is None
    assert (workspace_of(session) / "notes.txt").read_text() == "hello from claude\n"
    assert reply.startswith("The tool said: File created successfully")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()


async def test_claude_code_is_cancelled_mid_turn(owner, claude_code):
    _, comm = await start_session(owner, "claude")
    await cancelled_mid_turn_then_answered(comm, "c")
    await comm.disconnect()


async def test_claude_code_is_killed_and_reattached_with_its_memory(owner, claude_code):
    session, comm = await start_session(owner, "claude")
    connection = await remember_mango(comm, session, "c")
    assert (connection.can_resume, connection.can_load) == (True, True)
    # Claude Code writes its transcript a moment after the turn: killed before that, it has
    # no session to resume ("Resource not found", seen once in a dozen runs) and Craft
    # starts it fresh. This test is about a kill once the turn is kept.
    await saved(session, connection.agent_session_id, "I will remember mango.")
    await kill(connection)
    await recall_mango(comm, session, "c", "resume")
    await comm.disconnect()


async def test_a_wrong_key_makes_claude_code_retry_then_the_page_says_the_key_was_refused(
    owner, claude_code, settings
):
    """Claude Code retries a refused key (about 3 minutes with its default 10 retries; 4
    here) and says so only at the end: its ACP adapter (0.49.0) starts Claude Code with its
    stderr ignored and drops its `api_retry` messages, so nothing reaches the adapter's
    stderr and the quiet turn's status has nothing to show (checked: a later adapter that
    writes its retries would fail this test, and then shows them). The end reads, on the
    page, as a refused key, not as Craft's own error."""
    claude_code.server.refused_keys.add("sk-ant-fake")
    settings.CRAFT_AGENT_ENV = {**settings.CRAFT_AGENT_ENV, "CLAUDE_CODE_MAX_RETRIES": "4"}
    settings.CRAFT_AGENT_QUIET_SECONDS = 0.5
    _, comm = await start_session(owner, "claude")
    frames, _ = await turn(comm, "k1", "hello")
    asked = [path for path, _ in claude_code.requests if "/v1/messages" in path]
    assert len(asked) == 5, "a first call and four retries"
    assert [f for f in frames if f["type"] == "agent_stderr"] == []
    (error,) = [f["data"] for f in frames if f.get("kind") == "agent_error"]
    assert error == {
        "message": "Internal error: Invalid API key · Fix external API key (code -32603)"
    }
    assert frames[-1]["data"] == {"stop_reason": "error"}
    assert as_the_page_reads(error)["summary"] == "The model provider refused your API key."
    await comm.disconnect()
