"""The cache of agent connections, observed on real demo-agent processes.

Each behaviour is checked through the service that the chat uses (`connect_agent`), and the
agent's own process id (it answers "pid") proves which process served a prompt.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest

from sandboxes import services
from sandboxes.acp import TurnEnd
from sandboxes.connections import agent_connections

from ..conftest import run_concurrently
from .agents import reply_text, run_turn

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox(owner):
    return services.provision_sandbox(owner)


@pytest.fixture
def session_id(sandbox):
    return new_session(sandbox)


def agent_pid(connection) -> int:
    return int(reply_text(run_turn(connection, "pid")).split()[1])


def new_session(sandbox):
    sid = uuid.uuid4()
    services.create_session_workspace(sandbox, sid)
    return sid


def test_the_first_prompt_starts_and_caches_a_connection(sandbox, session_id):
    assert agent_connections.get(sandbox.pk, session_id) is None
    connection = services.connect_agent(sandbox, session_id)
    assert connection.is_running
    assert agent_connections.get(sandbox.pk, session_id) is connection
    assert agent_pid(connection) == connection.process.pid


def test_follow_up_prompts_reuse_the_same_agent_process(sandbox, session_id):
    first = services.connect_agent(sandbox, session_id)
    pid_before = agent_pid(first)
    second = services.connect_agent(sandbox, session_id)
    assert second is first
    assert agent_pid(second) == pid_before


def test_a_dead_connection_is_replaced_by_a_new_process(sandbox, session_id):
    first = services.connect_agent(sandbox, session_id)
    old_pid = agent_pid(first)
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while first.is_running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not first.is_running
    replacement = services.connect_agent(sandbox, session_id)
    assert replacement is not first
    assert agent_pid(replacement) != old_pid
    assert agent_connections.get(sandbox.pk, session_id) is replacement


def test_different_sessions_get_different_connections(sandbox, session_id):
    other = new_session(sandbox)
    a = services.connect_agent(sandbox, session_id)
    b = services.connect_agent(sandbox, other)
    assert a is not b
    assert agent_pid(a) != agent_pid(b)


def test_terminating_a_sandbox_stops_its_connections_and_no_other(sandbox, session_id, stranger):
    mine = [services.connect_agent(sandbox, session_id)]
    mine.append(services.connect_agent(sandbox, new_session(sandbox)))
    other_sandbox = services.provision_sandbox(stranger)
    theirs = services.connect_agent(other_sandbox, new_session(other_sandbox))

    services.terminate_sandbox(sandbox)

    assert all(not c.is_running for c in mine)
    assert agent_connections.count(sandbox.pk) == 0
    assert theirs.is_running
    assert agent_connections.count(other_sandbox.pk) == 1


def test_cleaning_up_a_session_stops_its_connection(sandbox, session_id):
    connection = services.connect_agent(sandbox, session_id)
    other = services.connect_agent(sandbox, new_session(sandbox))
    services.remove_session_workspace(sandbox, session_id)
    assert not connection.is_running
    assert agent_connections.get(sandbox.pk, session_id) is None
    assert other.is_running


def test_cleaning_up_a_session_without_a_connection_is_fine(sandbox, session_id):
    services.remove_session_workspace(sandbox, session_id)
    assert agent_connections.get(sandbox.pk, session_id) is None


def test_two_concurrent_first_prompts_create_one_connection(sandbox, session_id):
    got = run_concurrently(lambda: services.connect_agent(sandbox, session_id), 4)
    assert len(got) == 4
    assert all(c is got[0] for c in got)
    assert agent_connections.count(sandbox.pk) == 1


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
