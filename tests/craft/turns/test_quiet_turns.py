"""A quiet turn tells its owner what the agent last wrote to stderr, and nobody else, and
stores nothing of it.

A real subprocess agent (tests/agents/troubled_agent.py `quiet`: it writes a retry to stderr
and sends nothing until a file appears in its workspace), the real consumer and runner; then
two daphne workers with Redis, the turn on one and the owner's page on the other.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.ready import open_ready_session

from ...server import Socket
from ..cluster.test_workers import redis_url, workers  # noqa: F401 (fixtures)
from ..logs import stored_log
from ..wsclient import is_turn_end, open_socket, receive_until, session_cookie

AGENTS = Path(__file__).parent.parent.parent / "agents"
TROUBLED = [sys.executable, str(AGENTS / "troubled_agent.py")]
RETRY = "retrying the model call (attempt {}/5): 503 Service Unavailable"


def is_stderr(text: str):
    return lambda frame: frame.get("type") == "agent_stderr" and frame.get("text") == text


def workspace_of(session) -> Path:
    return Path(session.sandbox.reference) / "sessions" / str(session.pk)


@pytest.fixture
def quiet_agent(settings):
    settings.CRAFT_AGENT_COMMAND = TROUBLED
    settings.CRAFT_AGENT_QUIET_SECONDS = 0.5


@pytest.fixture
def sockets(owner, stranger):
    """The owner's session, the cookie and workspace of it, and two cookies and sessions of
    sockets that must hear nothing of it: the owner's on another session, a stranger's."""
    session = open_ready_session(owner, "quiet")
    return {
        "session": session,
        "workspace": workspace_of(session),
        "cookie": session_cookie(owner),
        "others": [
            (open_ready_session(owner, "other").pk, session_cookie(owner)),
            (open_ready_session(stranger, "theirs").pk, session_cookie(stranger)),
        ],
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_quiet_turn_shows_its_owner_what_the_agent_last_wrote_until_it_goes_on(
    quiet_agent, sockets
):
    session, workspace = sockets["session"], sockets["workspace"]
    page, _ = await open_socket(session.pk, sockets["cookie"])
    others = [(await open_socket(pk, cookie))[0] for pk, cookie in sockets["others"]]
    await page.send_json_to({"type": "resume", "after": 0})
    await page.send_json_to({"type": "prompt", "id": "q1", "text": "quiet"})

    await receive_until(page, is_stderr(RETRY.format(1)), timeout=15)
    # Nothing of it is stored: the status is not an event.
    assert [kind for _, kind, _ in await stored_log(session)] == ["user_message", "agent_info"]
    (workspace / "next").touch()
    await receive_until(page, is_stderr(RETRY.format(2)), timeout=15)
    (workspace / "go").touch()
    frames = await receive_until(page, is_turn_end, timeout=15)
    # Cleared by the agent's next update, before that is stored and sent.
    kinds = [f.get("kind") or f["type"] for f in frames]
    at = kinds.index("agent_stderr")
    assert kinds[at:] == ["agent_stderr", "agent_message_chunk", "turn_end"]
    assert frames[at]["text"] == ""
    assert [kind for _, kind, _ in await stored_log(session)] == [
        "user_message", "agent_info", "agent_message_chunk", "turn_end",
    ]  # fmt: skip

    # The owner's socket on another session and another person's socket heard nothing. (Each
    # notice is handed to this process's sockets at once: a frame would be queued by now.)
    for other in others:
        assert await other.receive_nothing(timeout=0.5)
        await other.disconnect()
    await page.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_quiet_turn_cancelled_clears_its_status(quiet_agent, sockets):
    page, _ = await open_socket(sockets["session"].pk, sockets["cookie"])
    await page.send_json_to({"type": "resume", "after": 0})
    await page.send_json_to({"type": "prompt", "id": "q1", "text": "quiet"})
    await receive_until(page, is_stderr(RETRY.format(1)), timeout=15)
    await page.send_json_to({"type": "cancel"})
    frames = await receive_until(page, is_stderr(""), timeout=15)
    if not any(is_turn_end(f) for f in frames):  # the end and the clear take their own ways
        frames += await receive_until(page, is_turn_end, timeout=15)
    assert [f["data"] for f in frames if is_turn_end(f)] == [{"stop_reason": "cancelled"}]
    await page.disconnect()


@pytest.mark.django_db(transaction=True)
def test_a_quiet_turn_s_status_reaches_the_owner_on_another_worker(
    workers,  # noqa: F811
    owner,
):
    session = open_ready_session(owner, "quiet")
    first, second = workers(
        2, CRAFT_AGENT_COMMAND=" ".join(TROUBLED), CRAFT_AGENT_QUIET_SECONDS="0.5"
    )
    runs = Socket(first, owner, session.pk)  # the prompt's worker runs the turn
    runs.send({"type": "resume", "after": 0})
    watches = Socket(second, owner, session.pk)
    watches.send({"type": "resume", "after": 0})
    runs.send({"type": "prompt", "id": "q1", "text": "quiet"})
    watches.until(is_stderr(RETRY.format(1)))
    (workspace_of(session) / "next").touch()
    watches.until(is_stderr(RETRY.format(2)))
    (workspace_of(session) / "go").touch()
    watches.until(is_stderr(""))
    runs.until(is_turn_end)
    runs.close()
    watches.close()
