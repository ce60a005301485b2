"""The minimal pages: sign in, list sessions, open one, talk to the agent."""

from __future__ import annotations

import pytest
from django.urls import reverse

from craft.models import Session
from sandboxes import services

from ..conftest import PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)


def test_pages_need_a_signed_in_user(client):
    response = client.get(reverse("home"))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_a_user_signs_in_opens_a_session_and_gets_two_replies_from_one_agent(client, owner):
    response = client.post(reverse("login"), {"username": "olivia", "password": PASSWORD})
    assert response.status_code == 302
    response = client.post(reverse("new_session"))
    session = Session.objects.get(owner=owner)
    assert response.url == reverse("session", args=[session.pk])

    client.post(response.url, {"text": "first question"})
    pid = services.connect_agent(session.sandbox, session.pk).process.pid
    client.post(response.url, {"text": "pid"})
    page = client.get(response.url).content.decode()
    assert "Echo: first question" in page
    assert f"pid {pid}" in page
    assert services.live_connection_count(session.sandbox.pk) == 1


def test_a_stranger_cannot_see_someone_elses_session(client, owner, stranger):
    from craft.services import open_session

    session = open_session(owner)
    client.force_login(stranger)
    assert client.get(reverse("session", args=[session.pk])).status_code == 404
    assert client.post(reverse("session", args=[session.pk]), {"text": "hi"}).status_code == 404


def test_an_empty_prompt_is_refused_with_a_message(client, owner):
    from craft.services import open_session

    session = open_session(owner)
    client.force_login(owner)
    response = client.post(reverse("session", args=[session.pk]), {"text": "   "}, follow=True)
    assert "a prompt cannot be empty" in response.content.decode()
    assert session.events.count() == 0
