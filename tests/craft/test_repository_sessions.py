"""Sessions on a repository, end to end in the server as people run it: as root, the agent (the
hostile test agent) a sandbox user in its jail and its own network, the git host allowed
through CRAFT_SANDBOX_ALLOW; a real git host (`tests.git_server`), a fake Gitea API
(`tests.fake_git_hosts`), the real API views, consumer, runner and event log.

The clone is made before the first turn (the prompt sent meanwhile waits in the queue), then
the agent works and commits, Craft commits the rest, pushes, opens the pull request, and sees
it merged; what fails says so plainly; a clone cut short is made again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import AsyncClient
from django.utils import timezone

from craft import git_tokens
from craft.models import Event, Session, SessionRepository
from craft.storage.db import db_sync_to_async
from sandboxes import services as sandbox_services
from sandboxes.backends import forget_backends
from tests.fake_git_hosts import FakeHost
from tests.git_server import GitServer, git_server, random_bytes  # noqa: F401
from tests.sandboxes.hostile import contain, needs_root

from .wsclient import is_turn_end, open_socket, receive_until, session_cookie

pytestmark = [needs_root, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

TOKEN = "gitea-token-5d8e1f3a9b"
REPO = "team/app.git"


class Hosts:
    """The git host and its API, as this server's only git host."""

    def __init__(self, git: GitServer, api: FakeHost) -> None:
        self.git = git
        self.api = api


@pytest.fixture
def hosts(settings, machine, git_server, tmp_path):  # noqa: F811
    contain(settings, "on")
    settings.CRAFT_SANDBOX_NETWORK = "isolated"
    settings.CRAFT_SANDBOX_ALLOW = [(ipaddress.ip_address("127.0.0.1"), git_server.port)]
    forget_backends()
    with FakeHost("gitea") as api:
        api.add_token(TOKEN, "olivia")
        api.add_repository("team/app")
        path = tmp_path / "hosts.toml"
        path.write_text(api.toml(host=f"127.0.0.1:{git_server.port}"))
        settings.CRAFT_GIT_HOSTS_FILE = str(path)
        yield Hosts(git_server, api)


async def signed_in(user: Any) -> AsyncClient:
    client = AsyncClient()
    await client.aforce_login(user)
    return client


async def post(client: AsyncClient, path: str, body: dict[str, Any] | None = None) -> Any:
    return await client.post(path, json.dumps(body or {}), content_type="application/json")


async def frames_until(comm, done, timeout: float = 90) -> list[dict]:
    return await receive_until(comm, done, timeout)


def kind_of(frame: dict) -> str | None:
    return frame.get("kind") if frame.get("type") == "event" else None


def is_ready_or_failed(frame: dict) -> bool:
    return kind_of(frame) == "repository_status" and frame["data"]["status"] in (
        "ready",
        "failed",
    )


async def ask(comm, prompt_id: str, text: str) -> list[dict]:
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
    return await frames_until(comm, lambda f: is_turn_end(f) or f["type"] == "error")


def answer_of(frames: list[dict]) -> dict:
    for frame in frames:
        if kind_of(frame) == "agent_message_chunk":
            return json.loads(frame["data"]["content"]["text"])
    raise AssertionError(f"no answer in {frames}")


def workspace_of(session_id: Any) -> Path:
    session = Session.objects.select_related("sandbox").get(pk=session_id)
    return Path(sandbox_services.workspace_path(session.sandbox, session.pk))


async def test_a_session_on_a_private_repository_is_cloned_worked_committed_pushed_and_merged(
    hosts, owner
):
    url = hosts.git.create(REPO, {"app.py": b"print('hi')\n"}, writers=(TOKEN,))
    owner.first_name, owner.last_name, owner.email = "Olivia", "Park", "olivia@example.com"
    await owner.asave()
    await db_sync_to_async(git_tokens.store_token)(owner, hosts.git.url.split("//")[1], TOKEN)
    client = await signed_in(owner)
    created = await post(client, "/api/sessions/", {"repository": url, "title": "Fix the bug"})
    assert created.status_code == 201, created.content
    session_id = created.json()["id"]
    assert created.json()["repository"]["status"] in ("pending", "cloning")
    branch = created.json()["repository"]["branch"]
    assert branch.startswith("craft/fix-the-bug-")

    comm, _ = await open_socket(session_id, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    # Sent at once: it waits in the queue for the clone, then runs in it.
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "exec test -f app.py"})
    frames = await frames_until(comm, is_turn_end)
    kinds = [kind_of(f) for f in frames if kind_of(f)]
    assert kinds.index("prompt_queued") < kinds.index("user_message")
    statuses = [f["data"] for f in frames if kind_of(f) == "repository_status"]
    assert statuses[0]["status"] == "cloning" and statuses[-1]["status"] == "ready"
    assert kinds.index("repository_status") < kinds.index("user_message")
    ready = statuses[-1]
    assert ready["branch"] == branch and ready["base"] == "main"
    assert ready["commit"] == hosts.git.branches(REPO)["main"]
    assert answer_of(frames)["code"] == 0  # the agent found the clone in its workspace

    # The agent adds a file and commits it itself; Craft commits the rest.
    await ask(comm, "p2", "exec cp app.py mine.py")
    await ask(comm, "p3", "exec git add mine.py")
    frames = await ask(
        comm, "p4", "exec git -c user.name=Agent -c user.email=agent@example.com commit -qm mine"
    )
    assert answer_of(frames)["code"] == 0, answer_of(frames)
    await ask(comm, "p5", "exec cp app.py theirs.py")

    state = (await client.get(f"/api/sessions/{session_id}/repository/")).json()
    assert (state["status"], state["ahead"], state["behind"], state["dirty"]) == (
        "ready",
        1,
        0,
        True,
    )
    assert state["drafts"]["commit_message"].startswith("Fix the bug")
    assert "Co-authored-by:" in state["drafts"]["commit_message"]

    committed = await post(client, f"/api/sessions/{session_id}/repository/commit/")
    assert committed.status_code == 201, committed.content
    again = await post(client, f"/api/sessions/{session_id}/repository/commit/")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "nothing_to_commit")

    pushed = await post(client, f"/api/sessions/{session_id}/repository/push/")
    assert pushed.status_code == 200, pushed.content
    assert pushed.json() == {"branch": branch, "head": committed.json()["commit"]}
    assert hosts.git.branches(REPO)[branch] == committed.json()["commit"]
    log = hosts.git.log(REPO, branch)
    assert [line.split(" ", 1)[1] for line in log[:2]] == [
        "Olivia Park <olivia@example.com> Fix the bug",
        "Agent <agent@example.com> mine",
    ]

    opened = await post(
        client, f"/api/sessions/{session_id}/repository/pull-request/", {"title": "Fix it"}
    )
    assert opened.status_code == 201, opened.content
    assert opened.json()["state"] == "open"
    [sent] = [r for r in hosts.api.requests if r.method == "POST" and r.path.endswith("/pulls")]
    assert (sent.body["head"], sent.body["base"], sent.body["title"]) == (branch, "main", "Fix it")
    assert f"/sessions/{session_id}/" in sent.body["body"]
    assert sent.headers["authorization"] == f"token {TOKEN}"

    hosts.api.merge("team/app", opened.json()["number"])
    await db_sync_to_async(SessionRepository.objects.filter(session_id=session_id).update)(
        pull_request_checked_at=timezone.now() - timedelta(minutes=5)
    )
    state = (await client.get(f"/api/sessions/{session_id}/repository/")).json()
    assert state["pull_request"]["state"] == "merged"
    listed = (await client.get("/api/sessions/")).json()["sessions"]
    assert listed[0]["repository"]["pull_request"]["state"] == "merged"

    frames = await frames_until(comm, lambda f: kind_of(f) == "pull_request_updated", 10)
    assert frames[-1]["data"]["state"] == "merged"
    await comm.disconnect()

    # The token is nowhere but in its encrypted row and on the wire to its host.
    events = await db_sync_to_async(
        lambda: list(Event.objects.filter(session_id=session_id).values_list("data", flat=True))
    )()
    assert TOKEN not in json.dumps(events)
    folder = await db_sync_to_async(workspace_of)(session_id)
    for path in folder.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    assert hosts.git.tokens_seen() == {TOKEN}


async def test_a_missing_repository_fails_plainly_and_the_waiting_prompt_still_runs(hosts, owner):
    client = await signed_in(owner)
    url = f"{hosts.git.url}/team/nothing-here.git"
    created = await post(client, "/api/sessions/", {"repository": url})
    session_id = created.json()["id"]
    comm, _ = await open_socket(session_id, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "exec ls -A"})
    frames = await frames_until(comm, is_turn_end)
    [failed] = [f["data"] for f in frames if is_ready_or_failed(f)]
    assert failed["status"] == "failed"
    assert failed["code"] in ("repository_not_found", "git_auth_failed")
    assert "team/nothing-here" not in failed["reason"] or "not" in failed["reason"]
    assert frames[-1]["data"]["stop_reason"] == "end_turn"
    commit = await post(client, f"/api/sessions/{session_id}/repository/commit/")
    assert (commit.status_code, commit.json()["error"]["code"]) == (409, "repository_not_ready")
    await comm.disconnect()


@pytest.mark.parametrize(
    "url, code",
    [
        ("file:///etc", "invalid_repository_url"),
        ("ext::sh -c touch% /tmp/pwned", "invalid_repository_url"),
        ("https://127.0.0.1:5432/team/app", "unknown_git_host"),
        ("https://evil.example.com/team/app", "unknown_git_host"),
    ],
)
async def test_urls_that_are_not_an_allowed_hosts_are_refused_and_nothing_is_made(
    hosts, owner, url, code
):
    client = await signed_in(owner)
    refused = await post(client, "/api/sessions/", {"repository": url})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, code)
    assert await db_sync_to_async(Session.objects.count)() == 0


async def test_a_bad_branch_is_refused(hosts, owner):
    client = await signed_in(owner)
    url = hosts.git.create(REPO, public=True)
    refused = await post(client, "/api/sessions/", {"repository": url, "branch": "--upload-pack=x"})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_branch")


async def test_another_persons_session_repository_is_not_found(hosts, owner, stranger):
    url = hosts.git.create(REPO, public=True)
    created = await post(await signed_in(owner), "/api/sessions/", {"repository": url})
    session_id = created.json()["id"]
    other = await signed_in(stranger)
    for path in ("", "commit/", "push/", "pull-request/", "update/"):
        call = other.get if not path else other.post
        answer = await call(f"/api/sessions/{session_id}/repository/{path}")
        assert answer.status_code == 404, path
        assert answer.json()["error"]["code"] == "not_found"


async def test_a_clone_cut_short_is_made_again_from_an_empty_workspace(hosts, owner):
    """A worker died while cloning: the next one that runs the session clones again."""
    url = hosts.git.create(REPO, {"app.py": b"one\n"}, public=True)
    client = await signed_in(owner)
    created = await post(client, "/api/sessions/", {"repository": url})
    session_id = created.json()["id"]
    comm, _ = await open_socket(session_id, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await frames_until(comm, is_ready_or_failed)
    # As a worker that died half way leaves it: marked cloning, files half written.
    folder = await db_sync_to_async(workspace_of)(session_id)
    leftover = folder / "half-written.tmp"
    leftover.write_bytes(b"partial")
    uid = folder.stat().st_uid
    os.chown(leftover, uid, uid)
    await db_sync_to_async(SessionRepository.objects.filter(session_id=session_id).update)(
        status="cloning"
    )
    from craft.turns.registry import runners

    runners.forget_all()  # the runner that made it is gone with its worker
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "exec test -f app.py"})
    frames = await frames_until(comm, is_turn_end)
    assert [f["data"]["status"] for f in frames if is_ready_or_failed(f)] == ["ready"], [
        f["data"] for f in frames if is_ready_or_failed(f)
    ]
    assert answer_of(frames)["code"] == 0
    assert not leftover.exists()
    assert (folder / "app.py").read_bytes() == b"one\n"
    await comm.disconnect()


async def test_the_set_up_runs_once_in_the_sandbox_and_a_failing_one_leaves_the_session_usable(
    hosts, owner
):
    setup = b"#!/bin/sh\necho installing\nid -u > .installed\necho broken >&2\nexit 3\n"
    url = hosts.git.create(REPO, {".craft/setup.sh": setup, "app.py": b"x\n"}, public=True)
    client = await signed_in(owner)
    created = await post(client, "/api/sessions/", {"repository": url})
    session_id = created.json()["id"]
    comm, _ = await open_socket(session_id, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    frames = await frames_until(comm, is_ready_or_failed)
    statuses = [f["data"] for f in frames if kind_of(f) == "repository_status"]
    assert [s["status"] for s in statuses if "progress" not in s and "output" not in s] == [
        "cloning",
        "setting_up",
        "ready",
    ]
    output = "".join(s.get("output", "") for s in statuses)
    assert "installing" in output
    ready = statuses[-1]
    assert ready["setup"]["ok"] is False and ready["setup"]["exit_code"] == 3
    assert "broken" in ready["setup"]["tail"]
    folder = await db_sync_to_async(workspace_of)(session_id)
    # Run as the sandbox's user, not the server's.
    assert (folder / ".installed").read_text().strip() == str(folder.stat().st_uid)
    assert folder.stat().st_uid != os.getuid()
    frames = await ask(comm, "p1", "exec cat .installed")
    assert frames[-1]["data"]["stop_reason"] == "end_turn"
    await comm.disconnect()


async def test_shipping_waits_for_the_turn(hosts, owner):
    url = hosts.git.create(REPO, public=True)
    client = await signed_in(owner)
    created = await post(client, "/api/sessions/", {"repository": url})
    session_id = created.json()["id"]
    comm, _ = await open_socket(session_id, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await frames_until(comm, is_ready_or_failed)
    # A turn that waits for a permission answer: running until it is cancelled.
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "permission"})
    await frames_until(comm, lambda f: kind_of(f) == "permission_request")
    refused = await post(client, f"/api/sessions/{session_id}/repository/commit/")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "turn_running")
    await comm.send_json_to({"type": "cancel"})
    await frames_until(comm, is_turn_end)
    await comm.disconnect()
    await asyncio.sleep(0)


async def test_a_moved_base_is_merged_with_its_conflicts_listed_a_moved_branch_never_forced(
    hosts, owner
):
    url = hosts.git.create(REPO, {"app.py": b"one\n", "other.py": b"a\n"}, writers=(TOKEN,))
    await db_sync_to_async(git_tokens.store_token)(owner, hosts.git.url.split("//")[1], TOKEN)
    client = await signed_in(owner)
    session_id = (await post(client, "/api/sessions/", {"repository": url})).json()["id"]
    comm, _ = await open_socket(session_id, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await frames_until(comm, is_ready_or_failed)
    folder = await db_sync_to_async(workspace_of)(session_id)
    uid = folder.stat().st_uid
    (folder / "app.py").write_bytes(b"mine\n")
    os.chown(folder / "app.py", uid, uid)
    assert (await post(client, f"/api/sessions/{session_id}/repository/commit/")).status_code == 201
    branch = (await client.get(f"/api/sessions/{session_id}/repository/")).json()["branch"]
    assert (await post(client, f"/api/sessions/{session_id}/repository/push/")).status_code == 200

    # Someone else pushes to the session's branch, and to the base.
    theirs = hosts.git.commit(REPO, branch, {"other.py": b"b\n"}, "Someone else's work")
    hosts.git.commit(REPO, "main", {"app.py": b"theirs\n"}, "Meanwhile on main")
    (folder / "more.py").write_bytes(b"more\n")
    os.chown(folder / "more.py", uid, uid)
    assert (await post(client, f"/api/sessions/{session_id}/repository/commit/")).status_code == 201
    rejected = await post(client, f"/api/sessions/{session_id}/repository/push/")
    assert (rejected.status_code, rejected.json()["error"]["code"]) == (409, "push_rejected")
    assert hosts.git.branches(REPO)[branch] == theirs  # never forced

    updated = await post(client, f"/api/sessions/{session_id}/repository/update/")
    assert updated.status_code == 200, updated.content
    assert updated.json()["conflicts"] == ["app.py"]
    assert b"<<<<<<<" in (folder / "app.py").read_bytes()
    frames = await frames_until(comm, lambda f: kind_of(f) == "repository_updated", 10)
    assert frames[-1]["data"]["conflicts"] == ["app.py"]
    await comm.disconnect()


async def test_a_repository_over_the_size_limit_fails_plainly_and_leaves_the_workspace_empty(
    hosts, owner, settings
):
    settings.CRAFT_CLONE_MAX_BYTES = 1 << 20
    url = hosts.git.create(REPO, {"big.bin": random_bytes(3 << 20)}, public=True)
    client = await signed_in(owner)
    session_id = (await post(client, "/api/sessions/", {"repository": url})).json()["id"]
    comm, _ = await open_socket(session_id, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "start_agent"})
    frames = await frames_until(comm, is_ready_or_failed)
    failed = frames[-1]["data"]
    assert (failed["status"], failed["code"]) == ("failed", "repository_too_large")
    assert "1 MiB" in failed["reason"] or "1.0 MiB" in failed["reason"], failed["reason"]
    state = (await client.get(f"/api/sessions/{session_id}/repository/")).json()
    assert (state["status"], state["failure"]) == ("failed", "repository_too_large")
    folder = await db_sync_to_async(workspace_of)(session_id)
    assert not folder.exists() or not any(folder.iterdir())
    await comm.disconnect()
