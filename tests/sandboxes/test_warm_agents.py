"""Warm agents (CRAFT_WARM_AGENTS): started and initialized before their session exists.

Real demo-agent processes on the local backend (and through pod exec against the test API
server), the real connection cache and reaper. A warm agent is told by its process: its pid
is read before the session that takes it exists.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from django import db

from craft.session_activity import session_activity
from sandboxes import reaper, services
from sandboxes import warm_agents as warm_agents_module
from sandboxes.agent.connections import agent_connections
from sandboxes.catalog import Agent, Launch, default_agent
from sandboxes.models import ReaperAction
from sandboxes.warm_agents import warm_agents

from ..procs import gone
from .agents import agent_pid, run_turn

pytestmark = pytest.mark.django_db(transaction=True)

DEMO = [sys.executable, "-m", "sandboxes.in_sandbox.demo_agent"]


@pytest.fixture(autouse=True)
def warm_on(settings):
    settings.CRAFT_WARM_AGENTS = 1
    settings.CRAFT_AGENT_COMMAND = DEMO
    yield
    agent_connections.stop_all()


@pytest.fixture
def sandbox(owner):
    return services.provision_sandbox(owner)


def settled(timeout: float = 30) -> None:
    """Wait until no warm agent is being started in the background."""
    deadline = time.monotonic() + timeout
    while warm_agents._wanted:
        assert time.monotonic() < deadline, "warm agents still starting"
        time.sleep(0.02)


def warm_of(sandbox, timeout: float = 30):
    """Wait for the sandbox's one live warm agent; return its connection."""
    deadline = time.monotonic() + timeout
    while True:
        live = [conn for _, conn, _ in agent_connections.warm(sandbox.pk) if conn.is_running]
        if live:
            assert len(live) == 1
            return live[0]
        assert time.monotonic() < deadline, "no warm agent"
        time.sleep(0.02)


def test_a_new_sessions_first_prompt_is_served_by_a_warm_agent(sandbox):
    services.connect_agent(sandbox, uuid.uuid4())  # the sandbox is in use: one is kept warm
    warm = warm_of(sandbox)
    pid = warm.process.pid  # known before the session below exists
    assert Path(f"/proc/{pid}/cwd").resolve() == Path(sandbox.reference, "home").resolve()

    session_id = uuid.uuid4()
    connection = services.connect_agent(sandbox, session_id)
    assert agent_pid(connection) == pid
    assert not [k for k, _, _ in agent_connections.warm(sandbox.pk) if k[1] == session_id]
    # It works in the session's workspace, which session/new named as its cwd.
    run_turn(connection, "write notes.txt warm hello")
    workspace = Path(services.workspace_path(sandbox, session_id))
    assert (workspace / "notes.txt").read_text() == "warm hello"
    assert not (Path(sandbox.reference) / "home" / "notes.txt").exists()
    # And another takes its place, in the background.
    assert warm_of(sandbox).process.pid != pid


def test_a_warm_agent_that_died_while_waiting_is_replaced_never_handed_out(sandbox):
    services.connect_agent(sandbox, uuid.uuid4())
    dead = warm_of(sandbox).process.pid
    os.kill(dead, signal.SIGKILL)
    assert gone(dead)

    connection = services.connect_agent(sandbox, uuid.uuid4())
    assert agent_pid(connection) != dead
    settled()
    replacement = warm_of(sandbox)
    assert replacement.process.pid not in (dead, connection.process.pid)


def test_the_reaper_replaces_a_warm_agent_that_died_while_waiting(sandbox):
    services.connect_agent(sandbox, uuid.uuid4())
    dead = warm_of(sandbox).process.pid
    os.kill(dead, signal.SIGKILL)
    assert gone(dead)

    reaper.stop_idle_agents(session_activity)
    settled()
    assert warm_of(sandbox).process.pid != dead


def test_warm_agents_count_against_the_per_user_limit(settings, sandbox):
    settings.CRAFT_MAX_AGENTS_PER_USER = 2
    first = services.connect_agent(sandbox, uuid.uuid4())
    warm = warm_of(sandbox)
    # Full: a session for another agent makes room by stopping the warm agent, never a
    # session's agent.
    other = Launch(Agent(id="other", title="Other", command=DEMO))
    second = services.connect_agent(sandbox, uuid.uuid4(), launch=other)
    assert agent_pid(second) != warm.process.pid
    assert gone(warm.process.pid)
    assert first.is_running
    settled()
    # Two sessions' agents: no room for a warm one, and none pushes a session's agent out.
    assert agent_connections.warm(sandbox.pk) == []
    assert agent_connections.count(sandbox.pk) == 2


def test_warm_agents_count_against_the_servers_limit(settings, sandbox):
    settings.CRAFT_MAX_AGENT_CONNECTIONS = 2
    services.connect_agent(sandbox, uuid.uuid4())
    warm_of(sandbox)
    assert agent_connections.count() == 2
    taken = services.connect_agent(sandbox, uuid.uuid4())  # takes the warm one's place
    settled()
    assert agent_connections.count() == 2
    assert agent_connections.warm() == []
    assert taken.is_running


def test_idle_warm_agents_are_reaped_and_not_replaced(settings, sandbox):
    settings.CRAFT_AGENT_IDLE_SECONDS = 60
    session_id = uuid.uuid4()
    services.connect_agent(sandbox, session_id)
    warm = warm_of(sandbox)
    warm.last_used_at -= 3600  # no session agent started in its sandbox for an hour
    # A warm agent alone does not keep its sandbox in use.
    services.stop_idle_connections(sandbox)  # the session's agent goes too
    settled()

    services.connect_agent(sandbox, session_id)
    warm = warm_of(sandbox)
    warm.last_used_at -= 3600
    actions = reaper.stop_idle_agents(session_activity)
    assert [a.target for a in actions] == ["a warm agent"]
    assert actions[0].kind == ReaperAction.Kind.STOPPED_IDLE_AGENT
    assert gone(warm.process.pid)
    settled()
    assert agent_connections.warm(sandbox.pk) == []


def test_a_sandbox_with_only_a_warm_agent_is_not_in_use(sandbox):
    services.connect_agent(sandbox, uuid.uuid4())
    warm_of(sandbox)
    services.stop_idle_connections(sandbox)
    assert agent_connections.count(sandbox.pk, warm=False) == 0
    assert sandbox.pk not in agent_connections.sandboxes()


def test_warm_agents_off_keep_every_agent_in_its_workspace(settings, owner):
    settings.CRAFT_WARM_AGENTS = 0
    sandbox = services.provision_sandbox(owner)
    services.connect_agent(sandbox, uuid.uuid4())
    settled()
    assert agent_connections.warm() == []
    session_id = uuid.uuid4()
    connection = services.connect_agent(sandbox, session_id)
    pid = agent_pid(connection)
    workspace = services.workspace_path(sandbox, session_id)
    assert Path(f"/proc/{pid}/cwd").resolve() == Path(workspace).resolve()
    settled()
    assert agent_connections.warm() == []


def test_warm_agents_never_cross_sandboxes(sandbox, stranger):
    services.connect_agent(sandbox, uuid.uuid4())
    owners = warm_of(sandbox).process.pid
    theirs = services.provision_sandbox(stranger)
    connection = services.connect_agent(theirs, uuid.uuid4())
    assert agent_pid(connection) != owners
    assert warm_of(sandbox).process.pid == owners  # still waiting for its own sandbox
    assert warm_of(theirs).process.pid != owners
    # Stopping one sandbox's agents stops its warm agent, not the other's.
    services.terminate_sandbox(sandbox)
    assert gone(owners)
    assert warm_of(theirs).is_running


def test_a_warm_agent_for_another_launch_is_never_handed_out(sandbox):
    keyed = Launch(default_agent(), {"PROVIDER_API_KEY": "sk-old-0123456789"})
    services.connect_agent(sandbox, uuid.uuid4(), launch=keyed)
    stale = warm_of(sandbox).process.pid
    # The key changed: the next session's agent must get the new one.
    fresh = Launch(default_agent(), {"PROVIDER_API_KEY": "sk-new-9876543210"})
    connection = services.connect_agent(sandbox, uuid.uuid4(), launch=fresh)
    assert agent_pid(connection) != stale
    settled()
    assert gone(stale)
    _, _, launch = agent_connections.warm(sandbox.pk)[0]
    assert launch == fresh


def test_a_new_sandbox_warms_its_owners_likely_agent(owner):
    sandbox = services.provision_sandbox(owner)  # becoming running starts one
    pid = warm_of(sandbox).process.pid
    connection = services.connect_agent(sandbox, uuid.uuid4())
    assert agent_pid(connection) == pid


def test_a_session_waits_for_its_warm_agent_still_starting(monkeypatch, owner):
    """A session that comes while its sandbox's warm agent is starting takes that agent
    when it is ready, rather than starting another."""
    gate, started = threading.Event(), []
    start = warm_agents_module.start_warm_connection

    def held_start(sandbox, launch):
        gate.wait(30)
        started.append(start(sandbox, launch))
        return started[-1]

    monkeypatch.setattr(warm_agents_module, "start_warm_connection", held_start)
    sandbox = services.provision_sandbox(owner)  # becoming running starts one
    key = wait_for(lambda: next(iter(agent_connections._warming), None))
    taken: list = []

    def open_session() -> None:
        try:
            taken.append(services.connect_agent(sandbox, uuid.uuid4()))
        finally:
            db.connection.close()

    session = threading.Thread(target=open_session)
    session.start()
    # Until the session waits for the warm agent's start (or, wrongly, started its own).
    wait_for(lambda: taken or agent_connections._key_locks[key].users == 2)
    gate.set()
    session.join(30)
    assert taken == started, "the session took the warm agent"
    assert agent_pid(taken[0]) == started[0].process.pid


def wait_for(found, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not (value := found()):
        assert time.monotonic() < deadline, "never came"
        time.sleep(0.01)
    return value


def test_a_session_through_pod_exec_takes_a_warm_agent(kube_backend, settings, owner):
    sandbox = services.provision_sandbox(owner)
    warm = warm_of(sandbox)
    session_id = uuid.uuid4()
    connection = services.connect_agent(sandbox, session_id)
    assert connection is warm
    items = run_turn(connection, "write notes.txt warm hello")
    assert items
    listing = services.session_workspace(sandbox, session_id).list_folder("")
    assert "notes.txt" in [entry["name"] for entry in listing.entries]
