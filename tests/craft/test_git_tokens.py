"""Each person's git tokens: checked with the host, stored encrypted, never shown back."""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection

from craft import git_tokens
from craft.git_hosts import parse_repository_url
from craft.models import GitToken
from tests.fake_git_hosts import FakeHost

from .test_credentials import send, signed_in

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "ghp_0123456789abcdefWXYZ"
OTHER = "ghp_another-one-98765432"


@pytest.fixture
def github(tmp_path, settings):
    """A fake GitHub (Enterprise, on a port) as this server's only git host, with a gitea
    beside it."""
    with FakeHost("github") as github, FakeHost("gitea") as gitea:
        for token, login in ((TOKEN, "olivia"), (OTHER, "olivia")):
            github.add_token(token, login)
            gitea.add_token(token, f"{login}-gitea")
        hosts = tmp_path / "hosts.toml"
        hosts.write_text(github.toml() + "\n" + gitea.toml())
        settings.CRAFT_GIT_HOSTS_FILE = str(hosts)
        github.gitea = gitea
        yield github


@pytest.fixture
def api(owner):
    return signed_in(owner)


def put_token(api, host, value):
    return send(api, "put", f"/api/git-tokens/{host}/", {"value": value})


def test_a_token_is_checked_stored_listed_with_a_hint_replaced_and_deleted(api, github):
    host = github.netloc
    stored = put_token(api, host, TOKEN)
    assert stored.status_code == 200, stored.content
    assert stored.json() == {
        "host": host,
        "kind": "github",
        "configured": True,
        "stored": True,
        "hint": "WXYZ",
        "login": "olivia",
        "updated_at": stored.json()["updated_at"],
        "readable": True,
    }
    assert TOKEN not in stored.content.decode()
    (checked,) = github.requests
    assert checked.path == "/api/v3/user"
    assert checked.headers["authorization"] == f"Bearer {TOKEN}"

    listing = api.get("/api/git-tokens/").json()["hosts"]
    assert [(h["host"], h["kind"], h["stored"], h["hint"]) for h in listing] == sorted(
        [(host, "github", True, "WXYZ"), (github.gitea.netloc, "gitea", False, "")]
    )
    assert TOKEN not in json.dumps(listing)
    assert api.get(f"/api/git-tokens/{host}/").json()["hint"] == "WXYZ"

    assert put_token(api, host.upper(), OTHER).json()["hint"] == "5432"
    assert GitToken.objects.count() == 1

    assert send(api, "delete", f"/api/git-tokens/{host}/").status_code == 204
    assert api.get(f"/api/git-tokens/{host}/").status_code == 404
    assert send(api, "delete", f"/api/git-tokens/{host}/").status_code == 404
    assert not GitToken.objects.exists()


def test_a_wrong_token_is_refused_plainly_and_nothing_is_stored(api, github, owner):
    put_token(api, github.netloc, TOKEN)
    refused = put_token(api, github.netloc, "ghp_wrong-token-000000")
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "git_auth_failed"
    assert (
        f"{github.netloc} refused the token (HTTP 401: Bad credentials)"
        in (refused.json()["error"]["message"])
    )
    assert "wrong-token" not in refused.content.decode()
    assert git_tokens.token_for(owner.pk, github.netloc) == TOKEN


def test_a_host_that_cannot_be_asked_stores_nothing(api, github):
    github.answer_next(500, {"message": "down for maintenance"})
    refused = put_token(api, github.netloc, TOKEN)
    assert refused.status_code == 502
    assert refused.json()["error"] == {
        "code": "host_api_error",
        "message": f"{github.netloc}'s API answered HTTP 500: down for maintenance",
    }
    github.stop()
    refused = put_token(api, github.netloc, TOKEN)
    assert refused.status_code == 502
    assert refused.json()["error"]["message"].startswith(f"could not reach {github.netloc}'s API")
    assert not GitToken.objects.exists()


def test_a_host_the_server_does_not_allow_is_refused(api, github):
    refused = put_token(api, "github.com", TOKEN)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "unknown_git_host"
    assert github.netloc in refused.json()["error"]["message"]
    assert github.requests == []
    assert api.get("/api/git-tokens/github.com/").status_code == 404


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("line one\nline two", "it contains a line break"),
        ("x" * 100_000, "longer than 8 KiB"),
        ("   ", "the token must be a non-empty string"),
        (42, "the token must be a non-empty string"),
    ],
)
def test_a_bad_value_is_refused_before_asking_the_host(api, github, value, message):
    refused = put_token(api, github.netloc, value)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_git_token"
    assert message in refused.json()["error"]["message"]
    assert github.requests == []


def test_nobody_else_sees_or_deletes_a_token(api, github, stranger):
    put_token(api, github.netloc, TOKEN)
    theirs = signed_in(stranger)
    assert not any(h["stored"] for h in theirs.get("/api/git-tokens/").json()["hosts"])
    assert theirs.get(f"/api/git-tokens/{github.netloc}/").status_code == 404
    assert send(theirs, "delete", f"/api/git-tokens/{github.netloc}/").status_code == 404
    assert GitToken.objects.count() == 1
    assert git_tokens.token_for(stranger.pk, github.netloc) is None


def test_anonymous_callers_get_401_and_writes_need_csrf(client, owner, github):
    assert client.get("/api/git-tokens/").status_code == 401
    assert client.get(f"/api/git-tokens/{github.netloc}/").status_code == 401
    api = signed_in(owner)
    forged = api.put(
        f"/api/git-tokens/{github.netloc}/",
        data=json.dumps({"value": TOKEN}),
        content_type="application/json",
    )
    assert forged.status_code == 403
    assert not GitToken.objects.exists()


def test_the_token_is_encrypted_at_rest_and_never_logged(api, github, caplog):
    caplog.set_level(logging.DEBUG)
    put_token(api, github.netloc, TOKEN)
    put_token(api, github.netloc, "ghp_wrong-token-000000")
    with connection.cursor() as cursor:
        cursor.execute("SELECT ciphertext, hint, login FROM craft_gittoken")
        [(ciphertext, hint, login)] = cursor.fetchall()
    assert TOKEN not in ciphertext
    assert (hint, login) == ("WXYZ", "olivia")
    key = git_tokens.credentials.settings.CRAFT_SECRETS_KEYS[0]
    assert Fernet(key).decrypt(ciphertext).decode() == TOKEN
    assert TOKEN not in caplog.text and "wrong-token" not in caplog.text


def test_rotating_encrypts_tokens_with_the_new_key_so_the_old_can_go(api, github, owner, settings):
    put_token(api, github.netloc, TOKEN)
    old = settings.CRAFT_SECRETS_KEYS[0]
    new = Fernet.generate_key().decode()
    settings.CRAFT_SECRETS_KEYS = [new, old]
    out = StringIO()
    call_command("rotate_credentials", stdout=out)
    assert "Encrypted 1 git token(s) with the newest key." in out.getvalue()
    settings.CRAFT_SECRETS_KEYS = [new]
    assert git_tokens.token_for(owner.pk, github.netloc) == TOKEN


def test_a_token_no_key_reads_is_said_not_used(api, github, owner, settings):
    put_token(api, github.netloc, TOKEN)
    settings.CRAFT_SECRETS_KEYS = [Fernet.generate_key().decode()]
    (listed,) = [h for h in api.get("/api/git-tokens/").json()["hosts"] if h["stored"]]
    assert listed["readable"] is False
    with pytest.raises(git_tokens.GitTokenError) as refused:
        git_tokens.token_for(owner.pk, github.netloc)
    assert refused.value.code == "git_auth_failed"
    assert "can no longer be read" in refused.value.message


def test_a_remote_carries_the_owners_token_and_the_user_name_its_host_wants(
    api, github, owner, stranger
):
    put_token(api, github.netloc, TOKEN)
    put_token(api, github.gitea.netloc, OTHER)
    remote = git_tokens.remote_for(owner.pk, parse_repository_url(f"{github.url}/octo/app.git"))
    assert (remote.url, remote.token, remote.username) == (
        f"{github.url}/octo/app.git",
        TOKEN,
        "x-access-token",
    )
    assert remote.allow_http and not remote.submodules
    assert TOKEN not in repr(remote)
    gitea = git_tokens.remote_for(owner.pk, parse_repository_url(f"{github.gitea.url}/o/n"))
    assert (gitea.token, gitea.username) == (OTHER, "olivia-gitea")
    anonymous = git_tokens.remote_for(stranger.pk, parse_repository_url(f"{github.url}/o/n"))
    assert anonymous.token == ""


def test_gitlab_wants_oauth2_beside_its_token(owner, tmp_path, settings):
    with FakeHost("gitlab") as gitlab:
        gitlab.add_token(TOKEN, "olivia")
        (tmp_path / "hosts.toml").write_text(gitlab.toml())
        settings.CRAFT_GIT_HOSTS_FILE = str(tmp_path / "hosts.toml")
        stored = git_tokens.store_token(owner, gitlab.netloc, TOKEN)
        assert stored.login == "olivia"
        assert gitlab.requests[0].headers["private-token"] == TOKEN
        url = parse_repository_url(f"{gitlab.url}/group/sub/app")
        remote = git_tokens.remote_for(owner.pk, url)
        assert (remote.token, remote.username) == (TOKEN, "oauth2")


# The Keys page.


def test_the_keys_page_lists_each_host_and_stores_a_checked_token(api, github):
    page = api.get("/keys/").content.decode()
    assert "Git hosts" in page
    assert f"<code>{github.netloc}</code>" in page and "No token stored." in page
    stored = api.post(
        f"/keys/git/{github.netloc}/", {"value": TOKEN}, HTTP_X_CSRFTOKEN=api.csrf, follow=True
    )
    page = stored.content.decode()
    assert f"Your token for {github.netloc} is stored (it belongs to olivia)." in page
    assert "ends in <code>WXYZ</code>" in page and TOKEN not in page
    assert f"Delete the token for {github.netloc}" in page


def test_the_keys_page_says_a_refused_token_plainly_and_does_not_echo_it(api, github):
    answer = api.post(
        f"/keys/git/{github.netloc}/",
        {"value": "ghp_wrong-token-000000"},
        HTTP_X_CSRFTOKEN=api.csrf,
    )
    assert answer.status_code == 422
    page = answer.content.decode()
    assert "refused the token (HTTP 401: Bad credentials)" in page
    assert 'role="alert"' in page and "wrong-token" not in page
    assert not GitToken.objects.exists()


def test_the_keys_page_deletes_only_the_persons_own_token(api, github, stranger):
    put_token(api, github.netloc, TOKEN)
    theirs = signed_in(stranger)
    assert "WXYZ" not in theirs.get("/keys/").content.decode()
    theirs.post(f"/keys/git/{github.netloc}/delete/", HTTP_X_CSRFTOKEN=theirs.csrf)
    assert GitToken.objects.count() == 1
    deleted = api.post(f"/keys/git/{github.netloc}/delete/", HTTP_X_CSRFTOKEN=api.csrf, follow=True)
    assert f"Your token for {github.netloc} is deleted." in deleted.content.decode()
    assert not GitToken.objects.exists()


def test_a_token_for_a_host_no_longer_offered_can_still_be_deleted(api, github, owner, settings):
    put_token(api, github.netloc, TOKEN)
    settings.CRAFT_GIT_HOSTS_FILE = ""
    listing = {h["host"]: h for h in api.get("/api/git-tokens/").json()["hosts"]}
    assert listing[github.netloc]["configured"] is False and listing[github.netloc]["stored"]
    assert "This server no longer offers this host." in api.get("/keys/").content.decode()
    assert send(api, "delete", f"/api/git-tokens/{github.netloc}/").status_code == 204
