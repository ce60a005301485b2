"""A session's agent connection, on each backend: made once, reused, replaced, stopped.

The first prompt of a session starts its agent and caches the connection under (sandbox,
session); every follow-up reuses it; a dead one is replaced; cleaning up the session stops it,
terminating the sandbox stops all of that sandbox's connections and no other's; concurrent
first prompts start one agent. Each test runs on the local backend (subprocesses) and on the
kubernetes backend (pod exec against the test API server, which runs the exec'd agent as a
process of this machine), through the service the chat uses (`connect_agent`). The agent's
own process id (it answers "pid") proves which process served a prompt.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from sandboxes import services
from sandboxes.agent.connections import StartStopped, agent_connections
from sandboxes.agent.protocol import TurnEnd, TurnFailed, Update
from sandboxes.models import Sandbox

from ...conftest import run_concurrently
from ...procs import alive
from ..agents import agent_pid, reply_text, run_turn
from ..kube import agent_execs

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass(frozen=True)
class Agents:
    """What a test sees of the agent processes its backend started."""

    pids: Callable[[], list[int]]  # of every agent process started, in order
    ended: Callable[[int], bool]  # whether that agent process has ended


@pytest.fixture(params=["local", "kubernetes"])
def backend(request, settings, tmp_path) -> Agents:
    """Switch the app to each backend in turn; return a view of the agents it starts."""
    if request.param == "kubernetes":
        kube = request.getfixturevalue("kube")
        request.getfixturevalue("kube_backend")

        def exec_ended(pid: int) -> bool:
            return any(e.pid == pid and e.returncode is not None for e in agent_execs(kube))

        # The server records an exec before it spawns the command: only a pid is a process.
        return Agents(lambda: [e.pid for e in agent_execs(kube) if e.pid], exec_ended)
    # Every local agent writes its pid down as it starts, then becomes the demo agent (same
    # process), so that agents started and stopped again are counted too.
    starts = tmp_path / "agent-starts"
    recorder = tmp_path / "record-start"
    recorder.write_text(f'#!/bin/sh\necho $$ >> "{starts}"\nexec "$@"\n')
    recorder.chmod(0o755)
    settings.CRAFT_AGENT_COMMAND = [
        str(recorder),
        sys.executable,
        "-m",
        "sandboxes.in_sandbox.demo_agent",
    ]

    def started() -> list[int]:
        return [int(pid) for pid in starts.read_text().split()] if starts.exists() else []

    return Agents(started, lambda pid: not alive(pid))


@pytest.fixture
def sandbox(backend, owner):
    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    return sandbox


def new_session() -> uuid.UUID:
    return uuid.uuid4()  # its workspace is created at its agent's first start


def wait_until(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.02)


def test_the_first_prompt_starts_and_caches_a_connection(backend, sandbox):
    session_id = new_session()
    assert agent_connections.get(sandbox.pk, session_id) is None
    connection = services.connect_agent(sandbox, session_id)
    assert connection.is_running
    assert agent_connections.get(sandbox.pk, session_id) is connection
    assert backend.pids() == [agent_pid(connection)]


def test_follow_up_prompts_reuse_the_same_agent_process(backend, sandbox):
    session_id = new_session()
    first = services.connect_agent(sandbox, session_id)
    pid = agent_pid(first)
    second = services.connect_agent(sandbox, session_id)
    assert second is first
    assert agent_pid(second) == pid
    assert backend.pids() == [pid]


def test_a_dead_connection_is_replaced_by_a_new_process(backend, sandbox):
    session_id = new_session()
    first = services.connect_agent(sandbox, session_id)
    old_pid = agent_pid(first)
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: not first.is_running, "the connection noticed its agent died")
    replacement = services.connect_agent(sandbox, session_id)
    assert replacement is not first
    new_pid = agent_pid(replacement)
    assert new_pid != old_pid
    assert agent_connections.get(sandbox.pk, session_id) is replacement
    assert backend.pids() == [old_pid, new_pid]


def test_an_agent_killed_mid_turn_fails_the_turn_and_the_next_prompt_gets_a_new_one(
    backend, sandbox
):
    session_id = new_session()
    connection = services.connect_agent(sandbox, session_id)
    old_pid = agent_pid(connection)
    items: list = []
    streaming, ended = threading.Event(), threading.Event()

    def sink(item) -> None:
        items.append(item)
        if isinstance(item, Update):
            streaming.set()
        if isinstance(item, TurnEnd | TurnFailed):
            ended.set()

    connection.prompt("slow 100 0.05", sink)
    assert streaming.wait(10), "the slow turn never started streaming"
    os.kill(old_pid, signal.SIGKILL)
    assert ended.wait(10), "the turn never ended"
    assert isinstance(items[-1], TurnFailed)
    wait_until(lambda: not connection.is_running, "the connection noticed its agent died")
    replacement = services.connect_agent(sandbox, session_id)
    assert replacement is not connection
    assert agent_pid(replacement) != old_pid
    assert len(backend.pids()) == 2


def test_different_sessions_get_different_connections(backend, sandbox):
    a = services.connect_agent(sandbox, new_session())
    b = services.connect_agent(sandbox, new_session())
    assert a is not b
    assert agent_pid(a) != agent_pid(b)


def test_terminating_a_sandbox_stops_its_connections_and_no_other(backend, sandbox, stranger):
    mine = [services.connect_agent(sandbox, new_session()) for _ in range(2)]
    other_sandbox = services.provision_sandbox(stranger)
    theirs = services.connect_agent(other_sandbox, new_session())

    services.terminate_sandbox(sandbox)

    assert all(not c.is_running for c in mine)
    assert agent_connections.count(sandbox.pk) == 0
    assert theirs.is_running
    assert agent_connections.count(other_sandbox.pk) == 1
    assert reply_text(run_turn(theirs, "still there")) == "Echo: still there"


def test_cleaning_up_a_session_stops_its_connection(backend, sandbox):
    session_id = new_session()
    connection = services.connect_agent(sandbox, session_id)
    pid = agent_pid(connection)
    other = services.connect_agent(sandbox, new_session())
    services.remove_session_workspace(sandbox, session_id)
    assert not connection.is_running
    assert agent_connections.get(sandbox.pk, session_id) is None
    assert other.is_running
    wait_until(lambda: backend.ended(pid), "the agent process ended")


def test_cleaning_up_a_session_without_a_connection_is_fine(backend, sandbox):
    session_id = new_session()
    services.remove_session_workspace(sandbox, session_id)
    assert agent_connections.get(sandbox.pk, session_id) is None
    assert backend.pids() == []


def test_concurrent_first_prompts_start_one_agent(backend, sandbox):
    session_id = new_session()
    got = run_concurrently(lambda: services.connect_agent(sandbox, session_id), 4)
    assert len(got) == 4
    assert all(c is got[0] for c in got)
    assert agent_connections.count(sandbox.pk) == 1
    assert len(backend.pids()) == 1


def test_cleaning_up_a_session_stops_its_agent_start_without_waiting_for_it(
    backend, sandbox, settings
):
    """A session deleted while its agent starts is not held up by the start (which waits up to
    CRAFT_AGENT_START_TIMEOUT for an agent that never answers): the process being started is
    stopped, and the start raises StartStopped."""
    settings.CRAFT_WARM_AGENTS = 0
    # Long enough that a removal waiting for it fails the test, short enough that a failing
    # run ends soon after.
    settings.CRAFT_AGENT_START_TIMEOUT = 60.0
    # An agent that never answers `initialize`, in place of the demo agent's module (whose
    # name stays in its arguments: the kubernetes view of the agents looks for it).
    command = settings.CRAFT_AGENT_COMMAND
    assert command[-2:] == ["-m", "sandboxes.in_sandbox.demo_agent"]
    never = "import time; time.sleep(600)"
    settings.CRAFT_AGENT_COMMAND = [*command[:-2], "-c", never, "sandboxes.in_sandbox.demo_agent"]
    session_id = new_session()
    failures: list[BaseException] = []

    def first_prompt() -> None:
        try:
            services.connect_agent(sandbox, session_id)
        except BaseException as exc:
            failures.append(exc)

    starter = threading.Thread(target=first_prompt, daemon=True)
    starter.start()
    wait_until(backend.pids, "the agent was spawned")
    (pid,) = backend.pids()
    remover = threading.Thread(
        target=services.remove_session_workspace, args=(sandbox, session_id), daemon=True
    )
    remover.start()
    # Liveness, not speed: without the stop, both would wait for the start's 60 s.
    remover.join(30)
    starter.join(30)
    assert not remover.is_alive(), "removing the session waited for its agent's start"
    assert not starter.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], StartStopped), failures
    assert agent_connections.get(sandbox.pk, session_id) is None
    assert agent_connections.count(sandbox.pk) == 0
    wait_until(lambda: backend.ended(pid), "the agent process ended")
