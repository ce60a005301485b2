"""A real third-party ACP agent, Gemini CLI (`gemini --acp`), through Craft.

It answers, runs a shell command and writes a file once a person allowed it, is cancelled mid
turn, and is killed and reattached with its memory. `make test` installs (`make realagent`) the
version pinned in tests/realagent/package.json and runs these as root, with sandbox users, the
jail and the sandbox's network on; by hand, `.venv/bin/pytest -m realagent`. They are skipped
when it is not installed. Nothing is downloaded while they run: Gemini CLI talks to a fake
Gemini API on loopback (tests/agents/fake_vendors.py), which calls Gemini CLI's own
`run_shell_command` and `write_file` tools as the real API would, and answers its side
questions (which model to route to, who speaks next) as the schema it sends asks.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from .common import (
    NODE_PATH,
    agent_name,
    cancelled_mid_turn_then_answered,
    kill,
    kinds_and_data,
    realagent_marks,
    remember_mango,
    restarts,
    start_session,
    stored_prompts,
    tool_cards,
    turn,
    turn_allowing,
    use_agent,
    workspace_of,
    write_in_sandbox,
)

GEMINI = Path(__file__).parent / "node_modules" / ".bin" / "gemini"

pytestmark = realagent_marks(GEMINI, "Gemini CLI")

# Its user settings (in the sandbox's home): no usage statistics, which it would send to
# Google, no update checks, and the API key as the way in (no login prompt).
SETTINGS = {
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "security": {"auth": {"selectedType": "gemini-api-key"}},
}


@pytest.fixture
def gemini(settings, fake_vendors):
    use_agent(
        settings,
        [str(GEMINI), "--acp"],
        PATH=NODE_PATH,
        GEMINI_API_KEY="fake",
        GOOGLE_GEMINI_BASE_URL=fake_vendors.url,
        GEMINI_TELEMETRY_ENABLED="false",
        # The session's workspace is trusted (an untrusted folder refuses "Allow for this
        # session" and skips project settings).
        GEMINI_CLI_TRUST_WORKSPACE="true",
        # One process: it would otherwise start itself again with a larger heap, and a
        # SIGKILL would leave that child behind.
        GEMINI_CLI_NO_RELAUNCH="true",
    )
    return fake_vendors


async def start_gemini(owner, title: str):
    session, comm = await start_session(owner, title)
    # Before the agent's first start.
    write_in_sandbox(session, "home/.gemini/settings.json", json.dumps(SETTINGS))
    return session, comm


async def test_gemini_cli_runs_a_command_and_writes_a_file_once_allowed(owner, gemini):
    session, comm = await start_gemini(owner, "gemini")

    frames, reply = await turn(comm, "g1", "hello there")
    assert reply == "Echo: hello there"
    assert agent_name(frames) == "gemini-cli"

    frames, reply = await turn_allowing(comm, "g2", "run: mkdir -p made && echo made-it")
    (request,) = [f["data"] for f in frames if f.get("kind") == "permission_request"]
    assert request["toolCall"]["kind"] == "execute"
    (card,) = tool_cards(frames).values()
    assert card["kind"] == "execute" and card["status"] == "completed"
    assert card["title"] == "mkdir -p made && echo made-it"
    # Gemini CLI 0.61.0 sends the command's output to the model only: the card's content
    # is empty (its shell result has no text to show), and the reply carries the output.
    assert card["content"] == []
    assert "made-it" in reply
    assert (workspace_of(session) / "made").is_dir()

    frames, reply = await turn_allowing(comm, "g3", "write notes.txt hello from gemini")
    (card,) = tool_cards(frames).values()
    assert card["kind"] == "edit" and card["status"] == "completed"
    (diff,) = card["content"]
    assert diff["type"] == "diff" and diff["newText"] == "hello from gemini\n"
    assert diff["path"].endswith("/notes.txt") and diff["oldText"] == ""
    assert (workspace_of(session) / "notes.txt").read_text() == "hello from gemini\n"
    assert reply.startswith("The tool said:")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()


async def test_gemini_cli_is_cancelled_mid_turn(owner, gemini):
    _, comm = await start_gemini(owner, "gemini")
    await cancelled_mid_turn_then_answered(comm, "g")
    await comm.disconnect()


async def test_gemini_cli_is_killed_and_reloaded_with_its_memory(owner, gemini):
    session, comm = await start_gemini(owner, "gemini")
    connection = await remember_mango(comm, session, "g")
    assert (connection.can_resume, connection.can_load) == (False, True)
    await kill(connection)
    # Gemini CLI 0.61.0 names a chat's file after the minute it started in, and session/load
    # first starts a recording under the loaded id: in that same minute, that is the same
    # file, emptied, and the load fails ("No previous sessions found for this project").
    # A load in a later minute works; wait for one.
    await asyncio.sleep(61 - time.time() % 60)

    frames, reply = await turn(comm, "g2", "recall")
    assert restarts(frames) == ["load"], kinds_and_data(frames)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    # It remembers. But Gemini CLI 0.61.0 answers session/load before it has replayed the
    # conversation (it does not wait for its own replay, which the protocol asks it to):
    # the replay's tail comes after the answer, and Craft stores it as the new turn's.
    recalled = "You asked me to remember: mango."
    assert reply.endswith(recalled)
    assert reply.removesuffix(recalled) in ("", "I will remember mango.")
    prompts, replayed = await stored_prompts(session)
    assert replayed in ([], ["remember mango"])
    assert prompts == ["remember mango", "recall"]
    await comm.disconnect()
