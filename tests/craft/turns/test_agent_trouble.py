"""Agent trouble reaches the person in words: what an agent wrote to stderr goes with its error.

Real agent processes (a Node agent installed without one of its packages, a Python agent
whose import fails, one that crashes mid-turn, one that answers "Internal error" and logs
why), the real consumer, runner and writer; the log is read back whole.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.ready import open_ready_session

from ..logs import stored_log
from ..wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

AGENTS = Path(__file__).parent.parent.parent / "agents"
TROUBLED = [sys.executable, str(AGENTS / "troubled_agent.py")]
NODE = shutil.which("node")


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "trouble")


async def turn(session, cookie, text: str) -> list[dict]:
    """Send a prompt on a new socket; return the frames of its turn, up to its end."""
    log = await stored_log(session)
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": log[-1][0] if log else 0})
    await comm.send_json_to({"type": "prompt", "id": f"p{len(log)}", "text": text})
    frames = await receive_until(comm, is_turn_end, timeout=30)
    await comm.disconnect()
    return frames


def agent_error_of(frames: list[dict]) -> dict:
    (error,) = [f["data"] for f in frames if f.get("kind") == "agent_error"]
    assert frames[-1]["data"] == {"stop_reason": "error"}
    return error


@pytest.mark.skipif(NODE is None, reason="Node is not installed (make test installs it)")
async def test_a_node_agent_missing_a_package_says_which_not_the_end_of_its_stack(
    session, cookie, settings
):
    script = AGENTS / "broken_install_agent.mjs"
    settings.CRAFT_AGENT_COMMAND = [NODE, str(script)]
    error = agent_error_of(await turn(session, cookie, "hello"))
    missing = (
        "Cannot find package '@example/acp-agent-runtime-that-is-not-installed' "
        f"imported from {script}"
    )
    assert error["message"] == f"agent did not start: agent exited with code 1: {missing}"
    assert error["stderr_line"] == missing
    # The whole of what Craft kept, under Details: from Node's excerpt to its version.
    lines = error["stderr"].split("\n")
    assert lines[0] == "node:internal/modules/esm/resolve:873"
    assert f"Error [ERR_MODULE_NOT_FOUND]: {missing}" in lines
    assert "    at defaultResolve (node:internal/modules/esm/resolve:1188:11)" in lines
    assert lines[-1].startswith("Node.js v")


@pytest.mark.skipif(NODE is None, reason="Node is not installed (make test installs it)")
async def test_an_agent_that_cannot_start_ahead_of_the_first_prompt_says_why_at_once(
    session, cookie, settings
):
    # The page starts a new session's agent as it opens (`start_agent`), before a word.
    script = AGENTS / "broken_install_agent.mjs"
    settings.CRAFT_AGENT_COMMAND = [NODE, str(script)]
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "start_agent"})
    (refused,) = await receive_until(comm, lambda f: f["type"] == "error", timeout=30)
    assert refused == {
        "type": "error",
        "code": "agent_not_started",
        "message": "Cannot find package '@example/acp-agent-runtime-that-is-not-installed' "
        f"imported from {script}",
    }
    await comm.disconnect()
    assert await stored_log(session) == []  # the first prompt tries again, and stores why


async def test_a_python_agent_whose_import_fails_says_so(session, cookie, settings):
    settings.CRAFT_AGENT_COMMAND = [*TROUBLED, "--broken"]
    error = agent_error_of(await turn(session, cookie, "hello"))
    said = "ModuleNotFoundError: No module named 'acp_runtime_that_is_not_installed'"
    assert error["message"] == f"agent did not start: agent exited with code 1: {said}"
    assert error["stderr_line"] == said
    assert error["stderr"].startswith("Traceback (most recent call last):\n")
    assert error["stderr"].endswith(f"\n{said}")


async def test_an_agent_that_crashes_mid_turn_says_why_and_the_next_prompt_works(
    session, cookie, settings
):
    settings.CRAFT_AGENT_COMMAND = TROUBLED
    error = agent_error_of(await turn(session, cookie, "crash"))
    said = "RuntimeError: the model provider closed the connection"
    assert error["message"] == f"agent exited with code 1: {said}"
    assert error["stderr_line"] == said
    assert error["stderr"].startswith("calling the model\nTraceback (most recent call last):\n")
    frames = await turn(session, cookie, "hello")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}


async def test_an_agent_that_answers_internal_error_shows_what_it_logged_during_the_turn(
    session, cookie, settings
):
    settings.CRAFT_AGENT_COMMAND = TROUBLED
    await turn(session, cookie, "crash")  # the next agent starts with this in nobody's stderr
    frames = await turn(session, cookie, "error")
    error = agent_error_of(frames)
    logged = 'ERROR model: unexpected status 401 Unauthorized: {"error": "invalid api key"}'
    assert error == {"message": "Internal error (code -32603)", "stderr": logged,
                     "stderr_line": logged}  # fmt: skip
    # A second error turn: what was logged before it is in the details, not its line.
    error = agent_error_of(await turn(session, cookie, "error"))
    assert error == {"message": "Internal error (code -32603)", "stderr": f"{logged}\n{logged}",
                     "stderr_line": logged}  # fmt: skip


async def test_an_agent_that_wrote_nothing_to_stderr_adds_no_details(session, cookie, settings):
    settings.CRAFT_AGENT_COMMAND = [sys.executable, "-c", "import sys; sys.exit(3)"]
    error = agent_error_of(await turn(session, cookie, "hello"))
    assert error == {"message": "agent did not start: agent exited with code 3"}
    log = await stored_log(session)
    assert [kind for _, kind, _ in log] == ["user_message", "agent_error", "turn_end"]
