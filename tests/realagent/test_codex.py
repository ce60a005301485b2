"""A real third-party ACP agent, Codex (codex-acp), through Craft.

It answers, runs a shell command and writes a file once a person allowed it, is cancelled mid
turn, and is killed and reattached with its memory. `make test` installs (`make realagent`) the
adapter pinned in tests/realagent/package.json (a native binary, from the package's platform
dependency, that carries Codex itself) and runs these as root, with sandbox users, the jail and
the sandbox's network on; by hand, `.venv/bin/pytest -m realagent`. They are skipped when it is
not installed. Nothing is downloaded while they run: Codex talks to a fake OpenAI Responses API
on loopback (tests/agents/fake_vendors.py), which calls Codex's own `exec_command` and
`apply_patch` tools as the real API would.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from ..craft.wsclient import receive_until
from .common import (
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

# The native binary itself, not the package's node launcher (`.bin/codex-acp`): the launcher
# runs it as a child, and a SIGKILL of the launcher leaves that child running.
ARCH = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
CODEX = (
    Path(__file__).parent / "node_modules" / "@zed-industries"
    / f"codex-acp-linux-{ARCH}" / "bin" / "codex-acp"
)  # fmt: skip

pytestmark = realagent_marks(CODEX, "Codex (codex-acp)")


def codex_command(model_url: str) -> list[str]:
    """Return codex-acp's argv, its configuration given as `-c` overrides (no config.toml)."""
    overrides = [
        # A provider of our own: with it, Codex needs no login (the built-in OpenAI provider
        # answers session/new with "Authentication required" until ACP authenticate).
        'model_provider="fake"',
        f'model_providers.fake={{name="Fake", base_url="{model_url}", '
        'env_key="FAKE_MODEL_API_KEY", wire_api="responses"}',
        # A model Codex knows: its metadata brings the apply_patch tool (an unknown model gets
        # none, and a warning as the first words of every answer).
        'model="gpt-5.3-codex"',
        # Craft's sandbox is the sandbox: Codex's own (bubblewrap and a helper it will not
        # install under /tmp) is off, and every command not known to be safe asks first.
        'sandbox_mode="danger-full-access"',
        'approval_policy="untrusted"',
        # Nothing sent home.
        "analytics.enabled=false",
        "feedback.enabled=false",
        "check_for_update_on_startup=false",
    ]
    return [str(CODEX), *(arg for override in overrides for arg in ("-c", override))]


@pytest.fixture
def codex(settings, fake_vendors):
    use_agent(
        settings,
        codex_command(f"{fake_vendors.url}/v1"),
        PATH="/usr/bin:/bin",
        FAKE_MODEL_API_KEY="sk-fake",
    )
    return fake_vendors


async def test_codex_runs_a_command_and_writes_a_file_once_allowed(owner, codex):
    session, comm = await start_session(owner, "codex")

    frames, reply = await turn(comm, "x1", "hello there")
    assert reply == "Echo: hello there"
    assert agent_name(frames) == "codex-acp"

    command = "mkdir -p made && for i in 1 2 3; do echo tick$i; sleep 1; done"
    frames, reply = await turn_allowing(comm, "x2", f"run: {command}")
    assert [f for f in frames if f.get("kind") == "permission_answer"], "no permission asked"
    ((call_id, card),) = tool_cards(frames).items()
    assert card["kind"] == "execute"
    assert card["rawInput"]["command"][-1] == command
    # A terminal stands for the output, which comes live in the tool call's _meta
    # (terminal_output), a line at a time while the command runs. The first line printed
    # may be missing from it (and then from the output Codex keeps, rawOutput, too); the
    # model gets all of it.
    assert card["content"] == [{"type": "terminal", "terminalId": call_id}]
    chunks, before_the_end = live_output(frames, call_id)
    assert len(chunks) >= 2 and before_the_end == len(chunks)
    assert "".join(chunks).endswith("tick2\ntick3\n")
    assert reply.endswith("Output:\ntick1\ntick2\ntick3")
    # Codex 0.16.0 does not always report the end of a command that ran for seconds: in
    # some runs the card never completes (no terminal_exit, no rawOutput), not even after
    # the turn's end.
    assert card["status"] in ("completed", "in_progress")
    if card["status"] == "completed":
        assert card["_meta"]["terminal_exit"]["exit_code"] == 0
        assert "".join(chunks) == card["rawOutput"]["aggregated_output"]
    assert (workspace_of(session) / "made").is_dir()

    frames, reply = await turn_allowing(comm, "x3", "write notes.txt hello from codex")
    (card,) = [c for c in tool_cards(frames).values() if c.get("kind") == "edit"]
    assert card["kind"] == "edit" and card["status"] == "completed"
    (diff,) = card["content"]
    assert diff["type"] == "diff" and diff["newText"] == "hello from codex\n"
    assert diff["path"].endswith("/notes.txt")
    assert (workspace_of(session) / "notes.txt").read_text() == "hello from codex\n"
    assert reply.startswith("The tool said:")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()


async def test_codex_is_cancelled_mid_turn(owner, codex):
    _, comm = await start_session(owner, "codex")
    await cancelled_mid_turn_then_answered(comm, "x")
    await comm.disconnect()


async def test_codex_is_killed_and_reattached_with_its_memory(owner, codex):
    session, comm = await start_session(owner, "codex")
    connection = await remember_mango(comm, session, "x")
    assert (connection.can_resume, connection.can_load) == (True, True)
    await kill(connection)
    await recall_mango(comm, session, "x", "resume")
    await comm.disconnect()


async def test_a_wrong_key_makes_codex_retry_and_its_status_shows_why(owner, codex, settings):
    """Codex retries a refused key five times, logging each retry to stderr, then answers
    "Internal error": while it retries, the owner's page shows its latest retry line; the
    error quotes its last line (the 401) and keeps its whole stderr for Details."""
    codex.server.refused_keys.add("sk-fake")
    settings.CRAFT_AGENT_QUIET_SECONDS = 0.5
    _, comm = await start_session(owner, "codex")
    frames, _ = await turn(comm, "k1", "hello")
    if not any(f == {"type": "agent_stderr", "text": ""} for f in frames):
        # The clear and the turn's end take their own ways to the socket.
        frames += await receive_until(comm, lambda f: f == {"type": "agent_stderr", "text": ""})
    statuses = [f["text"] for f in frames if f["type"] == "agent_stderr"]
    assert statuses[-1] == "", "cleared when the agent answers"
    shown = [text for text in statuses if text]
    assert shown, "the status showed what Codex wrote while it retried"
    for text in shown:
        assert "\x1b" not in text and len(text) <= 300
        assert text.startswith(
            "ERROR codex_acp::thread: Handled error during turn: Reconnecting..."
        )
        assert "401 Unauthorized" in text
    (error,) = [f["data"] for f in frames if f.get("kind") == "agent_error"]
    assert error["message"] == "Internal error (code -32603)"
    assert error["stderr_line"].startswith(
        "ERROR codex_acp::thread: Unhandled error during turn: unexpected status 401 "
        "Unauthorized: Incorrect API key provided"
    )
    assert error["stderr"].count("Reconnecting...") == 5 and "\x1b" not in error["stderr"]
    assert frames[-1]["data"] == {"stop_reason": "error"}
    page = as_the_page_reads(error)
    assert page["summary"] == "The model provider refused your API key."
    assert page["wrote"] == error["stderr_line"]
    await comm.disconnect()
