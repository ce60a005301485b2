"""Warm agents through the whole server: daphne in a subprocess, the catalog from a
CRAFT_AGENTS_FILE, real agent processes of the local backend.

A warm agent is found as a process of the sandbox working in the sandbox's home (where warm
agents wait); its pid is read before the session that takes it exists.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from craft.models import Event, TurnRecord
from sandboxes.models import Sandbox
from tests.catalog import KEY
from tests.ready import running_sandbox

from ..procs import killed
from ..server import Socket, api, ask, open_session
from .turns.test_reattach import REMEMBERED

pytestmark = pytest.mark.django_db(transaction=True)

OLD_KEY = "sk-olivia-0123456789-old"
NEW_KEY = "sk-olivia-0123456789-new"


@pytest.fixture
def server(catalog_server):
    return catalog_server(CRAFT_WARM_AGENTS="1")


def waiting_in_home(sandbox: Sandbox, running: str = "") -> list[int]:
    """Return the pids of processes working in the sandbox's home: its warm agents (those
    whose command line holds `running`)."""
    home = Path(sandbox.reference, "home").resolve()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (
                    (entry / "cwd").resolve() == home
                    and (entry / "stat").read_text().split(") ", 1)[1][0] != "Z"
                    and running.encode() in (entry / "cmdline").read_bytes()
                ):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def warm_pid(sandbox: Sandbox, but: tuple[int, ...] = (), running: str = "") -> int:
    """Wait for the one warm agent of the sandbox (running `running`) that is not in `but`."""
    deadline = time.monotonic() + 30
    while True:
        pids = [pid for pid in waiting_in_home(sandbox, running) if pid not in but]
        if pids:
            assert len(pids) == 1, pids
            return pids[0]
        assert time.monotonic() < deadline, "no warm agent"
        time.sleep(0.05)


def test_a_new_sessions_first_prompt_is_served_by_a_pre_started_process(server, owner):
    first = open_session(server, owner, "demo")
    sandbox = running_sandbox(owner)
    first_pid = int(ask(first, "pid").split()[1])
    pid = warm_pid(sandbox, but=(first_pid,))

    second = open_session(server, owner, "demo")  # exists only now
    assert int(ask(second, "pid").split()[1]) == pid
    assert warm_pid(sandbox, but=(first_pid, pid)) != pid  # replaced in the background
    first.close()
    second.close()


def test_a_session_created_through_the_api_takes_its_warm_agent_before_its_first_prompt(
    server, owner
):
    first = open_session(server, owner, "demo")
    sandbox = running_sandbox(owner)
    first_pid = int(ask(first, "pid").split()[1])
    pid = warm_pid(sandbox, but=(first_pid,))

    # No socket, no start_agent: the API's create starts the agent (its session/new) and
    # takes the first checkpoint, so that the first prompt need not.
    status, created = api(server, owner, "POST", "/api/sessions/", {"agent": "demo"})
    assert status == 201, created
    deadline = time.monotonic() + 30
    while not Event.objects.filter(session_id=created["id"], kind="agent_info").exists():
        assert time.monotonic() < deadline, "the agent was not started before a prompt"
        time.sleep(0.05)
    second = Socket(server, owner, created["id"])
    second.send({"type": "resume", "after": 0})
    assert int(ask(second, "pid").split()[1]) == pid
    noted = TurnRecord.objects.filter(session_id=created["id"]).exclude(checkpoint_before="")
    while not noted.exists():  # noted beside the turn, not before it
        assert time.monotonic() < deadline, "the first turn has no checkpoint from before it"
        time.sleep(0.05)
    first.close()
    second.close()


def test_a_session_whose_agent_died_continues_on_a_pre_started_process(server, owner):
    sock = open_session(server, owner, "demo")
    sandbox = running_sandbox(owner)
    assert ask(sock, "remember banana") == "I will remember banana."
    first_pid = int(ask(sock, "pid").split()[1])
    pid = warm_pid(sandbox, but=(first_pid,))

    killed(first_pid)
    sock.send({"type": "prompt", "id": "recall", "text": "recall"})
    frames = sock.until(lambda f: f.get("kind") == "turn_end")
    assert [f["data"] for f in frames if f.get("kind") == "agent_restarted"] == [
        {"restored": "resume"}
    ]
    chunks = [f["data"] for f in frames if f.get("kind") == "agent_message_chunk"]
    reply = "".join(chunk["content"]["text"] for chunk in chunks)
    assert reply == REMEMBERED, frames
    assert int(ask(sock, "pid").split()[1]) == pid, "the warm agent continued the session"
    assert warm_pid(sandbox, but=(first_pid, pid)) != pid  # replaced in the background
    sock.close()


def test_a_warm_agent_gets_exactly_the_sessions_environment_and_key(server, owner):
    status, body = api(server, owner, "PUT", f"/api/credentials/{KEY}/", {"value": OLD_KEY})
    assert status == 200, body
    first = open_session(server, owner, "keyed")
    sandbox = running_sandbox(owner)
    first_pid = int(ask(first, "pid"))
    first_env = json.loads(ask(first, "env"))
    # The sandbox may have warmed its owner's likely agent before this session existed (the
    # catalog's first, the demo agent): that one is stopped, never handed out, and the keyed
    # agent is warmed in its place.
    pid = warm_pid(sandbox, but=(first_pid,), running="env_agent.py")

    second = open_session(server, owner, "keyed")
    assert int(ask(second, "pid")) == pid
    assert json.loads(ask(second, "env")) == first_env
    assert first_env[KEY] == OLD_KEY

    # A key changed since the warm agent started: the next session's agent has the new one.
    waiting = warm_pid(sandbox, but=(first_pid, pid), running="env_agent.py")
    status, body = api(server, owner, "PUT", f"/api/credentials/{KEY}/", {"value": NEW_KEY})
    assert status == 200, body
    third = open_session(server, owner, "keyed")
    assert int(ask(third, "pid")) != waiting
    assert json.loads(ask(third, "env"))[KEY] == NEW_KEY
    for socket in (first, second, third):
        socket.close()


def test_no_agent_is_kept_warm_without_its_owners_key(server, owner, stranger):
    # The stranger's latest session is for the keyed agent, whose key they never stored.
    status, _ = api(server, stranger, "POST", "/api/sessions/", {"agent": "keyed"})
    assert status == 201
    sandbox = running_sandbox(stranger)
    # The owner's sandbox, made after it, does get its warm agent: the warming had its turn.
    open_session(server, owner, "demo").close()
    warm_pid(running_sandbox(owner))
    assert os.path.isdir(sandbox.reference)
    assert waiting_in_home(sandbox) == []
