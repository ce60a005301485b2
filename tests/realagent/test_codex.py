"""A real third-party ACP agent, Codex (codex-acp), through Craft.

It answers, runs a shell command and writes a file once a person allowed it, is cancelled mid
turn, and is killed and reattached with its memory. Opt in: `make realagent` installs the
adapter pinned in tests/realagent/package.json (a native binary, from the package's platform
dependency, that carries Codex itself) and `make test` then runs these; by hand,
`.venv/bin/pytest -m realagent`. They are skipped when it is not installed. Nothing is
downloaded while they run: Codex talks to a fake OpenAI Responses API on loopback
(tests/agents/fake_vendors.py), which calls Codex's own `exec_command` and `apply_patch`
tools as the real API would.
"""

from __future__ import annotations

import asyncio
import os
import platform
import signal
from pathlib import Path

import pytest

from craft.turns.registry import runners

from ..agents.fake_vendors import FakeVendors
from .common import (
    cancel_a_slow_turn,
    live_output,
    log_of,
    reply_of,
    start_session,
    tool_cards,
    turn,
    turn_allowing,
    workspace_of,
)

# The native binary itself, not the package's node launcher (`.bin/codex-acp`): the launcher
# runs it as a child, and a SIGKILL of the launcher leaves that child running.
ARCH = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
CODEX = (
    Path(__file__).parent / "node_modules" / "@zed-industries"
    / f"codex-acp-linux-{ARCH}" / "bin" / "codex-acp"
)  # fmt: skip

pytestmark = [
    pytest.mark.realagent,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not CODEX.exists(), reason="Codex (codex-acp) is not installed: make realagent"
    ),
]


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
def codex(settings):
    with FakeVendors() as fake:
        settings.CRAFT_AGENT_COMMAND = codex_command(f"{fake.url}/v1")
        settings.CRAFT_AGENT_START_TIMEOUT = 120
        settings.CRAFT_AGENT_ENV = {"PATH": "/usr/bin:/bin", "FAKE_MODEL_API_KEY": "sk-fake"}
        yield fake


async def test_codex_runs_a_command_and_writes_a_file_once_allowed(owner, codex):
    session, comm = await start_session(owner, "codex")

    frames, reply = await turn(comm, "x1", "hello there")
    assert reply == "Echo: hello there"
    (info,) = [f["data"] for f in frames if f.get("kind") == "agent_info"]
    assert info["agent"]["name"] == "codex-acp"

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
    frames = await cancel_a_slow_turn(comm, "x1")
    assert frames[-1]["data"] == {"stop_reason": "cancelled"}
    assert "word80" not in reply_of(frames)  # the cancel cut the model's stream short
    frames, reply = await turn(comm, "x2", "hello again")
    assert reply == "Echo: hello again"
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()


async def test_codex_is_killed_and_reattached_with_its_memory(owner, codex):
    session, comm = await start_session(owner, "codex")
    frames, reply = await turn(comm, "x1", "remember mango")
    assert reply == "I will remember mango."

    connection = runners.get(session.pk).connection
    assert connection is not None
    assert (connection.can_resume, connection.can_load) == (True, True)
    os.kill(connection.process.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    await asyncio.to_thread(connection.wait_closed, 10)

    frames, reply = await turn(comm, "x2", "recall")
    restored = [f["data"]["restored"] for f in frames if f.get("kind") == "agent_restarted"]
    assert restored == ["resume"], [(f.get("kind"), f.get("data")) for f in frames]
    assert reply == "You asked me to remember: mango."
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    log = await log_of(session)
    assert [k for k, _ in log].count("user_message_chunk") == 0
    assert [d["text"] for k, d in log if k == "user_message"] == ["remember mango", "recall"]
    await comm.disconnect()
