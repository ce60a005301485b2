"""What Craft asks of a git host's API, against fakes of GitHub, GitLab and Gitea."""

from __future__ import annotations

import logging

import pytest

from craft import host_api
from craft.host_api import HostApiError, PullRequest
from tests.fake_git_hosts import FakeHost

TOKEN = "tok-0123456789abcdef-secret"
REPO = {"github": "octo/app", "gitlab": "team/backend/app", "gitea": "octo/app"}
KINDS = ["github", "gitlab", "gitea"]


@pytest.fixture(params=KINDS)
def fake(request):
    with FakeHost(request.param) as fake:
        fake.add_token(TOKEN, "olivia")
        fake.add_repository(REPO[fake.kind])
        yield fake


def open_one(fake, head="craft/fix-1", base="main", token=TOKEN) -> PullRequest:
    return host_api.open_pull_request(
        fake.git_host(),
        REPO[fake.kind],
        token,
        head=head,
        base=base,
        title="Fix the thing",
        body="Asked: fix it.",
    )


def failure(call) -> HostApiError:
    with pytest.raises(HostApiError) as caught:
        call()
    assert TOKEN not in str(caught.value) and TOKEN not in repr(caught.value)
    return caught.value


def test_check_token_says_whose_it_is_with_each_hosts_own_header(fake):
    assert host_api.check_token(fake.git_host(), TOKEN) == "olivia"
    (sent,) = fake.requests
    assert sent.method == "GET"
    assert (
        sent.path
        == {"github": "/api/v3", "gitlab": "/api/v4", "gitea": "/api/v1"}[fake.kind] + "/user"
    )
    if fake.kind == "github":
        assert sent.headers["authorization"] == f"Bearer {TOKEN}"
        assert sent.headers["accept"] == "application/vnd.github+json"
        assert sent.headers["x-github-api-version"] == "2022-11-28"
    elif fake.kind == "gitlab":
        assert sent.headers["private-token"] == TOKEN
        assert "authorization" not in sent.headers
    else:
        assert sent.headers["authorization"] == f"token {TOKEN}"


def test_a_wrong_token_is_git_auth_failed(fake):
    error = failure(lambda: host_api.check_token(fake.git_host(), "wrong-token-0123456789"))
    assert error.code == "git_auth_failed"
    assert fake.netloc in error.message and "HTTP 401" in error.message


def test_a_pull_request_is_opened_and_its_state_followed(fake):
    opened = open_one(fake)
    assert opened.number == 1
    assert opened.state == "open"
    path = REPO[fake.kind]
    web = {"github": "pull", "gitlab": "-/merge_requests", "gitea": "pulls"}[fake.kind]
    assert opened.url == f"{fake.url}/{path}/{web}/1"
    (sent,) = fake.requests
    assert sent.method == "POST"
    if fake.kind == "gitlab":
        assert sent.path == "/api/v4/projects/team%2Fbackend%2Fapp/merge_requests"
        assert sent.body == {
            "source_branch": "craft/fix-1",
            "target_branch": "main",
            "title": "Fix the thing",
            "description": "Asked: fix it.",
        }
    else:
        assert sent.path.endswith("/repos/octo/app/pulls")
        assert sent.body == {
            "title": "Fix the thing",
            "body": "Asked: fix it.",
            "head": "craft/fix-1",
            "base": "main",
        }
    assert sent.headers["content-type"] == "application/json"

    def read() -> PullRequest:
        return host_api.read_pull_request(fake.git_host(), path, TOKEN, 1)

    assert read() == opened
    fake.merge(path, 1)
    assert read().state == "merged"
    second = open_one(fake, head="craft/other-2")
    assert second.number == 2
    fake.close(path, 2)
    assert host_api.read_pull_request(fake.git_host(), path, TOKEN, 2).state == "closed"


def test_an_open_pull_request_for_the_branch_is_returned_as_it_is(fake):
    first = open_one(fake)
    again = open_one(fake)
    assert again == first
    assert len(fake.pulls(REPO[fake.kind])) == 1
    post, lookup = fake.requests[1:]
    assert post.method == "POST"
    assert lookup.method == "GET"
    if fake.kind == "github":
        assert lookup.path == "/api/v3/repos/octo/app/pulls?head=octo%3Acraft%2Ffix-1&state=open"
    elif fake.kind == "gitlab":
        assert lookup.path == (
            "/api/v4/projects/team%2Fbackend%2Fapp/merge_requests"
            "?source_branch=craft%2Ffix-1&state=opened"
        )
    else:
        assert lookup.path.startswith("/api/v1/repos/octo/app/pulls?state=open")


def test_a_refusal_that_is_not_an_existing_pull_request_is_said(fake):
    said = "No commits between main and craft/fix-1"
    fake.answer_next(422, {"message": "Validation Failed", "errors": [{"message": said}]})
    error = failure(lambda: open_one(fake))
    assert error.code == "host_api_error"
    assert said in error.message and "HTTP 422" in error.message


def test_a_missing_repository_is_repository_not_found(fake):
    error = failure(lambda: host_api.read_pull_request(fake.git_host(), "nobody/nothing", TOKEN, 1))
    assert error.code == "repository_not_found"
    assert "HTTP 404" in error.message


def test_a_server_error_is_host_api_error_naming_the_host_and_status(fake):
    fake.answer_next(500, {"message": "Internal error"})
    error = failure(lambda: open_one(fake))
    assert error.code == "host_api_error"
    assert error.message == f"{fake.netloc}'s API answered HTTP 500: Internal error"


def test_a_401_or_403_while_opening_is_git_auth_failed(fake):
    error = failure(lambda: open_one(fake, token="nobodys-token-0123"))
    assert error.code == "git_auth_failed"
    fake.answer_next(403, {"message": "Resource not accessible by personal access token"})
    error = failure(lambda: open_one(fake))
    assert error.code == "git_auth_failed"
    assert "Resource not accessible" in error.message


def test_a_host_repeating_the_token_has_it_taken_out(fake):
    fake.answer_next(500, {"message": f"cannot use {TOKEN} here"})
    assert "cannot use … here" in failure(lambda: open_one(fake)).message


def test_a_redirect_to_another_host_is_not_followed_with_the_token(fake):
    with FakeHost(fake.kind) as elsewhere:
        target = f"{elsewhere.api_url}/user"
        fake.answer_next(302, headers={"Location": target})
        error = failure(lambda: host_api.check_token(fake.git_host(), TOKEN))
        assert error.code == "host_api_error"
        assert f"a redirect elsewhere ({elsewhere.netloc})" in error.message
        assert elsewhere.requests == []


def test_a_redirect_on_the_apis_own_origin_is_followed_for_a_read(fake):
    fake.answer_next(301, headers={"Location": f"{fake.api_url}/user"})
    assert host_api.check_token(fake.git_host(), TOKEN) == "olivia"
    assert len(fake.requests) == 2


def test_a_redirected_write_is_not_resent(fake):
    fake.answer_next(307, headers={"Location": f"{fake.api_url}/elsewhere"})
    assert failure(lambda: open_one(fake)).code == "host_api_error"
    assert len(fake.requests) == 1


def test_an_oversized_answer_is_not_read(fake):
    fake.answer_next(200, b"[" + b" " * (2 << 20) + b"]")
    error = failure(lambda: host_api.check_token(fake.git_host(), TOKEN))
    assert error.code == "host_api_error"
    assert "larger than 1024 KiB" in error.message


def test_an_answer_that_is_not_json_is_host_api_error(fake):
    fake.answer_next(200, b"<html>sign in</html>")
    error = failure(lambda: host_api.check_token(fake.git_host(), TOKEN))
    assert error.message == f"{fake.netloc} answered something not JSON"


def test_a_silent_host_times_out(fake, monkeypatch):
    monkeypatch.setattr(host_api, "TIMEOUT", 0.2)
    fake.answer_next(200, {"login": "late"}, delay=1.0)
    error = failure(lambda: host_api.check_token(fake.git_host(), TOKEN))
    assert error.code == "host_api_error"
    assert f"could not reach {fake.netloc}'s API" in error.message


def test_an_unreachable_host_is_host_api_error():
    with FakeHost("github") as gone:
        host = gone.git_host()
    error = failure(lambda: host_api.check_token(host, TOKEN))
    assert error.code == "host_api_error"
    assert error.message.startswith(f"could not reach {gone.netloc}'s API")


def test_the_token_is_never_logged(fake, caplog):
    caplog.set_level(logging.DEBUG)
    open_one(fake)
    fake.answer_next(500)
    with pytest.raises(HostApiError):
        open_one(fake, head="craft/other")
    failure(lambda: host_api.check_token(fake.git_host(), "bad-token-0123456789"))
    assert TOKEN not in caplog.text and "bad-token" not in caplog.text


def test_without_a_token_no_authorization_is_sent():
    with FakeHost("github") as github:
        github.add_repository("octo/app")
        # The fake wants a token for everything (as GitHub does for a private repository).
        assert (
            failure(lambda: host_api.read_pull_request(github.git_host(), "octo/app", "", 1)).code
            == "git_auth_failed"
        )
        assert "authorization" not in github.requests[0].headers
