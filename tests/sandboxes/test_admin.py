"""The sandbox inventory in the Django admin."""

from __future__ import annotations

import ast
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from craft.models import Session
from craft.storage.eventlog import append_events
from sandboxes import services
from sandboxes.agent.connections import agent_connections
from sandboxes.models import ReaperAction, Sandbox, WarmSandbox
from tests.ready import open_ready_session

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:sandboxes_sandbox_changelist")


@pytest.fixture
def busy_sandbox(owner):
    """The owner's sandbox with two sessions, one of them with a live agent."""
    first = open_ready_session(owner, "first")
    open_ready_session(owner, "second")
    services.connect_agent(first.sandbox, first.pk)
    return first.sandbox


def test_the_changelist_shows_sessions_and_live_agents(client, staff, busy_sandbox):
    client.force_login(staff)
    response = client.get(CHANGELIST)
    assert response.status_code == 200
    row = response.context["cl"].result_list.get(pk=busy_sandbox.pk)
    assert row._session_count == 2
    html = response.content.decode()
    assert "olivia" in html
    assert busy_sandbox.reference in html
    assert '<td class="field-session_count">2</td>' in html
    assert '<td class="field-live_connections">1</td>' in html


def test_the_changelist_filters_by_status_and_searches_by_owner(client, staff, busy_sandbox):
    client.force_login(staff)
    assert client.get(CHANGELIST, {"status__exact": "running"}).context["cl"].result_count == 1
    assert client.get(CHANGELIST, {"status__exact": "failed"}).context["cl"].result_count == 0
    assert client.get(CHANGELIST, {"q": "olivia"}).context["cl"].result_count == 1
    assert client.get(CHANGELIST, {"q": "nobody"}).context["cl"].result_count == 0


def test_the_changelist_is_refused_to_non_staff(client, owner, busy_sandbox):
    client.force_login(owner)
    response = client.get(CHANGELIST)
    assert response.status_code == 302
    assert "/admin/login/" in response.url


def test_the_terminate_action_asks_first_then_terminates_and_stops_agents(
    client, staff, busy_sandbox
):
    client.force_login(staff)
    selected = {"action": "terminate", "_selected_action": [str(busy_sandbox.pk)]}
    response = client.post(CHANGELIST, selected)
    assert response.status_code == 200  # a page that asks, nothing done yet
    page = response.content.decode()
    assert "Delete 1 sandbox?" in page
    assert "2 sessions" in page
    assert "1 live agent in this server process" in page
    assert 'name="post" value="yes"' in page
    assert f'value="{busy_sandbox.pk}"' in page
    busy_sandbox.refresh_from_db()
    assert busy_sandbox.status == Sandbox.Status.RUNNING
    assert services.live_connection_count(busy_sandbox.pk) == 1

    response = client.post(CHANGELIST, {**selected, "post": "yes"})
    assert response.status_code == 302
    busy_sandbox.refresh_from_db()
    assert busy_sandbox.status == Sandbox.Status.TERMINATED
    assert busy_sandbox.status_detail == Sandbox.STOPPED_BY_STAFF  # what its user is told
    assert services.live_connection_count(busy_sandbox.pk) == 0
    messages = [str(m) for m in response.wsgi_request._messages]
    assert messages == ["Deleted 1 sandbox."]


def test_the_admin_names_sandboxes_in_the_plural_correctly(client, staff):
    client.force_login(staff)
    index = client.get(reverse("admin:index")).content.decode()
    assert "Sandboxes" in index
    assert "Sandboxs" not in index


def test_the_stop_idle_action_stops_agents_but_keeps_the_sandbox(client, staff, busy_sandbox):
    client.force_login(staff)
    client.post(
        CHANGELIST,
        {"action": "stop_idle_connections", "_selected_action": [str(busy_sandbox.pk)]},
    )
    busy_sandbox.refresh_from_db()
    assert busy_sandbox.status == Sandbox.Status.RUNNING
    assert services.live_connection_count(busy_sandbox.pk) == 0


def test_a_sandbox_page_lists_its_sessions(client, staff, busy_sandbox):
    client.force_login(staff)
    response = client.get(reverse("admin:sandboxes_sandbox_change", args=[busy_sandbox.pk]))
    assert response.status_code == 200
    assert "first" in response.content.decode()
    assert "second" in response.content.decode()


def test_a_session_page_links_its_transcript_instead_of_drawing_every_event(client, staff, owner):
    session = open_ready_session(owner)
    append_events(
        session.pk,
        [("agent_message_chunk", {"content": {"type": "text", "text": f"word{i}"}})
         for i in range(1, 301)],
    )  # fmt: skip
    client.force_login(staff)
    response = client.get(reverse("admin:craft_session_change", args=[session.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "word300" not in page  # no event drawn inline
    transcript = reverse("admin:craft_session_transcript", args=[session.pk])
    assert f'href="{transcript}"' in page
    assert "300 events" in page
    # Timestamps are the record's: shown, never a field to edit.
    assert 'name="updated_at' not in page
    assert 'name="created_at' not in page

    body = client.get(transcript).json()
    assert [e["seq"] for e in body["events"]] == list(range(1, 301))
    assert body["events"][-1]["data"]["content"]["text"] == "word300"
    assert body["has_more"] is False
    page2 = client.get(transcript, {"after": 100, "limit": 50}).json()
    assert [e["seq"] for e in page2["events"]] == list(range(101, 151))
    assert page2["has_more"] is True


def test_a_session_s_transcript_is_for_staff_only(client, owner):
    session = open_ready_session(owner)
    client.force_login(owner)  # its owner, but not staff
    response = client.get(reverse("admin:craft_session_transcript", args=[session.pk]))
    assert response.status_code == 302
    assert "/admin/login/" in response.url


def test_a_sandbox_page_shows_the_backends_health_check(client, staff, busy_sandbox):
    client.force_login(staff)
    page = client.get(reverse("admin:sandboxes_sandbox_change", args=[busy_sandbox.pk]))
    assert "ok: folder present" in page.content.decode()


# --- deleting goes through terminate -------------------------------------------------------


def test_deleting_a_sandbox_in_the_admin_terminates_it_first(client, staff, busy_sandbox):
    agent = agent_connections.keys()
    assert agent, "the fixture's agent is live"
    folder = Path(busy_sandbox.reference)
    client.force_login(staff)
    url = reverse("admin:sandboxes_sandbox_delete", args=[busy_sandbox.pk])
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert not Sandbox.objects.filter(pk=busy_sandbox.pk).exists()
    assert agent_connections.count() == 0, "its agents were stopped"
    assert not folder.exists(), "its folder was freed"


def test_bulk_deleting_sandboxes_in_the_admin_terminates_each(client, staff, owner, stranger):
    folders = [Path(open_ready_session(u).sandbox.reference) for u in (owner, stranger)]
    client.force_login(staff)
    client.post(
        CHANGELIST,
        {
            "action": "delete_selected",
            "post": "yes",
            "_selected_action": [str(s.pk) for s in Sandbox.objects.all()],
        },
    )
    assert Sandbox.objects.count() == 0
    assert [f.exists() for f in folders] == [False, False]


def test_deleting_a_user_terminates_their_sandbox(owner, busy_sandbox):
    folder = Path(busy_sandbox.reference)
    owner.delete()
    assert agent_connections.count() == 0
    assert not folder.exists()


# --- idle time, running turns, reaper actions ----------------------------------------------


def test_the_changelist_shows_idle_time_running_turns_and_the_latest_reaper_action(
    client, staff, busy_sandbox
):
    first, second = Session.objects.filter(sandbox=busy_sandbox).order_by("created_at")
    append_events(first.pk, [("user_message", {"id": "p1", "text": "go"})], client_id="p1")
    an_hour_ago = timezone.now() - timedelta(hours=1)
    Session.objects.filter(sandbox=busy_sandbox).update(updated_at=an_hour_ago)
    Sandbox.objects.filter(pk=busy_sandbox.pk).update(last_activity_at=an_hour_ago)
    services.record_action(
        ReaperAction.Kind.STOPPED_IDLE_AGENT,
        "no prompt for 15 min",
        sandbox_id=busy_sandbox.pk,
        target=f"session {second.pk}",
    )
    client.force_login(staff)
    html = client.get(CHANGELIST).content.decode()
    assert '<td class="field-running_turns">1</td>' in html
    assert '<td class="field-idle">1\xa0hour</td>' in html
    assert "stopped an idle agent, 0\xa0minutes ago" in html

    page = client.get(reverse("admin:sandboxes_sandbox_change", args=[busy_sandbox.pk]))
    assert f"stopped an idle agent (session {second.pk}): no prompt for 15 min" in (
        page.content.decode()
    )


def test_the_reaper_actions_are_listed_with_orphans(client, staff):
    services.record_action(
        ReaperAction.Kind.REMOVED_ORPHAN, "no sandbox owns it", target="pod craft-sandbox-x"
    )
    client.force_login(staff)
    response = client.get(reverse("admin:sandboxes_reaperaction_changelist"))
    assert response.status_code == 200
    assert "pod craft-sandbox-x" in response.content.decode()


def test_the_sandboxes_app_never_imports_the_craft_app():
    """The border of STYLE.md: craft uses sandboxes, never the other way round."""
    sources = Path(settings.BASE_DIR, "sandboxes").rglob("*.py")
    offenders = []
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            offenders += [f"{source.name}: {n}" for n in names if n.split(".")[0] == "craft"]
    assert offenders == []


def test_the_session_list_shows_which_worker_holds_each_live_session(client, staff, owner):
    from craft.models import Lease

    session = open_ready_session(owner, "leased")
    Lease.objects.create(
        session=session, owner="host/123/456", token=7,
        expires_at=timezone.now() + timedelta(seconds=30),
    )  # fmt: skip
    client.force_login(staff)
    page = client.get("/admin/craft/session/").content.decode()
    assert "host/123/456 (held, token 7)" in page


def test_staff_see_the_pool_of_warm_sandboxes_and_cannot_change_it(client, staff):
    warm = WarmSandbox.objects.create(backend="kubernetes", slot=0, status="ready")
    client.force_login(staff)
    page = client.get("/admin/sandboxes/warmsandbox/")
    assert page.status_code == 200
    assert str(warm.pk) in page.content.decode()
    assert client.get(f"/admin/sandboxes/warmsandbox/{warm.pk}/delete/").status_code == 403


def test_sleep_stops_agents_keeps_files_spares_working_sandboxes_and_wake_brings_it_back(
    client, staff, busy_sandbox, stranger
):
    working = open_ready_session(stranger, "working")
    append_events(working.pk, [("user_message", {"id": "p1", "text": "hi"})], client_id="p1")
    notes = Path(busy_sandbox.reference) / "home" / "notes.txt"
    notes.write_text("kept")
    client.force_login(staff)
    chosen = [str(busy_sandbox.pk), str(working.sandbox_id)]

    response = client.post(CHANGELIST, {"action": "sleep", "_selected_action": chosen}, follow=True)

    said = [str(m) for m in response.context["messages"]]
    assert said == [
        "Not put to sleep, because an agent is working in it: sam.",
        "Put 1 sandbox to sleep.",
    ]
    asleep = Sandbox.objects.get(pk=busy_sandbox.pk)
    assert (asleep.status, asleep.status_detail) == ("sleeping", Sandbox.ASLEEP_BY_STAFF)
    assert services.live_connection_count(busy_sandbox.pk) == 0
    assert Sandbox.objects.get(pk=working.sandbox_id).status == Sandbox.Status.RUNNING
    assert notes.read_text() == "kept"

    response = client.post(CHANGELIST, {"action": "wake", "_selected_action": chosen}, follow=True)

    assert [str(m) for m in response.context["messages"]] == ["Waking 1 sandbox."]
    deadline = timezone.now() + timedelta(seconds=10)
    while Sandbox.objects.get(pk=busy_sandbox.pk).status != Sandbox.Status.RUNNING:
        assert timezone.now() < deadline, Sandbox.objects.get(pk=busy_sandbox.pk).status
        time.sleep(0.05)
    assert notes.read_text() == "kept"
