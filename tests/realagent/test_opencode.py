"""A real third-party ACP agent, opencode, through Craft: a turn, a SIGKILL, and a reattach.

Opt in: `make realagent` installs the pinned opencode (tests/realagent/package.json and its
lock file) and `make test` then runs these; by hand, `.venv/bin/pytest -m realagent`. They
are skipped when opencode is not installed. Nothing is downloaded while they run: opencode
talks to a fake OpenAI-compatible model on loopback (tests/agents/fake_model.py), which
answers "recall" from the conversation it is sent, so a right answer proves that opencode
got its context back.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from craft.storage.db import db_sync_to_async
from craft.turns.registry import runners
from tests.ready import open_ready_session

from ..agents.fake_model import FakeModel
from ..craft.wsclient import open_socket, session_cookie
from .common import log_of, turn

OPENCODE = Path(__file__).parent / "node_modules" / ".bin" / "opencode"

pytestmark = [
    pytest.mark.realagent,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not OPENCODE.exists(), reason="opencode is not installed: make realagent"),
]


@pytest.fixture
def fake_model():
    with FakeModel() as model:
        yield model


@pytest.fixture
def opencode(settings, fake_model):
    settings.CRAFT_AGENT_COMMAND = [str(OPENCODE), "acp"]
    settings.CRAFT_AGENT_START_TIMEOUT = 120
    settings.CRAFT_AGENT_ENV = {
        # Node for opencode's launcher; no update checks, no model list from the network.
        "PATH": f"{Path(shutil.which('node') or '/usr/bin/node').parent}:/usr/bin:/bin",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    }
    return fake_model


def configure(workspace: Path, model_url: str) -> None:
    """Point opencode at the fake model (its project configuration, in the workspace)."""
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": model_url, "apiKey": "none"},
                "models": {"echo": {"name": "Echo"}},
            }
        },
        "model": "fake/echo",
        "autoupdate": False,
        "share": "disabled",
    }
    workspace.mkdir(parents=True, exist_ok=True)  # before the agent's first start makes it
    (workspace / "opencode.json").write_text(json.dumps(config))


async def test_opencode_runs_a_turn_is_killed_and_is_reattached_with_its_memory(owner, opencode):
    session = await db_sync_to_async(open_ready_session)(owner, "opencode")
    workspace = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    configure(workspace, opencode.url)
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})

    frames, reply = await turn(comm, "o1", "remember mango")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}, frames[-3:]
    assert reply == "I will remember mango."
    (info,) = [f["data"] for f in frames if f.get("kind") == "agent_info"]
    assert info["agent"]["name"] == "OpenCode"

    connection = runners.get(session.pk).connection
    assert connection is not None
    capabilities = {"resume": connection.can_resume, "load": connection.can_load}
    os.kill(connection.process.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    await asyncio.to_thread(connection.wait_closed, 10)

    frames, reply = await turn(comm, "o2", "recall")
    restored = [f["data"]["restored"] for f in frames if f.get("kind") == "agent_restarted"]
    assert restored == ["resume" if capabilities["resume"] else "load"]
    assert reply == "You asked me to remember: mango."
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    log = await log_of(session)
    # Nothing opencode replayed was stored again.
    assert [k for k, _ in log].count("user_message_chunk") == 0
    assert [d["text"] for k, d in log if k == "user_message"] == ["remember mango", "recall"]
    await comm.disconnect()
