"""Session titles go through the same cleaning as prompts: a lone surrogate or a NUL in a title
is cleaned (or a blank title refused with 400), never a server error, and nothing else of the
title is lost. Whoever writes it: the API, the page's rename form, the agent.

`test_titles_are_cleaned_on_sqlite` runs this module again on SQLite.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from craft.models import Event, Session
from craft.storage.titles import set_session_title
from craft.turns import controls
from tests.ready import open_ready_session
from tests.sqlite_rerun import run_again_on_sqlite, runs_the_module_on_sqlite

pytestmark = pytest.mark.django_db(transaction=True)

HTMX = {"HTTP_HX_REQUEST": "true"}

# (title sent, title stored)
POISON = [
    ("\ud800", "\ufffd"),
    ("a\x00b", "ab"),
    ("x\udfff y\x00\x00z \ud83d\ude00", "x\ufffd yz \U0001f600"),  # a pair is one character
]
BLANK = ["\x00", " \x00\t\x00 ", "\n"]


@pytest.fixture
def api(owner):
    """A client that enforces CSRF like a browser session would."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    client.get("/accounts/login/")  # sets the csrftoken cookie
    client.csrf = client.cookies["csrftoken"].value
    return client


def send(api, method, url, body):
    # ensure_ascii: the lone surrogates travel as JSON escapes, as a JavaScript client sends them.
    return getattr(api, method)(
        url, data=json.dumps(body), content_type="application/json", HTTP_X_CSRFTOKEN=api.csrf
    )


@pytest.mark.parametrize(("sent", "stored"), POISON)
def test_a_new_session_s_title_is_cleaned(api, owner, sent, stored):
    response = send(api, "post", "/api/sessions/", {"title": sent})
    assert response.status_code == 201, response.content
    assert response.json()["title"] == stored
    assert Session.objects.get(owner=owner).title == stored


@pytest.mark.parametrize("sent", BLANK)
def test_a_new_session_with_a_blank_title_gets_the_default_one(api, owner, sent):
    response = send(api, "post", "/api/sessions/", {"title": sent})
    assert response.status_code == 201, response.content
    assert response.json()["title"] == "New session"


@pytest.mark.parametrize(("sent", "stored"), POISON)
def test_a_rename_through_the_api_is_cleaned_and_recorded(api, owner, sent, stored):
    session = open_ready_session(owner, "before")
    response = send(api, "patch", f"/api/sessions/{session.pk}/", {"title": sent})
    assert response.status_code == 200, response.content
    assert response.json()["title"] == stored
    event = Event.objects.get(session=session, kind="session_title")
    assert event.data == {"title": stored, "source": "user"}


@pytest.mark.parametrize("sent", BLANK)
def test_a_rename_to_a_blank_title_is_refused_with_400(api, owner, sent):
    session = open_ready_session(owner, "kept")
    response = send(api, "patch", f"/api/sessions/{session.pk}/", {"title": sent})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    session.refresh_from_db()
    assert session.title == "kept"
    assert not Event.objects.filter(session=session).exists()


def test_the_page_s_rename_form_cleans_a_nul_and_refuses_a_blank_title(client, owner):
    session = open_ready_session(owner, "before")
    client.force_login(owner)
    url = reverse("rename_session", args=[session.pk])
    response = client.post(url, {"title": "a\x00b"}, **HTMX)
    assert response.status_code == 200
    session.refresh_from_db()
    assert session.title == "ab"
    refused = client.post(url, {"title": "\x00 \x00"}, **HTMX)
    assert refused.status_code == 422
    assert "cannot be blank" in refused.content.decode()
    # Bytes that are no UTF-8 (an encoded surrogate) arrive as replacement characters.
    form = "title=c%ED%A0%80d"
    response = client.post(url, form, content_type="application/x-www-form-urlencoded", **HTMX)
    assert response.status_code == 200
    session.refresh_from_db()
    assert session.title.startswith("c\ufffd") and session.title.endswith("d")


def test_the_new_session_form_cleans_its_title(client, owner):
    client.force_login(owner)
    response = client.post(reverse("new_session"), {"title": "x\x00y"})
    assert response.status_code == 302
    assert Session.objects.get(owner=owner).title == "xy"


def test_an_agent_s_title_is_cleaned_before_it_is_stored(owner):
    session = open_ready_session(owner)
    events = [
        ("session_info_update", {"sessionUpdate": "session_info_update", "title": "\x00 \ud800"}),
        ("session_info_update", {"sessionUpdate": "session_info_update", "title": "\x00\n"}),
    ]
    titles = controls.agent_titles(events)
    assert titles == ["\ufffd"]  # the blank one is no title
    assert set_session_title(session.pk, "\x00\n", "agent") is None  # blank: nothing stored
    assert set_session_title(session.pk, titles[0], "agent") == "\ufffd"
    session.refresh_from_db()
    assert session.title == "\ufffd"
    assert Event.objects.filter(session=session, kind="session_title").get().data == {
        "title": "\ufffd",
        "source": "agent",
    }


@runs_the_module_on_sqlite
def test_titles_are_cleaned_on_sqlite(tmp_path):
    output = run_again_on_sqlite(__file__, tmp_path, deselect="sqlite", timeout=300)
    assert " passed" in output
