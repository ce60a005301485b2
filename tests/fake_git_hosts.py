"""Fake REST APIs of GitHub, GitLab and Gitea, for what Craft asks of a git host's API.

Each is a small threaded HTTP server on 127.0.0.1 answering the paths, authentication headers
and JSON shapes each host documents for the few calls Craft makes: whose a token is (`/user`)
and pull requests (GitLab: merge requests), opened, listed and read. They are written from
the hosts' documentation, not from Craft's code, and record every request (method, path,
headers, JSON body) so that a test can check what Craft sent. A test registers tokens and
repositories, marks a pull request merged or closed, and can queue an answer of its own
(an error, a redirect, an oversized body) for the next request.

    with FakeHost("gitlab") as gitlab:
        gitlab.add_token("glpat-…", "olivia")
        gitlab.add_repository("team/app")
        host = gitlab.git_host()            # a craft.git_hosts.GitHost pointing at it
        ...
        gitlab.merge("team/app", 1)
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from craft.git_hosts import GitHost

API_PREFIX = {"github": "/api/v3", "gitlab": "/api/v4", "gitea": "/api/v1"}


@dataclass
class Recorded:
    method: str
    path: str  # as sent, query included
    headers: dict[str, str]  # names lowercase
    body: Any  # the JSON sent, or None


@dataclass
class Canned:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class _Pull:
    number: int
    title: str
    body: str
    head: str
    base: str
    state: str = "open"  # open | closed | merged
    merged_at: str | None = None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeHost:
    """One fake git host's API, of `kind` "github", "gitlab" or "gitea"."""

    def __init__(self, kind: str) -> None:
        assert kind in API_PREFIX
        self.kind = kind
        self.tokens: dict[str, str] = {}  # token -> login
        self.repositories: dict[str, list[_Pull]] = {}  # "owner/name" (lowercase) -> pulls
        self.requests: list[Recorded] = []
        self.canned: list[Canned] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # Set-up, for tests.

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.netloc}"

    @property
    def api_url(self) -> str:
        return f"{self.url}{API_PREFIX[self.kind]}"

    def git_host(self, host: str | None = None) -> GitHost:
        """Return the hosts-file entry of this API, for the git host `host` (default: the
        fake's own address)."""
        return GitHost(host or self.netloc, self.kind, self.api_url, allow_http=True)

    def toml(self, host: str | None = None) -> str:
        """Return this API's entry of a CRAFT_GIT_HOSTS_FILE."""
        return (
            f'[[hosts]]\nhost = "{host or self.netloc}"\nkind = "{self.kind}"\n'
            f'api_url = "{self.api_url}"\nallow_http = true\n'
        )

    def add_token(self, token: str, login: str) -> None:
        self.tokens[token] = login

    def add_repository(self, path: str) -> None:
        self.repositories.setdefault(path.lower(), [])

    def answer_next(
        self,
        status: int,
        body: bytes | dict[str, Any] | list[Any] = b"",
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
    ) -> None:
        """Answer the next request with this instead of what the host would."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.canned.append(Canned(status, raw, headers or {}, delay))

    def merge(self, path: str, number: int) -> None:
        pull = self._pull(path, number)
        pull.state, pull.merged_at = "merged", _now()

    def close(self, path: str, number: int) -> None:
        self._pull(path, number).state = "closed"

    def pulls(self, path: str) -> list[_Pull]:
        return self.repositories[path.lower()]

    def _pull(self, path: str, number: int) -> _Pull:
        return next(p for p in self.repositories[path.lower()] if p.number == number)

    def start(self) -> FakeHost:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # The host's answers.

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                headers = {k.lower(): v for k, v in self.headers.items()}
                with fake.lock:
                    fake.requests.append(Recorded(self.command, self.path, headers, body))
                    canned = fake.canned.pop(0) if fake.canned else None
                if canned is not None:
                    time.sleep(canned.delay)
                    self._send(canned.status, canned.body, canned.headers)
                    return
                status, answer = fake._answer(self.command, self.path, headers, body)
                self._send(status, json.dumps(answer).encode(), {})

            def _send(self, status: int, raw: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client read what it wanted (an oversized answer) and left

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        return Handler

    def _login(self, headers: dict[str, str]) -> str | None:
        """Return whose token the request carries, as this kind of host reads it."""
        authorization = headers.get("authorization", "")
        if self.kind == "github":  # https://docs.github.com/en/rest/authentication
            match = re.fullmatch(r"(?:Bearer|token) (\S+)", authorization)
        elif self.kind == "gitlab":  # https://docs.gitlab.com/api/rest/authentication/
            token = headers.get("private-token")
            if token is not None:
                return self.tokens.get(token)
            match = re.fullmatch(r"Bearer (\S+)", authorization)
        else:  # https://docs.gitea.com/development/api-usage
            match = re.fullmatch(r"(?:token|Bearer) (\S+)", authorization)
        return self.tokens.get(match[1]) if match else None

    def _answer(
        self, method: str, target: str, headers: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        parts = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        prefix = API_PREFIX[self.kind]
        if not parts.path.startswith(prefix + "/"):
            return 404, self._not_found()
        path = parts.path[len(prefix) :]
        login = self._login(headers)
        if login is None:
            return 401, self._unauthorized(headers)
        if path == "/user" and method == "GET":
            return 200, self._user(login)
        with self.lock:
            if self.kind == "gitlab":
                return self._gitlab(method, path, query, body)
            return self._github_or_gitea(method, path, query, body)

    def _not_found(self) -> Any:
        if self.kind == "github":
            return {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        if self.kind == "gitlab":
            return {"message": "404 Project Not Found"}
        return {"errors": None, "message": "The target couldn't be found.", "url": self.url}

    def _unauthorized(self, headers: dict[str, str]) -> Any:
        if self.kind == "github":
            return {
                "message": "Bad credentials",
                "documentation_url": "https://docs.github.com/rest",
            }
        if self.kind == "gitlab":
            return {"message": "401 Unauthorized"}
        return {"message": "token is required", "url": self.url}

    def _user(self, login: str) -> Any:
        if self.kind == "gitlab":
            return {"id": 7, "username": login, "name": login.title(), "state": "active"}
        return {"id": 7, "login": login, "full_name": login.title()}

    # GitHub: https://docs.github.com/en/rest/pulls/pulls
    # Gitea:  https://gitea.com/api/swagger#/repository/repoCreatePullRequest

    def _github_or_gitea(
        self, method: str, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        match = re.fullmatch(r"/repos/([^/]+)/([^/]+)/pulls(?:/(\d+))?", path)
        if match is None:
            return 404, self._not_found()
        repository = f"{unquote(match[1])}/{unquote(match[2])}"
        pulls = self.repositories.get(repository.lower())
        if pulls is None:
            return 404, self._not_found()
        if match[3] is not None:
            pull = next((p for p in pulls if p.number == int(match[3])), None)
            if pull is None or method != "GET":
                return 404, self._not_found()
            return 200, self._github_pull(repository, pull, listed=False)
        if method == "GET":
            state = query.get("state", "open")
            listed = [
                p for p in pulls if state == "all" or (p.state == "open") == (state == "open")
            ]
            if self.kind == "github" and "head" in query:
                listed = [
                    p for p in listed if f"{repository.split('/')[0]}:{p.head}" == query["head"]
                ]
            return 200, [self._github_pull(repository, p, listed=True) for p in listed]
        if method != "POST" or not isinstance(body, dict):
            return 404, self._not_found()
        missing = [k for k in ("title", "head", "base") if not body.get(k)]
        if missing:
            return 422, {
                "message": "Validation Failed",
                "errors": [{"field": missing[0], "code": "missing_field"}],
            }
        existing = next(
            (
                p
                for p in pulls
                if p.state == "open" and p.head == body["head"] and p.base == body["base"]
            ),
            None,
        )
        if existing is not None:
            if self.kind == "github":
                owner = repository.split("/")[0]
                said = f"A pull request already exists for {owner}:{body['head']}."
                return 422, {
                    "message": "Validation Failed",
                    "errors": [{"resource": "PullRequest", "code": "custom", "message": said}],
                    "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request",
                    "status": "422",
                }
            return 409, {
                "message": f"pull request already exists for these targets [id: {existing.number}, "
                f"issue_id: {existing.number}, head_repo_id: 1, base_repo_id: 1, "
                f"head_branch: {existing.head}, base_branch: {existing.base}]",
                "url": self.url,
            }
        pull = _Pull(
            len(pulls) + 1, body["title"], body.get("body") or "", body["head"], body["base"]
        )
        pulls.append(pull)
        return 201, self._github_pull(repository, pull, listed=False)

    def _github_pull(self, repository: str, pull: _Pull, *, listed: bool) -> Any:
        owner = repository.split("/")[0]
        web = "pull" if self.kind == "github" else "pulls"
        answer: dict[str, Any] = {
            "id": 1000 + pull.number,
            "number": pull.number,
            "url": f"{self.api_url}/repos/{repository}/pulls/{pull.number}",
            "html_url": f"{self.url}/{repository}/{web}/{pull.number}",
            "state": "open" if pull.state == "open" else "closed",
            "title": pull.title,
            "body": pull.body,
            "head": {"ref": pull.head, "label": f"{owner}:{pull.head}"},
            "base": {"ref": pull.base, "label": f"{owner}:{pull.base}"},
            "merged_at": pull.merged_at,
        }
        # GitHub's list of pull requests leaves `merged` out; Gitea always says it.
        if not listed or self.kind == "gitea":
            answer["merged"] = pull.state == "merged"
        return answer

    # GitLab: https://docs.gitlab.com/api/merge_requests/

    def _gitlab(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        match = re.fullmatch(r"/projects/([^/]+)/merge_requests(?:/(\d+))?", path)
        if match is None:
            return 404, self._not_found()
        project = unquote(match[1])  # the project's path, URL-encoded as one part
        pulls = self.repositories.get(project.lower())
        if pulls is None:
            return 404, self._not_found()
        if match[2] is not None:
            pull = next((p for p in pulls if p.number == int(match[2])), None)
            if pull is None or method != "GET":
                return 404, {"message": "404 Not found"}
            return 200, self._merge_request(project, pull)
        if method == "GET":
            state = {"opened": "open"}.get(query.get("state", "all"), query.get("state", "all"))
            listed = [p for p in pulls if state == "all" or p.state == state]
            if "source_branch" in query:
                listed = [p for p in listed if p.head == query["source_branch"]]
            return 200, [self._merge_request(project, p) for p in listed]
        if method != "POST" or not isinstance(body, dict):
            return 404, self._not_found()
        missing = [k for k in ("source_branch", "target_branch", "title") if not body.get(k)]
        if missing:
            return 400, {"error": f"{missing[0]} is missing"}
        existing = next(
            (p for p in pulls if p.state == "open" and p.head == body["source_branch"]), None
        )
        if existing is not None:
            said = "Another open merge request already exists for this source branch: !"
            said += str(existing.number)
            return 409, {"message": [said]}
        pull = _Pull(
            len(pulls) + 1,
            body["title"],
            body.get("description") or "",
            body["source_branch"],
            body["target_branch"],
        )
        pulls.append(pull)
        return 201, self._merge_request(project, pull)

    def _merge_request(self, project: str, pull: _Pull) -> Any:
        return {
            "id": 2000 + pull.number,
            "iid": pull.number,
            "project_id": 3,
            "title": pull.title,
            "description": pull.body,
            "state": {"open": "opened"}.get(pull.state, pull.state),
            "source_branch": pull.head,
            "target_branch": pull.base,
            "merged_at": pull.merged_at,
            "web_url": f"{self.url}/{project}/-/merge_requests/{pull.number}",
        }
