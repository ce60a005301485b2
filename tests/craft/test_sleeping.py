"""Sleeping sandboxes on the local backend, through daphne: an idle sandbox sleeps (its agents
stopped, its files kept), the next prompt wakes it and is answered by an agent that remembers,
a turn longer than the sleep time keeps it awake, and a sleep that races a prompt loses nothing.

As `make run` runs as root (sandbox users, their jail, network and budget), except the race,
which drives the sleep from this process (as another worker's reaper would) on the test
settings' sandboxes.
"""

from __future__ import annotations

import os
import secrets
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from craft.session_activity import session_activity
from sandboxes import services
from sandboxes.models import Sandbox

from ..server import Daphne, api, ask, open_session
from .wsclient import session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.skipif(
    os.geteuid() != 0, reason="sandbox users need root"
)]  # fmt: skip

# The agents of an idle session stop after a second, its sandbox sleeps two seconds after its
# last use (the least CRAFT_REAPER_INTERVAL_SECONDS allows).
QUICK_SLEEP = {
    "CRAFT_AGENT_IDLE_SECONDS": "1",
    "CRAFT_REAPER_INTERVAL_SECONDS": "1",
    "CRAFT_SANDBOX_SLEEP_SECONDS": "2",
}


@pytest.fixture
def server(django_db_setup, tmp_path_factory, uid_base, place):
    """Daphne with sandbox users, their jail, network and budget, as `make run` as root."""
    daphne = Daphne(
        tmp_path_factory.mktemp("sleeping-server"),
        CRAFT_SANDBOX_UIDS="on",
        CRAFT_SANDBOX_ROOT=str(place / "sandboxes"),
        CRAFT_SANDBOX_UID_BASE=str(uid_base),
        CRAFT_SANDBOX_UID_COUNT="1000",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        **QUICK_SLEEP,
    )
    try:
        yield daphne.start()
    finally:
        daphne.terminate(timeout=30)


def sandbox_of(server: Daphne, user: Any) -> dict[str, Any]:
    status, sandbox = api(server, user, "GET", "/api/sandbox/")
    assert status == 200, sandbox
    return sandbox


def wait_for_status(server: Daphne, user: Any, wanted: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while (sandbox := sandbox_of(server, user))["status"] != wanted or sandbox["detail"] in (
        Sandbox.FALLING_ASLEEP  # not asleep yet
    ):
        assert time.monotonic() < deadline, sandbox
        time.sleep(0.1)
    return sandbox


def put_file(server: Daphne, user: Any, session_id: str, path: str, body: bytes) -> int:
    csrf = secrets.token_hex(16)
    request = urllib.request.Request(
        f"{server.url}/api/sessions/{session_id}/files/raw?path={path}",
        data=body,
        method="PUT",
        headers={
            "Cookie": f"{session_cookie(user)}; csrftoken={csrf}",
            "X-CSRFToken": csrf,
            "Content-Type": "application/octet-stream",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.status


def read_file(server: Daphne, user: Any, session_id: str, path: str) -> bytes:
    request = urllib.request.Request(
        f"{server.url}/api/sessions/{session_id}/files/raw?path={path}",
        headers={"Cookie": session_cookie(user)},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read()


def processes_of(uid: int) -> list[int]:
    """Return the processes running as `uid` on this machine."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue  # gone meanwhile
        # A zombie runs no more: it waits for its parent (one of Craft's threads) to reap it.
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            found.append(int(status.parent.name))
    return found


def test_an_idle_sandbox_sleeps_and_the_next_prompt_wakes_it_with_its_files_and_memory(
    server, owner
):
    sock = open_session(server, owner, "default")
    session_id = sock.hello["session"]
    # A turn longer than the sleep time keeps the sandbox awake however long it runs.
    sock.send({"type": "prompt", "id": "long", "text": "slow 12 0.5"})
    statuses = set()
    for frame in sock.until(lambda f: f.get("kind") == "turn_end"):
        if frame.get("kind") == "agent_message_chunk":
            statuses.add(sandbox_of(server, owner)["status"])
    assert statuses == {"running"}
    assert "pelican" in ask(sock, "remember pelican")
    assert put_file(server, owner, session_id, "notes/plan.txt", b"kept across sleep") == 201

    asleep = wait_for_status(server, owner, "sleeping")

    assert asleep["detail"] == Sandbox.ASLEEP_IDLE
    row = Sandbox.objects.get(pk=asleep["id"])
    left = processes_of(Path(row.reference).stat().st_uid)
    assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
    assert row.reaper_actions.first().kind == "slept_idle"

    answer = ask(sock, "recall")  # wakes it: queued, answered once it is up

    assert "pelican" in answer
    restarted = [e["data"] for e in sock.events if e["kind"] == "agent_restarted"]
    assert restarted and restarted[-1]["restored"] in ("resume", "load"), restarted
    assert sandbox_of(server, owner)["status"] == "running"
    assert read_file(server, owner, session_id, "notes/plan.txt") == b"kept across sleep"
    prompts = [e for e in sock.events if e["kind"] == "user_message"]
    assert [p["data"]["text"] for p in prompts][-1] == "recall"
    sock.close()


def test_the_files_panel_wakes_a_sleeping_sandbox(server, owner):
    sock = open_session(server, owner, "default")
    session_id = sock.hello["session"]
    ask(sock, "count 1")
    sock.close()
    wait_for_status(server, owner, "sleeping")

    status, body = api(server, owner, "GET", f"/api/sessions/{session_id}/files/?path=")

    assert (status, body["error"]["code"]) == (503, "sandbox_unavailable"), body
    assert "waking up" in body["error"]["message"]
    wait_for_status(server, owner, "running")
    status, body = api(server, owner, "GET", f"/api/sessions/{session_id}/files/?path=")
    assert status == 200, body


@pytest.mark.parametrize("prompt_lands", ["before the sleep looks again", "after it"])
def test_a_sleep_that_races_a_prompt_answers_it_once(tmp_path, owner, prompt_lands):
    # This server's reaper leaves the sandbox awake: the sleep comes from here.
    server = Daphne(tmp_path, **{**QUICK_SLEEP, "CRAFT_SANDBOX_SLEEP_SECONDS": "0"}).start()
    try:
        sock = open_session(server, owner, "default")
        ask(sock, "count 1")
        sandbox = Sandbox.objects.get(owner=owner)
        # As when a reaper puts it to sleep: no agent lives (it stops after a second idle).
        deadline = time.monotonic() + 30
        while not sandbox.reaper_actions.filter(kind="stopped_idle_agent").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        sandbox.refresh_from_db()

        def busy() -> frozenset:
            # The prompt comes while the sandbox is falling asleep.
            sock.send({"type": "prompt", "id": "racer", "text": "count 2"})
            if prompt_lands == "after it":
                return frozenset()  # as if it came just after this look
            sock.until(lambda f: f.get("kind") == "user_message")
            return session_activity.busy().sandboxes

        slept = services.sleep_sandbox(sandbox, busy, idle_since=sandbox.last_activity_at)

        frames = sock.until(lambda f: f.get("kind") == "turn_end")
        assert slept == (prompt_lands == "after it")
        kinds = [f.get("kind") for f in frames]
        assert "agent_error" not in kinds, frames
        chunks = "".join(
            f["data"]["content"]["text"] for f in frames if f.get("kind") == "agent_message_chunk"
        )
        assert chunks == "1\n2\n"
        assert [e["data"]["id"] for e in sock.events if e["kind"] == "user_message"].count(
            "racer"
        ) == 1
        assert Sandbox.objects.get(pk=sandbox.pk).status == Sandbox.Status.RUNNING
        sock.close()
    finally:
        server.terminate(timeout=30)
