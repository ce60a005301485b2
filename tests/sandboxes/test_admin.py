"""The sandbox inventory in the Django admin."""

from __future__ import annotations

import pytest
from django.urls import reverse

from craft import services as craft_services
from craft.eventlog import append_event
from sandboxes import services
from sandboxes.models import Sandbox

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:sandboxes_sandbox_changelist")


@pytest.fixture
def busy_sandbox(owner):
    """The owner's sandbox with two sessions, one of them with a live agent."""
    first = craft_services.open_session(owner, "first")
    craft_services.open_session(owner, "second")
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


def test_the_terminate_action_terminates_and_stops_agents(client, staff, busy_sandbox):
    client.force_login(staff)
    response = client.post(
        CHANGELIST, {"action": "terminate", "_selected_action": [str(busy_sandbox.pk)]}
    )
    assert response.status_code == 302
    busy_sandbox.refresh_from_db()
    assert busy_sandbox.status == Sandbox.Status.TERMINATED
    assert services.live_connection_count(busy_sandbox.pk) == 0


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


def test_events_are_read_only_in_the_admin(client, staff, owner):
    session = craft_services.open_session(owner)
    append_event(session.pk, "agent_message_chunk", {"content": {"type": "text", "text": "hi"}})
    client.force_login(staff)
    response = client.get(reverse("admin:craft_session_change", args=[session.pk]))
    assert response.status_code == 200
    assert "agent_message_chunk" in response.content.decode()
    assert 'name="events-0-kind"' not in response.content.decode()


def test_a_sandbox_page_shows_the_backends_health_check(client, staff, busy_sandbox):
    client.force_login(staff)
    page = client.get(reverse("admin:sandboxes_sandbox_change", args=[busy_sandbox.pk]))
    assert "ok: folder present" in page.content.decode()
