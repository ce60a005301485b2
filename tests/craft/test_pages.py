"""The chat page shell and its htmx pieces, rendered by the server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from craft.models import Session
from craft.storage.eventlog import append_events
from sandboxes.models import Sandbox
from sandboxes.services import terminate_sandbox
from tests.ready import open_ready_session, settled_sandbox

from ..conftest import PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)

HTMX = {"HTTP_HX_REQUEST": "true"}


def test_pages_need_a_signed_in_user(client):
    response = client.get(reverse("home"))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_a_user_signs_in_and_starts_a_session(client, owner):
    response = client.post(reverse("login"), {"username": "olivia", "password": PASSWORD})
    assert response.status_code == 302
    assert "New session" in client.get(reverse("home")).content.decode()
    response = client.post(reverse("new_session"))
    session = Session.objects.get(owner=owner)
    assert response.url == reverse("session", args=[session.pk])
    page = client.get(response.url).content.decode()
    assert f'data-session="{session.pk}"' in page
    assert 'data-last-seq="0"' in page


def test_new_session_over_htmx_redirects_the_client(client, owner):
    client.force_login(owner)
    response = client.post(reverse("new_session"), **HTMX)
    session = Session.objects.get(owner=owner)
    assert response["HX-Redirect"] == reverse("session", args=[session.pk])


def test_the_session_page_is_a_shell_the_browser_fills_from_the_event_log(client, owner):
    session = open_ready_session(owner)
    append_events(
        session.pk,
        [
            ("user_message", {"id": "p1", "text": "make a plan"}),
            ("agent_message_chunk", {"content": {"type": "text", "text": "secret reply"}}),
        ],
    )
    client.force_login(owner)
    page = client.get(reverse("session", args=[session.pk])).content.decode()
    # No transcript from the server: the page script renders every event (one renderer).
    assert "secret reply" not in page
    assert "data-seq" not in page
    assert 'data-last-seq="2"' in page
    assert f'data-events-url="/api/sessions/{session.pk}/events/"' in page
    assert f'data-event-url="/api/sessions/{session.pk}/events/0/"' in page
    assert 'data-staff="false"' in page
    assert 'data-workspace="/workspace"' in page  # never the host's (test_host_paths.py)
    assert 'aria-current="page"' in page


def test_the_page_preloads_every_module_of_its_script(client, owner):
    session = open_ready_session(owner)
    client.force_login(owner)
    page = client.get(reverse("session", args=[session.pk])).content.decode()
    folder = Path(settings.BASE_DIR) / "static" / "craft" / "session"
    modules = {f"/static/craft/session/{module.name}" for module in folder.glob("*.mjs")}
    assert set(re.findall(r'<link rel="modulepreload" href="([^"]+)"', page)) == modules
    assert '<script type="module" src="/static/craft/session/main.mjs"></script>' in page


def test_the_sandbox_line_never_polls_even_while_the_sandbox_starts(client, owner):
    # The session socket's `sandbox` frames have it fetched again when the sandbox changes.
    session = open_ready_session(owner)
    client.force_login(owner)
    line = client.get(reverse("sandbox_status")).content.decode()
    assert 'hx-trigger="craft:refresh"' in line
    assert "Ready" in line
    Sandbox.objects.filter(pk=session.sandbox_id).update(
        status=Sandbox.Status.PROVISIONING, status_detail="pod Pending"
    )
    line = client.get(reverse("sandbox_status")).content.decode()
    assert 'hx-trigger="craft:refresh"' in line
    assert "load" not in line and "every" not in line
    assert "pod Pending" in line


def test_a_stopped_sandbox_is_shown_with_a_way_forward(client, owner, staff):
    session = open_ready_session(owner)
    terminate_sandbox(session.sandbox)
    Sandbox.objects.filter(pk=session.sandbox_id).update(error="pod vanished at /var/x")
    client.force_login(owner)
    line = client.get(reverse("sandbox_status")).content.decode()
    assert "Stopped" in line
    assert "Start again" in line
    assert "pod vanished" not in line  # technical detail is for staff
    response = client.post(reverse("new_session"))
    new = Session.objects.exclude(pk=session.pk).get()
    assert response.url == reverse("session", args=[new.pk])
    assert new.sandbox_id != session.sandbox_id
    assert settled_sandbox(new.sandbox_id).status == Sandbox.Status.RUNNING


def test_the_session_list_refreshes_with_the_current_session_marked(client, owner):
    first = open_ready_session(owner, "first")
    open_ready_session(owner, "second")
    client.force_login(owner)
    listing = client.get(reverse("session_list"), {"current": str(first.pk)}).content.decode()
    assert listing.index("second") < listing.index("first")  # most recent first
    assert listing.count('aria-current="page"') == 1
    assert f'href="/sessions/{first.pk}/" class="session-link" title="first" aria-current' in (
        listing
    )
    assert client.get(reverse("session_list"), {"current": "nope"}).status_code == 200


def test_one_item_of_the_list_is_its_owner_s_alone(client, owner, stranger):
    first = open_ready_session(owner, "first")
    second = open_ready_session(owner, "second")
    client.force_login(owner)
    url = reverse("session_list_item", args=[first.pk])
    item = client.get(url, {"current": str(first.pk)}, **HTMX).content.decode()
    assert item.count('class="session-item') == 1
    assert f'id="session-{first.pk}"' in item
    assert 'aria-current="page"' in item
    first.refresh_from_db()
    # Its place in the list: the microseconds of its latest change, as the list orders them.
    changed = first.updated_at
    assert f'data-updated="{int(changed.timestamp())}{changed.microsecond:06d}"' in item
    listing = client.get(reverse("session_list"), {"current": str(second.pk)}).content.decode()
    zero = "00000000-0000-0000-0000-000000000000"
    assert f'data-item-url="/sessions/list/{zero}/?current={second.pk}"' in listing
    other = client.get(url, {"current": str(second.pk)}).content.decode()
    assert "aria-current" not in other
    # Someone else's session, and one that is gone, are both just not found.
    client.force_login(stranger)
    assert client.get(url).status_code == 404
    client.force_login(owner)
    first.delete()
    assert client.get(url).status_code == 404


def test_renaming_over_htmx_returns_the_updated_item(client, owner):
    session = open_ready_session(owner, "old")
    client.force_login(owner)
    url = reverse("rename_session", args=[session.pk])
    response = client.post(url, {"title": "  new   name "}, **HTMX)
    assert response.status_code == 200
    assert f'id="session-{session.pk}"' in response.content.decode()
    assert "new name" in response.content.decode()
    session.refresh_from_db()
    assert session.title == "new name"
    refused = client.post(url, {"title": "   "}, **HTMX)
    assert refused.status_code == 422
    assert 'role="alert"' in refused.content.decode()
    assert "cannot be blank" in refused.content.decode()
    session.refresh_from_db()
    assert session.title == "new name"


def test_deleting_over_htmx_removes_the_item_or_leaves_the_page(client, owner):
    first, second = open_ready_session(owner, "first"), open_ready_session(owner, "second")
    client.force_login(owner)
    response = client.post(
        reverse("delete_session", args=[first.pk]),
        HTTP_HX_CURRENT_URL=f"http://localhost/sessions/{second.pk}/",
        **HTMX,
    )
    assert response.status_code == 200
    assert response.content == b""
    response = client.post(
        reverse("delete_session", args=[second.pk]),
        HTTP_HX_CURRENT_URL=f"http://localhost/sessions/{second.pk}/",
        **HTMX,
    )
    assert response["HX-Redirect"] == reverse("home")
    assert not Session.objects.exists()


def test_a_stranger_cannot_see_or_change_someone_elses_session(client, owner, stranger):
    session = open_ready_session(owner)
    client.force_login(stranger)
    assert client.get(reverse("session", args=[session.pk])).status_code == 404
    assert (
        client.post(reverse("rename_session", args=[session.pk]), {"title": "x"}).status_code == 404
    )
    assert client.post(reverse("delete_session", args=[session.pk])).status_code == 404
    assert Session.objects.filter(pk=session.pk).exists()


def test_a_sandbox_that_cannot_start_is_told_in_words(client, owner, staff, settings, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the sandbox root should be")
    settings.CRAFT_SANDBOX_ROOT = blocker
    client.force_login(owner)
    response = client.post(reverse("new_session"))
    session = Session.objects.get(owner=owner)  # at once: the sandbox starts in the background
    assert response.url == reverse("session", args=[session.pk])
    assert settled_sandbox(session.sandbox_id).status == Sandbox.Status.FAILED
    page = client.get(response.url).content.decode()
    assert 'data-sandbox-status="failed"' in page  # the page says so, and offers "Start again"
    assert "cannot create sandbox folder" not in page  # the backend's words are for staff
    line = client.get(reverse("sandbox_status")).content.decode()
    assert "Could not start" in line
    assert "Start again" in line
    assert "cannot create sandbox folder" not in line
    client.force_login(staff)
    client.post(reverse("new_session"))
    settled_sandbox(Session.objects.get(owner=staff).sandbox_id)
    line = client.get(reverse("sandbox_status")).content.decode()
    assert "cannot create sandbox folder" in line  # staff see why


def test_new_session_opens_the_untouched_one_rather_than_piling_up_empty_ones(client, owner):
    client.force_login(owner)
    first = client.post(reverse("new_session"), **HTMX)["HX-Redirect"]
    again = client.post(reverse("new_session"), **HTMX)["HX-Redirect"]
    assert again == first
    assert Session.objects.owned_by(owner).count() == 1

    # Once something happened in it (a message), "New session" makes a new one.
    session = Session.objects.get()
    append_events(session.pk, [("user_message", {"id": "p1", "text": "hello"})])
    second = client.post(reverse("new_session"), **HTMX)["HX-Redirect"]
    assert second != first
    assert Session.objects.owned_by(owner).count() == 2
    # A renamed one is not untouched either, and the API makes a session every time.
    Session.objects.exclude(pk=session.pk).update(title="Plans")
    assert client.post(reverse("new_session"), **HTMX)["HX-Redirect"] not in (first, second)
    assert client.post("/api/sessions/", "{}", content_type="application/json").status_code == 201
    assert Session.objects.owned_by(owner).count() == 4
