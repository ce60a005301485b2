"""Status that is live: the sandbox's state and the list of sessions, pushed over the socket.

A real daphne (the local backend, or the kubernetes one against the test API server, whose
pods take seconds to become Ready), the real demo agent, real websockets; Redis and two
workers for the notices that cross processes; the reaper in this process, with its sockets.
"""

from __future__ import annotations

import itertools
import secrets
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.utils import timezone

from craft.live import status
from craft.live.consumer import SessionConsumer
from craft.live.session_status import CHANGED_SESSIONS_AT_MOST
from craft.session_activity import session_activity
from craft.storage.db import db_sync_to_async
from sandboxes import reaper
from sandboxes.models import Sandbox
from sandboxes.signals import announce_change
from tests.ready import open_ready_session

from ...server import Daphne, Socket, api
from ..cluster.test_workers import redis_url, workers  # noqa: F401 (fixtures)
from ..wsclient import open_socket, receive_until, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def is_sandbox(status: str):
    return lambda frame: frame.get("type") == "sandbox" and frame.get("status") == status


def is_turn_end(frame: dict[str, Any]) -> bool:
    return frame.get("type") == "event" and frame.get("kind") == "turn_end"


def admin_terminate(server: Daphne, staff: Any, sandbox_id: Any, action: str = "terminate") -> None:
    """Terminate a sandbox as an administrator does: the sandbox inventory's action (or
    another `action` of it: `sleep`, `wake`)."""
    csrf = secrets.token_hex(16)
    form = {"action": action, "_selected_action": str(sandbox_id), "index": "0", "post": "yes"}
    request = urllib.request.Request(
        f"{server.url}/admin/sandboxes/sandbox/",
        data=urlencode(form).encode(),
        method="POST",
        headers={
            "Cookie": f"{session_cookie(staff)}; csrftoken={csrf}",
            "X-CSRFToken": csrf,
            "Origin": server.url,
            "Referer": f"{server.url}/admin/sandboxes/sandbox/",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 200


def listed(server: Daphne, user: Any) -> dict[str, dict[str, Any]]:
    """Return the user's sessions as GET /api/sessions/ lists them, by title."""
    status, body = api(server, user, "GET", "/api/sessions/")
    assert status == 200, body
    return {item["title"]: item for item in body["sessions"]}


def next_listing(
    watcher: Socket, server: Daphne, user: Any, title: str, done: Any, named: bool = True
) -> dict:
    """Read `sessions` frames until, after one, the list shows session `title` as `done`
    wants it; return its item. Every change sends a frame: a missing one times out. A frame
    names the sessions that changed (`named`), or none (read the whole list)."""
    while True:
        frame = watcher.frame()
        if frame.get("type") != "sessions":
            continue
        item = listed(server, user)[title]
        if done(item):
            if named:
                assert item["id"] in frame["sessions"], frame
            else:
                assert frame == {"type": "sessions"}
            return item


def test_the_socket_follows_a_pod_from_provisioning_to_running(kube, owner, tmp_path):
    kube.ready_delay = 2
    server = Daphne(
        tmp_path,
        CRAFT_SANDBOX_BACKEND="kubernetes",
        CRAFT_K8S_KUBECONFIG=str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
        CRAFT_K8S_NAMESPACE="craft-live-status",
        CRAFT_K8S_POLL_INTERVAL="0.1",
        CRAFT_K8S_READY_TIMEOUT="30",
        CRAFT_AGENT_COMMAND=f"{sys.executable} -m sandboxes.in_sandbox.demo_agent",
    ).start()
    try:
        status, session = api(server, owner, "POST", "/api/sessions/", {"title": "pod"})
        assert status == 201, session
        sock = Socket(server, owner, session["id"])
        try:
            assert sock.hello["sandbox"]["status"] == "provisioning"
            frames = sock.until(is_sandbox("running"))
            sandbox = [f for f in frames if f["type"] == "sandbox"]
            # Each step as it happens (the hello may already say how far the pod got), each
            # frame a new state, the last one what the row says.
            pushed = ({k: f[k] for k in f if k != "type"} for f in sandbox)
            states = [sock.hello["sandbox"], *pushed]
            assert any(s["status"] == "provisioning" and "pod" in s["detail"] for s in states)
            assert all(a != b for a, b in itertools.pairwise(states))
            running = {"type": "sandbox", "id": session["sandbox"], "status": "running",
                       "detail": "ready", "error": ""}  # fmt: skip
            assert sandbox[-1] == running
            # Prompts go through once it says so.
            sock.send({"type": "resume", "after": 0})
            sock.send({"type": "prompt", "id": "p1", "text": "hello"})
            assert sock.until(is_turn_end)[-1]["data"] == {"stop_reason": "end_turn"}
        finally:
            sock.close()
    finally:
        server.terminate()


def test_an_administrator_s_terminate_reaches_the_owner_s_socket(owner, staff, tmp_path):
    session = open_ready_session(owner, "terminated under me")
    server = Daphne(tmp_path).start()
    try:
        sock = Socket(server, owner, session.pk)
        assert sock.hello["sandbox"]["status"] == "running"
        admin_terminate(server, staff, session.sandbox_id)
        frames = sock.until(is_sandbox("terminated"))
        assert frames[-1] == {
            "type": "sandbox", "id": str(session.sandbox_id), "status": "terminated",
            "detail": Sandbox.STOPPED_BY_STAFF, "error": "",
        }  # fmt: skip
        sock.close()
    finally:
        server.terminate()


@pytest.mark.asyncio
async def test_the_reaper_s_idle_terminate_reaches_the_socket(owner, settings):
    settings.CRAFT_SANDBOX_IDLE_SECONDS = 60
    session = await db_sync_to_async(open_ready_session)(owner, "idle")
    cookie = await db_sync_to_async(session_cookie)(owner)
    comm, hello = await open_socket(session.pk, cookie)
    assert hello["sandbox"]["status"] == "running"
    long_ago = timezone.now() - timedelta(hours=1)
    await db_sync_to_async(
        lambda: Sandbox.objects.filter(pk=session.sandbox_id).update(last_activity_at=long_ago)
    )()
    await db_sync_to_async(lambda: session.__class__.objects.update(updated_at=long_ago))()
    # The reaper runs on a thread of its own, as in the server.
    await db_sync_to_async(reaper.reap_sandboxes)(session_activity)
    frames = await receive_until(comm, is_sandbox("terminated"))
    # A socket folds a burst of changes into one read: `terminating` may be skipped, but the
    # last frame says why the sandbox stopped.
    assert frames[-1] == {"type": "sandbox", "id": str(session.sandbox_id), "status": "terminated",
                          "detail": Sandbox.STOPPED_IDLE, "error": ""}  # fmt: skip
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_sandbox_change_while_the_socket_opens_reaches_it(owner, monkeypatch):
    """The socket reads its session (and sandbox) once; a change committed after that read,
    before its hello, is sent right after the hello."""
    from craft.live import consumer

    session = await db_sync_to_async(open_ready_session)(owner, "opening")
    cookie = await db_sync_to_async(session_cookie)(owner)
    read = consumer._opening

    async def changed_after_the_read(*args):
        opening = await read(*args)

        def change() -> None:
            Sandbox.objects.filter(pk=session.sandbox_id).update(status_detail="moved on")
            announce_change(session.sandbox_id, owner.pk)

        await db_sync_to_async(change)()
        return opening

    monkeypatch.setattr(consumer, "_opening", changed_after_the_read)
    comm, hello = await open_socket(session.pk, cookie)
    assert hello["sandbox"]["detail"] != "moved on"  # read before the change
    frames = await receive_until(comm, lambda f: f.get("type") == "sandbox")
    assert frames[-1]["detail"] == "moved on"
    await comm.disconnect()


def test_the_session_list_follows_every_session_s_turns(owner, tmp_path):
    watched = open_ready_session(owner, "watched")
    busy = open_ready_session(owner, "busy")
    server = Daphne(tmp_path).start()
    try:
        watcher = Socket(server, owner, watched.pk)
        watcher.send({"type": "follow_sessions"})
        worker = Socket(server, owner, busy.pk)
        worker.send({"type": "resume", "after": 0})

        def busy_is(state: str, unread: bool = False) -> dict:
            return next_listing(
                watcher, server, owner, "busy",
                lambda item: (item["state"], item["unread"]) == (state, unread),
            )  # fmt: skip

        worker.send({"type": "prompt", "id": "w1", "text": "slow 20 0.1"})
        busy_is("working")
        worker.until(is_turn_end)
        busy_is("idle", unread=True)  # nobody looked at it since

        worker.send({"type": "seen"})  # its page is in view: read, and every list hears so
        busy_is("idle", unread=False)

        worker.send({"type": "prompt", "id": "w2", "text": "write notes.txt hi"})
        busy_is("needs_approval")
        request = worker.until(lambda f: f.get("kind") == "permission_request")[-1]
        worker.send({"type": "permission", "request": request["data"]["request"],
                     "option": "allow"})  # fmt: skip
        worker.until(is_turn_end)
        busy_is("idle", unread=True)

        worker.send({"type": "prompt", "id": "w3", "text": "fail"})
        busy_is("failed", unread=True)
        worker.close()

        def names(session_id: str) -> None:
            frame = watcher.until(lambda f: f.get("type") == "sessions")[-1]
            while session_id not in frame.get("sessions", []):
                frame = watcher.until(lambda f: f.get("type") == "sessions")[-1]

        # A session created and one deleted are named too (the page adds or drops its item).
        code, created = api(server, owner, "POST", "/api/sessions/", {"title": "new"})
        assert code == 201, created
        names(created["id"])
        assert api(server, owner, "DELETE", f"/api/sessions/{busy.pk}/")[0] == 204
        names(str(busy.pk))
        watcher.close()
    finally:
        server.terminate()


def test_a_sessions_frame_names_at_most_twenty_sessions():
    socket = SessionConsumer()
    socket._follows_sessions = True  # its `hello` is not sent: notices are only noted

    def notice(session: str | None) -> None:
        socket.notice({"type": status.SESSIONS_CHANGED, "session": session})

    for n in range(CHANGED_SESSIONS_AT_MOST):
        notice(f"s{n}")
    notice("s0")  # again: still twenty
    assert socket._changed_sessions == {f"s{n}" for n in range(CHANGED_SESSIONS_AT_MOST)}
    notice("one more")
    assert socket._changed_sessions is None  # the page reads its whole list
    notice("s1")
    assert socket._changed_sessions is None  # until the frame is sent
    socket._sessions_stale = False  # as when sent
    notice("s2")
    assert socket._changed_sessions == {"s2"}
    notice(None)  # a change that names no session
    assert socket._changed_sessions is None


def test_a_change_before_the_socket_follows_the_list_is_not_lost(owner, tmp_path):
    watched = open_ready_session(owner, "watched")
    busy = open_ready_session(owner, "busy")
    server = Daphne(tmp_path).start()
    try:
        # The page's socket is connected and listening, but has not asked to follow yet (its
        # `follow_sessions` is on its way) while another session's turn starts and ends.
        watcher = Socket(server, owner, watched.pk)
        worker = Socket(server, owner, busy.pk)
        worker.send({"type": "resume", "after": 0})
        worker.send({"type": "prompt", "id": "m1", "text": "hello"})
        worker.until(is_turn_end)
        watcher.send({"type": "follow_sessions"})
        # Which sessions changed before it followed is not known: the frame names none.
        item = next_listing(watcher, server, owner, "busy", lambda i: i["unread"], named=False)
        assert item["state"] == "idle"
        watcher.close()
        worker.close()
    finally:
        server.terminate()


def test_status_notices_cross_workers(workers, owner, staff, tmp_path: Path):  # noqa: F811
    watched = open_ready_session(owner, "watched")
    busy = open_ready_session(owner, "busy")
    first, second = workers(2)
    watcher = Socket(first, owner, watched.pk)
    watcher.send({"type": "follow_sessions"})
    worker = Socket(second, owner, busy.pk)
    worker.send({"type": "resume", "after": 0})
    worker.send({"type": "prompt", "id": "x1", "text": "hello"})
    worker.until(is_turn_end)
    item = next_listing(watcher, first, owner, "busy", lambda item: item["unread"])
    assert item["state"] == "idle"
    admin_terminate(second, staff, watched.sandbox_id)
    assert watcher.until(is_sandbox("terminated"))[-1]["status"] == "terminated"
    watcher.close()
    worker.close()
