"""The git hosts' REST APIs: whose a token is, and pull (GitLab: merge) requests.

GitHub (and GitHub Enterprise), GitLab and Gitea (Forgejo speaks Gitea's API) each get the
same three calls. Every call blocks (callers use threads), is bounded in time (TIMEOUT) and in
what it reads (MAX_ANSWER_BYTES), and follows a redirect only on the API's own origin: a
token is never sent to another host. The token appears in no message, log line or repr;
what a host says back is repeated only with any copy of the token taken out.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urljoin, urlsplit

from django.views.decorators.debug import sensitive_variables

from craft.git_hosts import GitHost

log = logging.getLogger(__name__)

TIMEOUT = 10.0
MAX_ANSWER_BYTES = 1 << 20
MAX_REDIRECTS = 3
USER_AGENT = "Craft"


@dataclass(frozen=True)
class PullRequest:
    url: str  # the page people open
    number: int  # GitHub's and Gitea's number, GitLab's iid
    state: str  # open | merged | closed


class HostApiError(Exception):
    """A host's API refused or failed; the message is plain, names the host, and holds no
    token."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code  # host_api_error | git_auth_failed | repository_not_found
        self.message = message


@dataclass(frozen=True)
class _Answer:
    status: int
    body: Any


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Hand redirects back as errors: urllib would resend the Authorization header to
    wherever a redirect points (see `_send`, which follows only the API's own origin)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def _auth_headers(host: GitHost, token: str) -> dict[str, str]:
    """Return the headers that carry the token (none without one: a public repository)."""
    if host.kind == "github":
        github = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
        return {**github, "Authorization": f"Bearer {token}"} if token else github
    if not token:
        return {"Accept": "application/json"}
    if host.kind == "gitlab":
        return {"PRIVATE-TOKEN": token, "Accept": "application/json"}
    return {"Authorization": f"token {token}", "Accept": "application/json"}


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


@sensitive_variables("token", "headers")
def _send(
    host: GitHost,
    token: str,
    method: str,
    path: str,
    *,
    body: dict[str, Any] | None = None,
    query: dict[str, str] | None = None,
) -> _Answer:
    """Call `path` of the host's API; return the status and the JSON answer of a 2xx, or of a
    4xx the caller may want to read (409, 422). Raise HostApiError for anything else."""
    url = f"{host.api_url}{path}" + (f"?{urlencode(query)}" if query else "")
    data = json.dumps(body).encode() if body is not None else None
    headers = {**_auth_headers(host, token), "User-Agent": USER_AGENT}
    if data is not None:
        headers["Content-Type"] = "application/json"
    for _ in range(MAX_REDIRECTS + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with _opener.open(request, timeout=TIMEOUT) as response:
                return _Answer(
                    response.status, _json(host, token, response.read(MAX_ANSWER_BYTES + 1))
                )
        except urllib.error.HTTPError as answer:
            with answer:
                status = answer.code
                raw = answer.read(MAX_ANSWER_BYTES + 1)
                location = answer.headers.get("Location", "")
            log.info("%s %s %s: HTTP %s", host.host, method, path, status)
            if status in (301, 302, 303, 307, 308) and location:
                target = urljoin(url, location)
                if _origin(target) != _origin(host.api_url) or method != "GET":
                    raise HostApiError(
                        "host_api_error",
                        f"{host.host} answered with a redirect elsewhere "
                        f"({urlsplit(target).netloc[:100]}); Craft does not follow it with your "
                        "token",
                    ) from None
                url = target
                continue
            raise _failure(host, token, status, raw) from None
        except (OSError, http.client.HTTPException) as exc:  # URLError and timeouts included
            reason = getattr(exc, "reason", exc)
            raise HostApiError(
                "host_api_error", f"could not reach {host.host}'s API: {_scrub(str(reason), token)}"
            ) from None
    raise HostApiError("host_api_error", f"{host.host} redirected too many times")


def _json(host: GitHost, token: str, raw: bytes) -> Any:
    if len(raw) > MAX_ANSWER_BYTES:
        raise HostApiError(
            "host_api_error",
            f"{host.host}'s answer is larger than {MAX_ANSWER_BYTES // 1024} KiB: not read",
        )
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise HostApiError("host_api_error", f"{host.host} answered something not JSON") from None


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "…") if token else text


def _said(raw: bytes, token: str) -> str:
    """Return what a host's error answer says, briefly, without the token."""
    try:
        answer = json.loads(raw[:MAX_ANSWER_BYTES])
    except (ValueError, RecursionError):
        return ""
    said: list[str] = []
    if isinstance(answer, dict):
        for key in ("message", "error", "error_description"):
            value = answer.get(key)
            if isinstance(value, str):
                said.append(value)
            elif isinstance(value, list):
                said.extend(str(v) for v in value)
        for error in answer.get("errors") or []:
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                said.append(error["message"])
            elif isinstance(error, str):
                said.append(error)
    return _scrub("; ".join(said), token)[:300]


class _Refused(Exception):
    """A 409 or 422: the request was understood and refused (a pull request exists, say)."""

    def __init__(self, status: int, said: str) -> None:
        super().__init__(said)
        self.status = status
        self.said = said


def _failure(host: GitHost, token: str, status: int, raw: bytes) -> Exception:
    said = _said(raw, token)
    tail = f": {said}" if said else ""
    if status in (409, 422):
        return _Refused(status, said)
    if status in (401, 403):
        return HostApiError(
            "git_auth_failed",
            f"{host.host} refused the token (HTTP {status}{tail}): check that it is current "
            "and has the scopes docs/repositories.md lists",
        )
    if status == 404:
        return HostApiError(
            "repository_not_found",
            f"{host.host} found no such repository or pull request (HTTP 404), or the token "
            "cannot see it",
        )
    return HostApiError("host_api_error", f"{host.host}'s API answered HTTP {status}{tail}")


def _call(host: GitHost, token: str, method: str, path: str, **kwargs: Any) -> Any:
    try:
        return _send(host, token, method, path, **kwargs).body
    except _Refused as refused:
        tail = f": {refused.said}" if refused.said else ""
        raise HostApiError(
            "host_api_error", f"{host.host}'s API answered HTTP {refused.status}{tail}"
        ) from None


def _field(host: GitHost, answer: Any, *keys: str) -> Any:
    if not isinstance(answer, dict):
        raise HostApiError("host_api_error", f"{host.host} answered something unexpected")
    for key in keys:
        if key in answer and answer[key] is not None:
            return answer[key]
    raise HostApiError("host_api_error", f"{host.host}'s answer has no {keys[0]!r}")


@sensitive_variables("token")
def check_token(host: GitHost, token: str) -> str:
    """Return the login of the account the token belongs to; HostApiError `git_auth_failed`
    when the host refuses it."""
    try:
        answer = _call(host, token, "GET", "/user")
    except HostApiError as exc:
        if exc.code == "repository_not_found":  # no /user there: the api_url is wrong
            raise HostApiError(
                "host_api_error",
                f"{host.host}'s API has no /user (HTTP 404): is its api_url right?",
            ) from None
        raise
    login = _field(host, answer, "username" if host.kind == "gitlab" else "login")
    if not isinstance(login, str):
        raise HostApiError("host_api_error", f"{host.host} answered something unexpected")
    return login


def _repo(path: str) -> str:
    owner, name = path.split("/", 1)
    return f"/repos/{quote(owner, safe='')}/{quote(name, safe='')}"


def _project(path: str) -> str:
    return f"/projects/{quote(path, safe='')}"


def _pull_request(host: GitHost, answer: Any) -> PullRequest:
    if host.kind == "gitlab":
        number = _field(host, answer, "iid")
        state = {"opened": "open", "locked": "open", "merged": "merged"}.get(
            _field(host, answer, "state"), "closed"
        )
        url = _field(host, answer, "web_url")
    else:
        number = _field(host, answer, "number")
        raw_state = _field(host, answer, "state")
        if raw_state == "open":
            state = "open"
        elif answer.get("merged") or answer.get("merged_at"):
            state = "merged"
        else:
            state = "closed"
        url = _field(host, answer, "html_url")
    if not isinstance(number, int) or not isinstance(url, str):
        raise HostApiError("host_api_error", f"{host.host} answered something unexpected")
    return PullRequest(url=url, number=number, state=state)


@sensitive_variables("token")
def open_pull_request(
    host: GitHost, path: str, token: str, *, head: str, base: str, title: str, body: str
) -> PullRequest:
    """Open a pull request (GitLab: merge request) of the branch `head` into `base` of the
    repository `path`; when one is already open for `head`, return it as it is."""
    if host.kind == "gitlab":
        where = f"{_project(path)}/merge_requests"
        sent = {"source_branch": head, "target_branch": base, "title": title, "description": body}
    else:
        where = f"{_repo(path)}/pulls"
        sent = {"title": title, "body": body, "head": head, "base": base}
    try:
        return _pull_request(host, _send(host, token, "POST", where, body=sent).body)
    except _Refused as refused:
        existing = _open_one(host, path, token, head=head, base=base)
        if existing is not None:
            return existing
        tail = f": {refused.said}" if refused.said else ""
        raise HostApiError(
            "host_api_error",
            f"{host.host} did not open the pull request (HTTP {refused.status}{tail})",
        ) from None


def _open_one(host: GitHost, path: str, token: str, *, head: str, base: str) -> PullRequest | None:
    """Return the open pull request of the branch `head`, if there is one."""
    if host.kind == "github":
        owner = path.split("/", 1)[0]
        query = {"head": f"{owner}:{head}", "state": "open"}
        found = _call(host, token, "GET", f"{_repo(path)}/pulls", query=query)
    elif host.kind == "gitlab":
        query = {"source_branch": head, "state": "opened"}
        found = _call(host, token, "GET", f"{_project(path)}/merge_requests", query=query)
    else:  # Gitea's list has no filter by branch: the newest 50 open ones are enough
        query = {"state": "open", "sort": "recentupdate", "limit": "50"}
        listed = _call(host, token, "GET", f"{_repo(path)}/pulls", query=query)
        found = [
            p
            for p in listed or []
            if isinstance(p, dict)
            and (p.get("head") or {}).get("ref") == head
            and (p.get("base") or {}).get("ref") == base
        ]
    if not isinstance(found, list) or not found:
        return None
    return _pull_request(host, found[0])


@sensitive_variables("token")
def read_pull_request(host: GitHost, path: str, token: str, number: int) -> PullRequest:
    """Return the pull request (GitLab: merge request) `number` of `path` as it is now."""
    if host.kind == "gitlab":
        answer = _call(host, token, "GET", f"{_project(path)}/merge_requests/{int(number)}")
    else:
        answer = _call(host, token, "GET", f"{_repo(path)}/pulls/{int(number)}")
    return _pull_request(host, answer)
