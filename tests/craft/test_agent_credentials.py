"""A person's keys reach that person's agents, in their environment, and nothing else.

Real parts: daphne in a subprocess, the catalog from a CRAFT_AGENTS_FILE, real agent
processes of the local backend (tests/agents/env_agent.py prints what it was started with).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from craft.models import Event
from tests.catalog import KEY, catalog_toml

from ..server import Daphne, Socket, api

pytestmark = pytest.mark.django_db(transaction=True)

OLIVIA_KEY = "sk-olivia-0123456789-secret"
SAM_KEY = "sk-sam-9876543210-secret"


@pytest.fixture
def server(tmp_path: Path):
    agents = tmp_path / "agents.toml"
    agents.write_text(catalog_toml())
    daphne = Daphne(tmp_path, CRAFT_AGENTS_FILE=str(agents)).start()
    try:
        yield daphne
    finally:
        daphne.stop()


def ask(socket: Socket, text: str) -> str:
    """Send a prompt and return what the agent answered in that turn."""
    socket.send({"type": "prompt", "id": f"{text}-{time.monotonic()}", "text": text})
    frames = socket.until(lambda f: f.get("kind") == "turn_end")
    chunks = [f["data"] for f in frames if f.get("kind") == "agent_message_chunk"]
    errors = [f for f in frames if f.get("kind") == "agent_error" or f["type"] == "error"]
    assert chunks, errors or frames
    return "".join(chunk["content"]["text"] for chunk in chunks)


def keyed_session(server: Daphne, user) -> Socket:
    status, session = api(server, user, "POST", "/api/sessions/", {"agent": "keyed"})
    assert status == 201, session
    socket = Socket(server, user, session["id"])
    socket.send({"type": "resume", "after": 0})
    return socket


def wait_running(server: Daphne, user) -> None:
    deadline = time.monotonic() + 30
    while api(server, user, "GET", "/api/sandbox/")[1].get("status") != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_each_agent_gets_its_owners_key_in_its_environment_only(server, owner, stranger):
    for user, key in ((owner, OLIVIA_KEY), (stranger, SAM_KEY)):
        status, body = api(server, user, "PUT", f"/api/credentials/{KEY}/", {"value": key})
        assert status == 200, body
    sockets = {}
    for user in (owner, stranger):
        sockets[user.pk] = keyed_session(server, user)
        wait_running(server, user)

    olivia_env = json.loads(ask(sockets[owner.pk], "env"))
    sam_env = json.loads(ask(sockets[stranger.pk], "env"))
    assert olivia_env[KEY] == OLIVIA_KEY
    assert sam_env[KEY] == SAM_KEY
    assert SAM_KEY not in json.dumps(olivia_env)
    assert OLIVIA_KEY not in json.dumps(sam_env)

    # Not on its command line, which every process of the machine may read.
    pid = int(ask(sockets[owner.pk], "pid"))
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"env_agent.py" in cmdline
    assert OLIVIA_KEY.encode() not in cmdline
    assert OLIVIA_KEY.encode() in Path(f"/proc/{pid}/environ").read_bytes()

    # An agent that writes its key to stderr does not put it in Craft's log.
    assert ask(sockets[owner.pk], "leak") == "written to stderr"

    # Nor in the server's log, nor anywhere in what the database keeps but the ciphertext.
    for socket in sockets.values():
        socket.close()
    server.stop()
    log = server.log.read_text()
    assert OLIVIA_KEY not in log
    assert "debug: PROVIDER_API_KEY=[redacted]" in log
    events = json.dumps(list(Event.objects.exclude(kind="agent_message_chunk").values("data")))
    assert OLIVIA_KEY not in events


def test_a_prompt_to_an_agent_without_its_key_is_refused_and_nothing_is_stored(server, owner):
    socket = keyed_session(server, owner)
    wait_running(server, owner)
    socket.send({"type": "prompt", "id": "first", "text": "hello there"})
    refused = socket.until(lambda f: f["type"] == "error")[-1]
    assert refused["code"] == "credentials_missing"
    assert KEY in refused["message"]
    assert "Keys page" in refused["message"]
    assert not Event.objects.filter(session__owner=owner).exists()

    # Stored, the same prompt goes through (the client sends it again).
    api(server, owner, "PUT", f"/api/credentials/{KEY}/", {"value": OLIVIA_KEY})
    socket.send({"type": "prompt", "id": "first", "text": "hello there"})
    frames = socket.until(lambda f: f.get("kind") == "turn_end")
    assert [f["data"]["stop_reason"] for f in frames if f.get("kind") == "turn_end"] == ["end_turn"]
    socket.close()


def test_another_persons_key_never_makes_an_agent_ready(server, owner, stranger):
    api(server, owner, "PUT", f"/api/credentials/{KEY}/", {"value": OLIVIA_KEY})
    socket = keyed_session(server, stranger)
    wait_running(server, stranger)
    socket.send({"type": "prompt", "id": "p", "text": "env"})
    refused = socket.until(lambda f: f["type"] == "error")[-1]
    assert refused["code"] == "credentials_missing"
    assert OLIVIA_KEY not in json.dumps(refused)
    socket.close()
    assert get_user_model().objects.count() == 2
