"""A person's keys reach that person's agents, in their environment, and nothing else.

Real parts: daphne in a subprocess, the catalog from a CRAFT_AGENTS_FILE, real agent
processes of the local backend (tests/agents/env_agent.py prints what it was started with).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from craft.models import Event
from tests.catalog import KEY
from tests.ready import running_sandbox

from ..server import Daphne, api, ask, open_session

pytestmark = pytest.mark.django_db(transaction=True)

OLIVIA_KEY = "sk-olivia-0123456789-secret"
SAM_KEY = "sk-sam-9876543210-secret"


@pytest.fixture
def server(catalog_server):
    return catalog_server()


def test_each_agent_gets_its_owners_key_in_its_environment_only(server, owner, stranger):
    for user, key in ((owner, OLIVIA_KEY), (stranger, SAM_KEY)):
        status, body = api(server, user, "PUT", f"/api/credentials/{KEY}/", {"value": key})
        assert status == 200, body
    sockets = {}
    for user in (owner, stranger):
        sockets[user.pk] = open_session(server, user, "keyed")
        running_sandbox(user)

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
    socket = open_session(server, owner, "keyed")
    running_sandbox(owner)
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
    socket = open_session(server, stranger, "keyed")
    running_sandbox(stranger)
    socket.send({"type": "prompt", "id": "p", "text": "env"})
    refused = socket.until(lambda f: f["type"] == "error")[-1]
    assert refused["code"] == "credentials_missing"
    assert OLIVIA_KEY not in json.dumps(refused)
    socket.close()
    assert get_user_model().objects.count() == 2


def test_an_agent_that_wants_a_sign_in_names_the_key_its_catalog_entry_asks_for(tmp_path, owner):
    # An agent that asks for a key, and refuses every session until someone signs in (the
    # demo agent's `--auth`): what a model provider's CLI does with a key it does not take.
    command = shlex.join([sys.executable, "-m", "sandboxes.in_sandbox.demo_agent", "--auth"])
    catalog = tmp_path / "agents.toml"
    catalog.write_text(
        "[[agents]]\n"
        'id = "signin"\n'
        f"command = {json.dumps(command)}\n"
        f'credentials = [{{ name = "{KEY}", label = "Provider API key" }}]\n'
    )
    server = Daphne(tmp_path, CRAFT_AGENTS_FILE=str(catalog)).start()
    try:
        api(server, owner, "PUT", f"/api/credentials/{KEY}/", {"value": OLIVIA_KEY})
        socket = open_session(server, owner, "signin")
        running_sandbox(owner)
        socket.send({"type": "prompt", "id": "p", "text": "hello"})
        frames = socket.until(lambda f: f.get("kind") == "turn_end")
        (error,) = [f["data"] for f in frames if f.get("kind") == "agent_error"]
        assert error["reason"] == "auth_required"
        assert error["keys"] == [{"name": KEY, "label": "Provider API key"}]
        assert error["message"].endswith(
            f"It signs in with the key you stored on the Keys page: Provider API key ({KEY}). "
            "Check it there (it may be wrong or expired), then send your message again."
        )
        assert "CRAFT_AGENT_ENV" not in error["message"]
        assert OLIVIA_KEY not in json.dumps(frames)
        socket.close()
    finally:
        server.stop()
