"""The HTTP JSON API with the session cookie and CSRF, as a frontend would use it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from django.test import Client

from craft.models import Event, Session
from craft.storage.eventlog import append_events
from tests.ready import open_ready_session, settled_sandbox

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(owner):
    """A client that enforces CSRF like a browser session would."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    client.get("/accounts/login/")  # sets the csrftoken cookie
    client.csrf = client.cookies["csrftoken"].value
    return client


def send(api, method, url, body=None):
    return getattr(api, method)(
        url,
        data=json.dumps(body) if body is not None else "",
        content_type="application/json",
        HTTP_X_CSRFTOKEN=api.csrf,
    )


def test_anonymous_callers_get_401_json(client):
    response = client.get("/api/sessions/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


def test_unsafe_methods_need_the_csrf_token(api):
    assert api.post("/api/sessions/", "{}", content_type="application/json").status_code == 403
    assert not Session.objects.exists()


def test_a_session_is_created_listed_renamed_and_deleted(api, owner):
    created = send(api, "post", "/api/sessions/", {"title": "From the API"})
    assert created.status_code == 201
    session_id = created.json()["id"]
    assert created.json()["title"] == "From the API"

    listing = api.get("/api/sessions/").json()["sessions"]
    assert [s["id"] for s in listing] == [session_id]

    renamed = send(api, "patch", f"/api/sessions/{session_id}/", {"title": "Renamed"})
    assert renamed.json()["title"] == "Renamed"
    assert renamed.json()["sandbox"]["status"] in ("provisioning", "running")
    assert renamed.json()["last_seq"] == 1
    events = api.get(f"/api/sessions/{session_id}/events/").json()["events"]
    assert [(e["kind"], e["data"]) for e in events] == [
        ("session_title", {"title": "Renamed", "source": "user"})
    ]
    again = send(api, "patch", f"/api/sessions/{session_id}/", {"title": "Renamed"})
    assert again.json()["last_seq"] == 1  # an unchanged title stores nothing
    blank = send(api, "patch", f"/api/sessions/{session_id}/", {"title": " "})
    assert blank.status_code == 400
    assert "blank" in blank.json()["error"]["message"]

    sandbox = settled_sandbox(created.json()["sandbox"])
    workspace = Path(sandbox.reference) / "sessions" / session_id
    workspace.mkdir(parents=True)  # as the session's agent would, at its first start
    assert send(api, "delete", f"/api/sessions/{session_id}/").status_code == 204
    assert not workspace.exists()
    assert api.get(f"/api/sessions/{session_id}/").status_code == 404


def test_bad_bodies_get_clear_errors(api):
    response = api.post(
        "/api/sessions/", "{nope", content_type="application/json", HTTP_X_CSRFTOKEN=api.csrf
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_json"
    assert send(api, "post", "/api/sessions/", {"title": 5}).status_code == 400
    assert not Session.objects.exists()


def test_events_are_paged_after_a_seq(api, owner):
    session = open_ready_session(owner)
    append_events(session.pk, [("agent_message_chunk", {"n": i}) for i in range(5)])
    body = api.get(f"/api/sessions/{session.pk}/events/", {"after": 2, "limit": 2}).json()
    assert [e["seq"] for e in body["events"]] == [3, 4]
    assert body["has_more"] is True
    assert body["last_seq"] == 5
    body = api.get(f"/api/sessions/{session.pk}/events/", {"after": 4}).json()
    assert [e["seq"] for e in body["events"]] == [5]
    assert body["has_more"] is False
    bad = api.get(f"/api/sessions/{session.pk}/events/", {"after": "x"})
    assert bad.status_code == 400


def test_a_page_of_events_dates_them_as_isoformat_does(api, owner):
    # The page's times are formatted by the database (not from a datetime per row): they must
    # be exactly what the event's own datetime says, with or without a fraction of a second.
    session = open_ready_session(owner)
    append_events(session.pk, [("agent_message_chunk", {"n": i}) for i in range(4)])
    moments = [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=UTC),
        datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        # Not UTC: stored and served in UTC, whatever the zone it was made in.
        datetime(2026, 6, 1, 12, 0, 0, 120000, tzinfo=timezone(timedelta(hours=-5))),
    ]
    for seq, moment in enumerate(moments, start=1):
        Event.objects.filter(session=session, seq=seq).update(created_at=moment)
    body = api.get(f"/api/sessions/{session.pk}/events/").json()
    expected = [e.created_at.isoformat() for e in Event.objects.filter(session=session)]
    assert [e["created_at"] for e in body["events"]] == expected
    assert expected[0] == "2026-01-02T03:04:05+00:00"
    assert expected[3] == "2026-06-01T17:00:00.120000+00:00"


def test_one_event_is_served_in_full(api, owner):
    session = open_ready_session(owner)
    big = "x" * 3_000_000
    events = [
        ("user_message", {"id": "a", "text": "hi"}),
        ("tool_call_update", {"toolCallId": "c", "content": big}),
    ]
    append_events(session.pk, events)
    body = api.get(f"/api/sessions/{session.pk}/events/2/").json()
    assert body["seq"] == 2
    assert body["kind"] == "tool_call_update"
    assert body["data"] == {"toolCallId": "c", "content": big}
    assert body["created_at"]
    missing = api.get(f"/api/sessions/{session.pk}/events/3/")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_someone_elses_session_is_404(api, stranger):
    theirs = open_ready_session(stranger)
    append_events(theirs.pk, [("user_message", {"id": "a", "text": "private"})])
    assert api.get(f"/api/sessions/{theirs.pk}/").status_code == 404
    assert api.get(f"/api/sessions/{theirs.pk}/events/").status_code == 404
    assert api.get(f"/api/sessions/{theirs.pk}/events/1/").status_code == 404
    assert send(api, "delete", f"/api/sessions/{theirs.pk}/").status_code == 404
    assert Session.objects.filter(pk=theirs.pk).exists()


def test_the_sandbox_is_shown_and_terminated(api, owner):
    assert api.get("/api/sandbox/").status_code == 404
    open_ready_session(owner)
    sandbox = api.get("/api/sandbox/").json()
    assert sandbox["status"] == "running"
    assert sandbox["backend"] == "local"
    terminated = send(api, "delete", "/api/sandbox/").json()
    assert terminated["status"] == "terminated"
    assert api.get("/api/sandbox/").status_code == 404
