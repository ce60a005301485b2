"""The cache of agent connections: its locks, its limits, idle stops, local agent starts.

What a session sees of the cache on each backend (made once, reused, replaced, stopped) is
`test_agent_connections.py`. These tests are about how the cache itself works, which does not
depend on the backend: they run on the local backend, with real demo-agent processes.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import pytest

from sandboxes import services
from sandboxes.agent.connection import AgentConnection
from sandboxes.agent.connections import TooManyAgents, agent_connections
from sandboxes.agent.protocol import PermissionRequest, TurnEnd, TurnFailed
from sandboxes.backends import SandboxError, forget_backends, get_backend

from ...conftest import run_concurrently
from ..agents import agent_pid, run_turn

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox(owner):
    return services.provision_sandbox(owner)


@pytest.fixture
def session_id(sandbox):
    return new_session(sandbox)


def new_session(sandbox):
    return uuid.uuid4()  # its workspace is created at its agent's first start


def test_a_local_connection_wraps_the_agent_process_itself(sandbox, session_id):
    connection = services.connect_agent(sandbox, session_id)
    assert agent_pid(connection) == connection.process.pid


def test_stopping_idle_connections_spares_a_running_turn(sandbox, session_id):
    busy = services.connect_agent(sandbox, session_id)
    idle = services.connect_agent(sandbox, new_session(sandbox))
    done = threading.Event()
    busy.prompt("slow 100 0.05", lambda item: done.set() if isinstance(item, TurnEnd) else None)
    assert services.stop_idle_connections(sandbox) == 1
    assert busy.is_running
    assert not idle.is_running
    busy.cancel()
    assert done.wait(5)


# --- locking: only the keys concerned -----------------------------------------------------


class HeldStart:
    """An agent start that blocks until released: a slow start (a pod exec handshake, say)."""

    def __init__(self, sandbox, session_id) -> None:
        self.sandbox, self.session_id = sandbox, session_id
        self.entered = threading.Event()
        self.release = threading.Event()
        self.result: list = []
        self.thread = threading.Thread(target=self._run)

    def _start(self):
        self.entered.set()
        self.release.wait(30)
        backend = get_backend(self.sandbox.backend)
        process = backend.start_agent(self.sandbox, self.session_id)
        connection = AgentConnection(
            process, cwd=backend.workspace_path(self.sandbox, self.session_id)
        )
        connection.start(timeout=15)
        return connection

    def _run(self) -> None:
        self.result.append(
            agent_connections.get_or_start(self.sandbox.pk, self.session_id, self._start)
        )

    def __enter__(self) -> HeldStart:
        self.thread.start()
        assert self.entered.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.thread.join(30)


def test_terminating_a_sandbox_does_not_wait_for_an_agent_start_in_another(
    sandbox, session_id, stranger
):
    mine = services.connect_agent(sandbox, session_id)
    theirs = services.provision_sandbox(stranger)
    with HeldStart(theirs, new_session(theirs)) as held:
        # Before, terminating waited for every key's lock, this start's included: it then
        # returned only once the timer let that start go on.
        timer = threading.Timer(60, held.release.set)
        timer.start()
        services.terminate_sandbox(sandbox)
        timer.cancel()
        assert not held.release.is_set(), "terminate waited for another sandbox's start"
        assert not mine.is_running
        assert not held.result, "the other start is still under way"
    assert held.result[0].is_running
    assert agent_connections.count(theirs.pk) == 1


def test_terminating_a_sandbox_waits_for_its_own_agent_start_and_stops_it(sandbox, session_id):
    with HeldStart(sandbox, session_id) as held:
        terminating = threading.Thread(target=services.terminate_sandbox, args=(sandbox,))
        terminating.start()
        terminating.join(0.5)
        assert terminating.is_alive(), "terminate must wait for this sandbox's start"
        held.release.set()
        terminating.join(15)
        assert not terminating.is_alive()
    assert not held.result[0].is_running, "what the start started was stopped too"
    assert agent_connections.count(sandbox.pk) == 0


def test_key_locks_are_dropped_once_a_key_has_no_connection(sandbox, session_id):
    def failing_start():
        raise SandboxError("no agent today")

    sessions = [session_id, new_session(sandbox), new_session(sandbox)]
    for sid in sessions:
        services.connect_agent(sandbox, sid)
    assert len(agent_connections._key_locks) == 3
    with pytest.raises(SandboxError):
        agent_connections.get_or_start(sandbox.pk, uuid.uuid4(), failing_start)
    assert len(agent_connections._key_locks) == 3, "a failed start leaves no lock behind"
    services.remove_session_workspace(sandbox, sessions[0])
    assert len(agent_connections._key_locks) == 2
    services.terminate_sandbox(sandbox)
    assert agent_connections._key_locks == {}


# --- the maximum size ---------------------------------------------------------------------


def start_turn(connection, text: str) -> tuple[threading.Event, list]:
    """Start a turn without waiting for it; return an event set at its end, and its items."""
    done, items = threading.Event(), []

    def sink(item) -> None:
        items.append(item)
        if isinstance(item, TurnEnd | TurnFailed):
            done.set()

    connection.prompt(text, sink)
    return done, items


def test_a_full_cache_evicts_the_longest_idle_connection_first(sandbox, settings):
    settings.CRAFT_MAX_AGENT_CONNECTIONS = 2
    oldest = services.connect_agent(sandbox, new_session(sandbox))
    newer = services.connect_agent(sandbox, new_session(sandbox))
    run_turn(oldest, "hello")
    run_turn(newer, "hello")  # used last: `oldest` has been idle longer
    third = services.connect_agent(sandbox, new_session(sandbox))
    assert not oldest.is_running
    assert newer.is_running and third.is_running
    assert agent_connections.count() == 2


def test_a_full_cache_never_evicts_a_turn_or_an_open_permission_request(sandbox, settings):
    settings.CRAFT_MAX_AGENT_CONNECTIONS = 3
    working = services.connect_agent(sandbox, new_session(sandbox))
    asking = services.connect_agent(sandbox, new_session(sandbox))
    idle = services.connect_agent(sandbox, new_session(sandbox))
    # The busy ones are the longest idle: a cache that ignored turns would pick them first.
    working_done, _ = start_turn(working, "slow 200 0.05")
    asking_done, asked = start_turn(asking, "write a.txt hello")
    deadline = time.monotonic() + 10
    while not any(isinstance(item, PermissionRequest) for item in asked):
        assert time.monotonic() < deadline, "no permission request"
        time.sleep(0.02)

    fourth = services.connect_agent(sandbox, new_session(sandbox))
    assert not idle.is_running
    assert working.is_running and asking.is_running and fourth.is_running

    start_turn(fourth, "slow 200 0.05")
    with pytest.raises(TooManyAgents, match="CRAFT_MAX_AGENT_CONNECTIONS"):
        services.connect_agent(sandbox, new_session(sandbox))
    assert working.is_running and asking.is_running and fourth.is_running
    for connection in (working, asking, fourth):
        connection.cancel()
    assert working_done.wait(10) and asking_done.wait(10)


def test_one_person_runs_at_most_the_configured_number_of_agents(sandbox, settings, stranger):
    settings.CRAFT_MAX_AGENTS_PER_USER = 2
    idle = services.connect_agent(sandbox, new_session(sandbox))
    busy = services.connect_agent(sandbox, new_session(sandbox))
    done, _ = start_turn(busy, "slow 200 0.05")
    # A third agent of the same person makes room by stopping the idle one...
    third = services.connect_agent(sandbox, new_session(sandbox))
    assert not idle.is_running and busy.is_running and third.is_running
    # ...and when both are busy, a fourth is refused in words; other people are not limited.
    start_turn(third, "slow 200 0.05")
    with pytest.raises(TooManyAgents, match="the most one person can have"):
        services.connect_agent(sandbox, new_session(sandbox))
    other = services.provision_sandbox(stranger)
    assert services.connect_agent(other, new_session(other)).is_running
    for connection in (busy, third):
        connection.cancel()
    assert done.wait(10)


@pytest.mark.parametrize("slots", [2, 0])
def test_at_most_the_configured_number_of_local_agents_start_at_once(
    owner, settings, tmp_path, slots
):
    settings.CRAFT_LOCAL_AGENT_STARTS = slots
    forget_backends()  # the backend takes the setting when it is made
    log = tmp_path / "starts.log"
    slow_start = tmp_path / "slow-start"  # each start takes at least 0.4 s
    slow_start.write_text(
        f'#!/bin/sh\necho "$(date +%s.%N) 1" >> {log}\nsleep 0.4\n'
        f'echo "$(date +%s.%N) -1" >> {log}\nexec "$@"\n'
    )
    slow_start.chmod(0o755)
    settings.CRAFT_AGENT_COMMAND = [
        str(slow_start),
        sys.executable,
        "-m",
        "sandboxes.in_sandbox.demo_agent",
    ]
    sandbox = services.provision_sandbox(owner)
    sessions = iter([uuid.uuid4() for _ in range(6)])
    try:
        connections = run_concurrently(lambda: services.connect_agent(sandbox, next(sessions)), 6)
        assert all(c.is_running for c in connections)
    finally:
        services.stop_idle_connections(sandbox)
        forget_backends()
    # How many starts were between their begin and their end at once, at most (an end
    # before a begin of the same instant).
    marks = sorted((float(at), int(step)) for at, step in
                   (line.split() for line in log.read_text().splitlines()))  # fmt: skip
    running, busiest = 0, 0
    for _, step in marks:
        running += step
        busiest = max(busiest, running)
    if slots:
        assert busiest <= slots, marks
    else:
        assert busiest > 2, marks  # unlimited: more than any limit above would allow
