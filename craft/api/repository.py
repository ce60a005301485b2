"""A session's repository over HTTP (docs/http-api.md, "Repositories"): its state, and the
verbs that ship the session's work: commit, push, pull request, update from the remote.

Only the session's owner. Each verb is a command carried out by the worker that runs the
session (`craft.services`), which stores what it did as an event; the answer is read back
from what it stored.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from django.http import HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from craft import services
from craft.api.sessions import error, json_body, owned_session
from craft.commands import (
    CommitRepository,
    OpenPullRequest,
    PushRepository,
    RefreshPullRequest,
    UpdateRepository,
)
from craft.errors import Refused
from craft.http.requests import SignedInRequest
from craft.models import Event, SessionRepository
from craft.storage.db import db_sync_to_async
from craft.turns import repository as session_repository
from craft.turns.repository import in_thread, repository_json, repository_of
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

# Refusals, as HTTP statuses (others: 400).
STATUS = {
    "no_repository": 404,
    "repository_not_found": 404,
    "git_auth_failed": 403,
    "nothing_to_commit": 409,
    "push_rejected": 409,
    "repository_not_ready": 409,
    "turn_running": 409,
    "repository_too_large": 413,
    "host_api_error": 502,
    "git_failed": 502,
    "sandbox_unavailable": 503,
    "shutting_down": 503,
    "unavailable": 503,
    "git_timeout": 504,
}
MAX_MESSAGE_CHARS = 20_000


def _refused(refused: Refused) -> HttpResponse:
    return error(STATUS.get(refused.code, 400), refused.code, refused.message)


@require_http_methods(["GET"])
async def repository(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """Return the session's repository: where it is (`url`, `branch`, `base`), how far its
    clone got (`status`), its branch against the base (`head`, `ahead`, `behind`, `dirty`:
    null until it is cloned), its pull request, and the drafted texts of a commit and a pull
    request. Its pull request's state is read from the host first if it is not fresh."""
    session = await owned_session(request, session_id)
    if isinstance(session, HttpResponse):
        return session
    row = await _row(session.pk)
    if row is None:
        return error(404, "no_repository", "this session is not on a repository")
    if row.pull_request_number is not None and row.pull_request_state == "open":
        try:
            await services.run_command(session.pk, RefreshPullRequest())
        except Refused as refused:  # the host is down: the state it last said is shown
            logger.info("session %s: pull request not refreshed: %s", session.pk, refused)
        row = await _row(session.pk) or row
    state: dict[str, Any] = {"head": None, "ahead": None, "behind": None, "dirty": None}
    if row.status == SessionRepository.Status.READY:
        state = await _state(session.sandbox, session.pk, row.base)
    link = request.build_absolute_uri(reverse("session", args=[session.pk]))
    drafts = await db_sync_to_async(_drafts)(session.pk, link)
    return JsonResponse({**repository_json(row), **state, "drafts": drafts})


async def _state(sandbox: Sandbox, session_id: UUID, base: str) -> dict[str, Any]:
    try:
        if sandbox.status != Sandbox.Status.RUNNING:
            raise SandboxError(f"your sandbox is {sandbox.status}")
        git = await repository_of(sandbox, session_id)
        now = await in_thread(git.state, base)
    except SandboxError as exc:
        logger.info("session %s: the repository's state is not known: %s", session_id, exc)
        return {"head": None, "ahead": None, "behind": None, "dirty": None}
    return {"head": now.head, "ahead": now.ahead, "behind": now.behind, "dirty": now.dirty}


def _drafts(session_id: UUID, link: str) -> dict[str, str]:
    _, message = session_repository.commit_draft(session_id)
    title, body = session_repository.pull_request_draft(session_id, link)
    return {"commit_message": message, "pull_request_title": title, "pull_request_body": body}


@require_http_methods(["POST"])
async def commit(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """Commit the workspace's changes: `{"message"?}` → `{"commit"}`."""
    session = await owned_session(request, session_id)
    if isinstance(session, HttpResponse):
        return session
    body = json_body(request)
    message = (body or {}).get("message", "")
    if body is None or not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS:
        return error(400, "invalid", "send a JSON object with an optional 'message' string")
    before = await _last(session.pk, "repository_committed")
    try:
        await services.run_command(session.pk, CommitRepository(message))
    except Refused as refused:
        return _refused(refused)
    event = await _last(session.pk, "repository_committed")
    if event is None or (before is not None and event.seq == before.seq):
        return error(500, "lost", "the commit was made but its event was not found")
    return JsonResponse({"commit": event.data["commit"]}, status=201)


@require_http_methods(["POST"])
async def push(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """Push the session's branch: → `{"branch", "head"}`."""
    session = await owned_session(request, session_id)
    if isinstance(session, HttpResponse):
        return session
    try:
        await services.run_command(session.pk, PushRepository())
    except Refused as refused:
        return _refused(refused)
    row = await _row(session.pk)
    assert row is not None
    return JsonResponse({"branch": row.branch, "head": row.pushed})


@require_http_methods(["POST"])
async def pull_request(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """Open the branch's pull request: `{"title"?, "body"?}` → `{"url", "number", "state"}`."""
    session = await owned_session(request, session_id)
    if isinstance(session, HttpResponse):
        return session
    body = json_body(request)
    title, text = (body or {}).get("title", ""), (body or {}).get("body", "")
    if body is None or not isinstance(title, str) or not isinstance(text, str):
        return error(400, "invalid", "send a JSON object with optional 'title' and 'body' strings")
    if len(title) > 1000 or len(text) > MAX_MESSAGE_CHARS:
        return error(400, "invalid", "the title or the body is too long")
    link = request.build_absolute_uri(reverse("session", args=[session.pk]))
    try:
        await services.run_command(session.pk, OpenPullRequest(title, text, link))
    except Refused as refused:
        return _refused(refused)
    row = await _row(session.pk)
    assert row is not None
    return JsonResponse(
        {"url": row.pull_request_url, "number": row.pull_request_number,
         "state": row.pull_request_state},
        status=201,
    )  # fmt: skip


@require_http_methods(["POST"])
async def update(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """Fetch the base branch and merge it in: → `{"head", "conflicts": [paths]}`."""
    session = await owned_session(request, session_id)
    if isinstance(session, HttpResponse):
        return session
    before = await _last(session.pk, "repository_updated")
    try:
        await services.run_command(session.pk, UpdateRepository())
    except Refused as refused:
        return _refused(refused)
    event = await _last(session.pk, "repository_updated")
    if event is None or (before is not None and event.seq == before.seq):
        return error(500, "lost", "the update was made but its event was not found")
    return JsonResponse({"head": event.data["head"], "conflicts": event.data["conflicts"]})


@db_sync_to_async
def _row(session_id: UUID) -> SessionRepository | None:
    return SessionRepository.objects.filter(session_id=session_id).first()


@db_sync_to_async
def _last(session_id: UUID, kind: str) -> Event | None:
    return Event.objects.filter(session_id=session_id, kind=kind).order_by("-seq").first()
