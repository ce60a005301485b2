"""Every turn ends exactly once, whatever happens to the server: SIGKILL, SIGTERM.

Real daphne processes (started as `daphne craft.asgi:application`), real agents, the real
PostgreSQL test database shared by the test and the servers.
"""

from __future__ import annotations

import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from craft.models import Event, TurnRecord, Worker
from craft.turns.recovery import RESTARTED
from sandboxes import services as sandbox_services
from tests.ready import open_ready_session

from ...agents import AGENTS
from ...procs import alive
from ...server import Daphne, Socket
from ..logs import log_of

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(condition, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def readiness(server: Daphne) -> int | None:
    """The readiness probe's status; None when it got no answer in time: a request that
    reaches daphne as SIGTERM does is dropped with the other application instances daphne
    kills then (a load balancer's probe would time out the same way)."""
    try:
        with urllib.request.urlopen(f"{server.url}/readyz", timeout=3) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except TimeoutError:
        return None


@pytest.fixture
def servers(tmp_path):
    started: list[Daphne] = []

    def make(**env: str) -> Daphne:
        server = Daphne(tmp_path, **env)
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop()


def test_a_killed_server_s_turn_is_closed_once_at_the_next_start(servers, owner):
    session = open_ready_session(owner, "restart")
    first = servers()
    sock = Socket(first, owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    sock.send({"type": "prompt", "id": "w1", "text": "write a.txt one"})
    (request,) = [
        f for f in sock.until(lambda f: f.get("kind") == "permission_request")
        if f.get("kind") == "permission_request"
    ]  # fmt: skip
    before = log_of(session)
    assert TurnRecord.objects.running().get(session=session).pending == {
        request["data"]["request"]: ["allow", "reject"]
    }

    first.signal(signal.SIGKILL)
    first.wait(10)
    sock.close()
    second = servers()  # its start closes what the killed server left open

    wait_for(lambda: Event.objects.filter(session=session, kind="turn_end").exists(),
             what="the interrupted turn's end")  # fmt: skip
    after = log_of(session)
    assert after[: len(before)] == before, "events stored before the crash never change"
    assert [(kind, data) for _, kind, data in after[len(before) :]] == [
        ("permission_answer",
         {"request": request["data"]["request"], "option": None, "outcome": "cancelled",
          "reason": "interrupted"}),
        ("agent_error", {"message": RESTARTED, "reason": "server_restarted"}),
        ("turn_end", {"stop_reason": "interrupted"}),
    ]  # fmt: skip
    assert not TurnRecord.objects.running().filter(session=session).exists()

    # The session goes on, with a new agent, through the new server.
    sock = Socket(second, owner, session.pk)
    sock.send({"type": "resume", "after": len(after)})
    sock.send({"type": "prompt", "id": "w2", "text": "hello again"})
    frames = sock.until(lambda f: f.get("kind") == "turn_end")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    assert [f["seq"] for f in frames] == list(range(len(after) + 1, len(after) + len(frames) + 1))
    sock.close()


def test_sigterm_interrupts_a_turn_that_outlasts_the_grace_and_leaves_no_agent(servers, owner):
    session = open_ready_session(owner, "deaf")
    server = servers(
        CRAFT_AGENT_COMMAND=f"{sys.executable} {AGENTS / 'deaf_agent.py'}",
        CRAFT_SHUTDOWN_GRACE_SECONDS="1",
    )
    sock = Socket(server, owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    sock.send({"type": "prompt", "id": "d1", "text": "go"})
    sock.until(lambda f: f.get("kind") == "agent_message_chunk")
    pids_file = Path(session.sandbox.reference) / "sessions" / str(session.pk) / "agent-pids"
    pids = [int(p) for p in wait_for(pids_file.read_text, what="agent pids").split()]
    assert all(alive(pid) for pid in pids)

    server.signal(signal.SIGTERM)
    assert server.wait(30) == 0
    sock.close()

    ends = Event.objects.filter(session=session, kind="turn_end")
    assert [e.data for e in ends] == [{"stop_reason": "interrupted"}]
    assert Event.objects.filter(
        session=session,
        kind="agent_error",
        data__message="The server shut down during this turn.",
        data__reason="server_shutdown",
    ).exists()
    assert [pid for pid in pids if alive(pid)] == [], "the agent and its child are gone"
    assert Worker.objects.get(pid=server.process.pid).stopped_at is not None


def test_sigterm_lets_a_turn_finish_within_the_grace(servers, owner):
    session = open_ready_session(owner, "graceful")
    # The turn ends as soon as its permission is answered, and the server exits then: a long
    # grace costs nothing, and a loaded machine's slow steps below stay within it.
    server = servers(CRAFT_SHUTDOWN_GRACE_SECONDS="90")
    sock = Socket(server, owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    # The turn waits for its permission: it runs for as long as the test needs it to.
    sock.send({"type": "prompt", "id": "g1", "text": "write graceful.txt finished"})
    request = sock.until(lambda f: f.get("kind") == "permission_request")[-1]
    assert readiness(server) == 200
    server.signal(signal.SIGTERM)
    # While the turn finishes, the worker says it takes no new work (load balancers move on).
    wait_for(lambda: readiness(server) == 503, timeout=15, what="not ready while stopping")
    sock.send({"type": "permission", "request": request["data"]["request"], "option": "allow"})
    assert server.wait(90) == 0
    sock.close()
    ends = [e.data for e in Event.objects.filter(session=session, kind="turn_end")]
    assert ends == [{"stop_reason": "end_turn"}]
    folder = Path(sandbox_services.workspace_path(session.sandbox, session.pk))
    assert (folder / "graceful.txt").read_text() == "finished"


def test_after_a_server_restart_the_next_prompt_restores_the_agent_s_memory(servers, owner):
    session = open_ready_session(owner, "memory across servers")
    first = servers()
    sock = Socket(first, owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    sock.send({"type": "prompt", "id": "m1", "text": "remember cherry"})
    sock.until(lambda f: f.get("kind") == "turn_end")
    sock.close()
    first.signal(signal.SIGKILL)
    first.wait(10)

    second = servers()
    sock = Socket(second, owner, session.pk)
    sock.send({"type": "resume", "after": sock.hello["last_seq"]})
    sock.send({"type": "prompt", "id": "m2", "text": "recall"})
    frames = sock.until(lambda f: f.get("kind") == "turn_end")
    sock.close()
    reply = "".join(
        f["data"]["content"]["text"] for f in frames if f.get("kind") == "agent_message_chunk"
    )
    assert reply == "You asked me to remember: cherry."
    assert [f["data"] for f in frames if f.get("kind") == "agent_restarted"] == [
        {"restored": "resume"}
    ]


def test_prompts_queued_on_a_killed_server_run_once_after_the_restart(servers, owner):
    session = open_ready_session(owner, "queue restart")
    first = servers()
    sock = Socket(first, owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    sock.send({"type": "prompt", "id": "long", "text": "slow 400 0.05"})
    sock.until(lambda f: f.get("kind") == "agent_message_chunk")
    sock.send({"type": "prompt", "id": "q1", "text": "after one"})
    sock.send({"type": "prompt", "id": "q2", "text": "after two"})
    sock.until_kind("prompt_queued", 2)
    first.signal(signal.SIGKILL)
    first.wait(10)
    sock.close()
    servers()  # its start closes the killed turn, then runs the queue

    def ended(count):
        return Event.objects.filter(session=session, kind="turn_end").count() >= count

    wait_for(lambda: ended(3), timeout=60, what="the two queued prompts' turns")
    log = [(kind, data) for _, kind, data in log_of(session)]
    assert [d["text"] for k, d in log if k == "user_message"] == [
        "slow 400 0.05", "after one", "after two",
    ]  # fmt: skip
    assert [d["stop_reason"] for k, d in log if k == "turn_end"] == [
        "interrupted", "end_turn", "end_turn",
    ]  # fmt: skip
    assert not session.queue.exists()
