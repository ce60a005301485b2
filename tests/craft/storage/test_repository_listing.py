"""Which repository events change a session's line in its owner's lists of sessions: its
clone's status and its pull request do; the clone's progress and its set-up's output, which
come every second, do not (each would make every open page fetch the list again)."""

from __future__ import annotations

import pytest

from craft.storage.eventlog import _changes_list, _encode


@pytest.mark.parametrize(
    "kind, data, listed",
    [
        ("repository_status", {"status": "cloning", "url": "u", "branch": "b", "base": ""}, True),
        ("repository_status", {"status": "ready", "commit": "c", "setup": None}, True),
        (
            "repository_status",
            {"status": "failed", "code": "x", "reason": 'it said "output"'},
            True,
        ),
        ("repository_status", {"status": "cloning", "progress": {"text": "Receiving"}}, False),
        ("repository_status", {"status": "setting_up", "output": "npm ci\n"}, False),
        ("pull_request_opened", {"url": "u", "number": 1, "state": "open"}, True),
        ("pull_request_updated", {"url": "u", "number": 1, "state": "merged"}, True),
        ("repository_pushed", {"branch": "b", "head": "h"}, False),
        ("agent_message_chunk", {"content": {"type": "text", "text": '"status"'}}, False),
        ("turn_end", {"stop_reason": "end_turn"}, True),
    ],
)
def test_what_changes_the_list_of_sessions(kind, data, listed):
    assert _changes_list(_encode([(kind, data)])) is listed


@pytest.mark.django_db
def test_the_session_admin_shows_each_sessions_repository(client, staff, owner):
    from craft.models import Session, SessionRepository
    from sandboxes.models import Sandbox

    sandbox = Sandbox.objects.create(owner=owner, status=Sandbox.Status.RUNNING)
    plain = Session.objects.create(owner=owner, sandbox=sandbox, title="plain one")
    cloned = Session.objects.create(owner=owner, sandbox=sandbox, title="on a repository")
    SessionRepository.objects.create(
        session=cloned, url="https://git.example.com/team/app", host="git.example.com",
        path="team/app", base="main", branch="craft/fix-1a2b3c4d", status="ready",
        pull_request_number=7, pull_request_state="merged",
    )  # fmt: skip
    client.force_login(staff)
    page = client.get("/admin/craft/session/").content.decode()
    said = "git.example.com/team/app on craft/fix-1a2b3c4d (ready; pull request #7 merged)"
    assert said in page
    detail = client.get(f"/admin/craft/session/{plain.pk}/change/").content.decode()
    assert "plain one" in detail and "git.example.com" not in detail
