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

import asyncio
import os
import signal
from pathlib import Path

import pytest

from craft.models import Session
from craft.storage.db import db_sync_to_async
from craft.turns.registry import runners
from tests.ready import open_ready_session

from ..agents.fake_model import FakeModel
from ..craft.wsclient import open_socket, receive_until, session_cookie
from .common import log_of, turn

FAST_AGENT = Path(__file__).parent / "fast-agent" / "bin" / "fast-agent"

pytestmark = [
    pytest.mark.realagent,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not FAST_AGENT.exists(), reason="fast-agent is not installed: make realagent"
    ),
]


@pytest.fixture
def fake_model():
    with FakeModel() as model:
        yield model


@pytest.fixture
def fast_agent(settings, fake_model):
    # The model "echo" of the generic provider, which reads its address and key from the
    # environment (no configuration file needed); no startup network checks.
    settings.CRAFT_AGENT_COMMAND = [
        str(FAST_AGENT), "--no-update-check", "acp", "--model", "generic.echo",
    ]  # fmt: skip
    settings.CRAFT_AGENT_START_TIMEOUT = 120
    settings.CRAFT_AGENT_ENV = {
        "PATH": "/usr/bin:/bin",
        "GENERIC_BASE_URL": fake_model.url,
        "GENERIC_API_KEY": "none",
    }
    return fake_model


@db_sync_to_async
def title_of(session) -> str:
    return Session.objects.get(pk=session.pk).title


def is_title(frame: dict) -> bool:
    return frame.get("kind") == "session_title"


async def test_fast_agent_runs_a_turn_is_killed_and_is_resumed_with_its_memory(owner, fast_agent):
    session = await db_sync_to_async(open_ready_session)(owner, "fast-agent")
    workspace = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})

    frames, reply = await turn(comm, "f1", "remember mango")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}, frames[-3:]
    assert reply == "I will remember mango."
    (info,) = [f["data"] for f in frames if f.get("kind") == "agent_info"]
    assert info["agent"]["name"] == "fast-agent-acp"
    # It names the session after the first prompt (session_info_update); Craft takes the
    # title in a task of its own, which may end after the turn.
    if not any(is_title(f) for f in frames):
        frames += await receive_until(comm, is_title, timeout=15)
    (title,) = [f["data"] for f in frames if is_title(f)]
    assert title == {"title": "remember mango", "source": "agent"}
    assert await title_of(session) == "remember mango"
    # It keeps its sessions in the workspace, which outlives the agent's process.
    assert (workspace / ".fast-agent" / "sessions").is_dir()

    connection = runners.get(session.pk).connection
    assert connection is not None
    assert (connection.can_resume, connection.can_load) == (True, True)
    os.kill(connection.process.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    await asyncio.to_thread(connection.wait_closed, 10)

    frames, reply = await turn(comm, "f2", "recall")
    restored = [f["data"]["restored"] for f in frames if f.get("kind") == "agent_restarted"]
    assert restored == ["resume"]
    assert reply == "You asked me to remember: mango."
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    log = await log_of(session)
    # fast-agent replays the conversation in answer to session/resume too; none of it was
    # stored again.
    assert [k for k, _ in log].count("user_message_chunk") == 0
    assert [d["text"] for k, d in log if k == "user_message"] == ["remember mango", "recall"]
    await comm.disconnect()
