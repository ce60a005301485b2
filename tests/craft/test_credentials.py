"""Each person's own credentials: stored encrypted, never shown back, offered per agent."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from craft import credentials
from craft.models import Credential, Session
from tests.catalog import KEY, catalog

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-test-0123456789abcdef"


def launch_for(session_id) -> credentials.Launch:
    return credentials.launch_of(Session.objects.get(pk=session_id))


@pytest.fixture(autouse=True)
def agents(settings):
    settings.CRAFT_AGENTS = catalog()


def signed_in(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/accounts/login/")  # sets the csrftoken cookie
    client.csrf = client.cookies["csrftoken"].value
    return client


@pytest.fixture
def api(owner):
    return signed_in(owner)


def send(api, method, url, body=None):
    return getattr(api, method)(
        url,
        data=json.dumps(body) if body is not None else "",
        content_type="application/json",
        HTTP_X_CSRFTOKEN=api.csrf,
    )


def put_key(api, value, name=KEY):
    return send(api, "put", f"/api/credentials/{name}/", {"value": value})


def test_a_credential_is_stored_listed_with_a_hint_replaced_and_deleted(api):
    stored = put_key(api, SECRET)
    assert stored.status_code == 200
    assert stored.json()["name"] == KEY
    assert stored.json()["hint"] == "cdef"
    assert SECRET not in stored.content.decode()

    listing = api.get("/api/credentials/").json()["credentials"]
    assert [(c["name"], c["hint"]) for c in listing] == [(KEY, "cdef")]
    assert SECRET not in json.dumps(listing)

    assert put_key(api, "sk-another-value-9876").json()["hint"] == "9876"
    assert Credential.objects.count() == 1

    assert send(api, "delete", f"/api/credentials/{KEY}/").status_code == 204
    assert api.get("/api/credentials/").json() == {"credentials": []}
    assert send(api, "delete", f"/api/credentials/{KEY}/").status_code == 404


def test_a_short_value_gets_no_hint(api):
    assert put_key(api, "abc123").json()["hint"] == ""


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("line one\nline two", "it contains a line break"),
        ("x" * 100_000, "longer than 8 KiB"),
        ("   ", "'value' must be a non-empty string"),
        (42, "'value' must be a non-empty string"),
    ],
)
def test_a_bad_value_is_refused_and_nothing_is_lost(api, value, message):
    put_key(api, SECRET)
    refused = put_key(api, value)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_credential"
    assert message in refused.json()["error"]["message"]
    assert launch_for(open_keyed_session(api)).secrets == {KEY: SECRET}


def test_a_name_no_agent_asks_for_is_refused(api):
    refused = put_key(api, SECRET, name="AWS_SECRET_ACCESS_KEY")
    assert refused.status_code == 400
    assert "not a credential any agent here needs" in refused.json()["error"]["message"]
    assert KEY in refused.json()["error"]["message"]
    assert send(api, "delete", "/api/credentials/AWS_SECRET_ACCESS_KEY/").status_code == 404
    assert not Credential.objects.exists()


def test_nobody_else_can_read_or_delete_a_credential(api, stranger):
    put_key(api, SECRET)
    theirs = signed_in(stranger)
    assert theirs.get("/api/credentials/").json() == {"credentials": []}
    assert send(theirs, "delete", f"/api/credentials/{KEY}/").status_code == 404
    assert Credential.objects.filter(name=KEY).count() == 1
    agents = theirs.get("/api/agents/").json()["agents"]
    assert {a["id"]: a["missing"] for a in agents}["keyed"] == [KEY]


def test_anonymous_callers_get_401(client):
    assert client.get("/api/credentials/").status_code == 401
    assert client.get("/api/agents/").status_code == 401


def test_the_value_is_encrypted_at_rest(api, owner):
    put_key(api, SECRET)
    with connection.cursor() as cursor:
        cursor.execute("SELECT ciphertext, hint FROM craft_credential")
        [(ciphertext, hint)] = cursor.fetchall()
    assert SECRET not in ciphertext
    assert hint == "cdef"
    assert Fernet(credentials.settings.CRAFT_SECRETS_KEYS[0]).decrypt(ciphertext).decode() == SECRET


def test_a_value_written_with_the_old_key_reads_after_the_new_key_is_listed_first(
    api, owner, settings
):
    put_key(api, SECRET)
    old = settings.CRAFT_SECRETS_KEYS[0]
    settings.CRAFT_SECRETS_KEYS = [Fernet.generate_key().decode(), old]
    [stored] = credentials.credentials_of(owner)
    assert stored.readable
    assert launch_for(open_keyed_session(api)).secrets == {KEY: SECRET}
    # What is written now is written with the new key.
    put_key(api, "sk-written-with-the-new-key")
    settings.CRAFT_SECRETS_KEYS = settings.CRAFT_SECRETS_KEYS[:1]
    assert credentials.credentials_of(owner)[0].readable


def test_a_wrong_key_makes_stored_values_unreadable_and_says_which(api, owner, settings):
    put_key(api, SECRET)
    session_id = open_keyed_session(api)
    settings.CRAFT_SECRETS_KEYS = [Fernet.generate_key().decode()]
    listing = api.get("/api/credentials/").json()["credentials"]
    assert [(c["name"], c["readable"]) for c in listing] == [(KEY, False)]
    agents = {a["id"]: a for a in api.get("/api/agents/").json()["agents"]}
    assert agents["keyed"]["ready"] is False
    assert agents["keyed"]["missing"] == [KEY]
    with pytest.raises(credentials.CredentialsMissing) as refused:
        launch_for(session_id)
    assert refused.value.unreadable == [KEY]
    assert f"Provider API key ({KEY}), which can no longer be read" in str(refused.value)
    # Nothing else breaks: the other agent's sessions, and storing the key again.
    assert agents["demo"]["ready"] is True
    assert put_key(api, SECRET).status_code == 200
    assert launch_for(session_id).secrets == {KEY: SECRET}


def test_agents_say_what_the_caller_still_has_to_store(api):
    agents = api.get("/api/agents/").json()["agents"]
    assert agents == [
        {"id": "demo", "title": "Demo agent", "ready": True, "missing": []},
        {"id": "keyed", "title": "Keyed agent", "ready": False, "missing": [KEY]},
    ]
    put_key(api, SECRET)
    agents = api.get("/api/agents/").json()["agents"]
    assert agents[1] == {"id": "keyed", "title": "Keyed agent", "ready": True, "missing": []}


def open_keyed_session(api) -> str:
    created = send(api, "post", "/api/sessions/", {"agent": "keyed"})
    assert created.status_code == 201, created.content
    return created.json()["id"]


def test_a_new_session_keeps_the_agent_it_was_opened_with(api):
    session_id = open_keyed_session(api)
    assert Session.objects.get(pk=session_id).agent == "keyed"
    assert api.get(f"/api/sessions/{session_id}/").json()["agent"] == "keyed"
    default = send(api, "post", "/api/sessions/", {})
    assert default.json()["agent"] == "demo"


def test_an_unknown_agent_is_refused_clearly(api):
    refused = send(api, "post", "/api/sessions/", {"agent": "gpt-9"})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "unknown_agent"
    assert "no agent 'gpt-9'" in refused.json()["error"]["message"]
    assert "demo, keyed" in refused.json()["error"]["message"]
    assert not Session.objects.exists()


def test_the_keys_page_shows_only_the_persons_own_keys_and_never_a_value(api, stranger):
    put_key(api, SECRET)
    mine = api.get("/keys/").content.decode()
    assert "cdef" in mine and SECRET not in mine
    theirs = signed_in(stranger)
    page = theirs.get("/keys/").content.decode()
    assert "Not stored." in page and "cdef" not in page
    theirs.post(f"/keys/{KEY}/delete/", HTTP_X_CSRFTOKEN=theirs.csrf)
    assert Credential.objects.filter(name=KEY).count() == 1


def test_a_refused_value_on_the_keys_page_is_said_and_not_echoed(api):
    answer = api.post(f"/keys/{KEY}/", {"value": "y" * 100_000}, HTTP_X_CSRFTOKEN=api.csrf)
    assert answer.status_code == 422
    assert "longer than 8 KiB" in answer.content.decode()
    assert "y" * 50 not in answer.content.decode()
    assert not Credential.objects.exists()


def test_rotating_encrypts_every_value_with_the_new_key_so_the_old_can_go(api, owner, settings):
    put_key(api, SECRET)
    old = settings.CRAFT_SECRETS_KEYS[0]
    new = Fernet.generate_key().decode()
    settings.CRAFT_SECRETS_KEYS = [new, old]
    out = StringIO()
    call_command("rotate_credentials", stdout=out)
    assert "Encrypted 1 credential(s) with the newest key." in out.getvalue()
    settings.CRAFT_SECRETS_KEYS = [new]
    assert launch_for(open_keyed_session(api)).secrets == {KEY: SECRET}


def test_the_admin_shows_each_sessions_agent_and_never_credentials(api, staff):
    put_key(api, SECRET)
    session_id = open_keyed_session(api)
    admin = Client()
    admin.force_login(staff)
    page = admin.get(reverse("admin:craft_session_change", args=[session_id])).content.decode()
    assert "keyed" in page
    listing = admin.get(reverse("admin:craft_session_changelist")).content.decode()
    assert "keyed" in listing
    assert admin.get("/admin/craft/credential/").status_code == 404
    assert SECRET not in page + listing
