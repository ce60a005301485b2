"""The chat page and its htmx pieces, rendered by the server."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from craft.eventlog import append_events
from craft.models import Session
from craft.services import open_session

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


TURN = [
    ("user_message", {"id": "p1", "text": "make a plan"}),
    ("agent_thought_chunk", {"content": {"type": "text", "text": "hmm"}}),
    ("plan", {"entries": [{"content": "one", "status": "pending", "priority": "high"}]}),
    ("agent_message_chunk", {"content": {"type": "text", "text": "<script>alert(1)</script>"}}),
    ("agent_message_chunk", {"content": {"type": "text", "text": " and more"}}),
    ("tool_call", {"toolCallId": "t1", "title": "Write a.txt", "kind": "edit",
                   "status": "pending"}),
    ("permission_request", {"request": "r1", "toolCall": {"title": "Write a.txt"},
                            "options": [{"optionId": "allow", "name": "Allow",
                                         "kind": "allow_once"}]}),
    ("permission_answer", {"request": "r1", "option": "allow"}),
    ("tool_call_update", {"toolCallId": "t1", "status": "completed", "content": [
        {"type": "diff", "path": "/w/a.txt", "oldText": None, "newText": "hello"}]}),
    ("plan", {"entries": [{"content": "one", "status": "completed", "priority": "high"}]}),
    ("craft_demo_unknown_kind", {"detail": "x"}),
    ("turn_end", {"stop_reason": "end_turn"}),
]  # fmt: skip


def test_the_transcript_is_rendered_on_the_server_with_every_seq_once(client, owner):
    session = open_session(owner)
    append_events(session.pk, TURN)
    client.force_login(owner)
    page = client.get(reverse("session", args=[session.pk])).content.decode()
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', page)]
    assert sorted(seqs) == list(range(1, len(TURN) + 1))
    assert 'data-last-seq="12"' in page
    # Model output is escaped, never markup.
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # The tool card shows its latest status and the diff; the plan shows its latest list.
    assert 'data-tool-call-id="t1" data-status="completed"' in page
    assert '<pre class="add">hello</pre>' in page
    assert page.count('class="plan"') == 1
    assert 'data-status="completed"><span class="check"></span>one' in page
    assert 'data-answer="allow"' in page


def test_renaming_over_htmx_returns_the_updated_item(client, owner):
    session = open_session(owner, "old")
    client.force_login(owner)
    url = reverse("rename_session", args=[session.pk])
    response = client.post(url, {"title": "  new   name "}, **HTMX)
    assert response.status_code == 200
    assert f'id="session-{session.pk}"' in response.content.decode()
    assert "new name" in response.content.decode()
    session.refresh_from_db()
    assert session.title == "new name"
    assert client.post(url, {"title": "   "}, **HTMX).status_code == 422
    session.refresh_from_db()
    assert session.title == "new name"


def test_deleting_over_htmx_removes_the_item_or_leaves_the_page(client, owner):
    first, second = open_session(owner, "first"), open_session(owner, "second")
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
    session = open_session(owner)
    client.force_login(stranger)
    assert client.get(reverse("session", args=[session.pk])).status_code == 404
    assert (
        client.post(reverse("rename_session", args=[session.pk]), {"title": "x"}).status_code == 404
    )
    assert client.post(reverse("delete_session", args=[session.pk])).status_code == 404
    assert Session.objects.filter(pk=session.pk).exists()
