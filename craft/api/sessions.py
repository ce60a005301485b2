"""The HTTP JSON API (see docs/http-api.md): session-cookie auth, CSRF on unsafe methods."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import wraps
from typing import Any
from uuid import UUID

from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.debug import sensitive_variables
from django.views.decorators.http import require_http_methods

from craft import credentials, git_hosts, git_tokens, services, workspace_paths
from craft.commands import PrepareRepository
from craft.http.requests import SignedInRequest
from craft.models import Event, Session, SessionRepository, TurnRecord
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import events_json_after
from craft.turns.repository import repository_json
from sandboxes import services as sandbox_services
from sandboxes.models import Sandbox

MAX_EVENTS_PAGE = 1000
logger = logging.getLogger(__name__)


def error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def api_login_required(
    view: Callable[..., HttpResponseBase],
) -> Callable[..., HttpResponseBase]:
    """Answer 401 JSON (not a redirect to the login page) to anonymous callers."""

    @wraps(view)
    def wrapper(request: SignedInRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            return error(401, "unauthenticated", "sign in first")
        return view(request, *args, **kwargs)

    return wrapper


def json_body(request: SignedInRequest) -> dict[str, Any] | None:
    if not request.body:
        return {}
    try:
        body = json.loads(request.body)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
        return None
    return body if isinstance(body, dict) else None


def page_of(
    request: SignedInRequest, start: str, default_limit: int, most: int
) -> tuple[int, int] | JsonResponse:
    """Return the query's `start` (default 0) and `limit` (default `default_limit`, at most
    `most`), or the 400 to answer when they are no whole numbers, or out of range."""
    try:
        first = int(request.GET.get(start, "0"))
        limit = min(int(request.GET.get("limit", default_limit)), most)
    except ValueError:
        return error(400, "invalid", f"'{start}' and 'limit' must be integers")
    if first < 0 or limit < 1:
        return error(400, "invalid", f"'{start}' must be >= 0 and 'limit' >= 1")
    return first, limit


def value_sent(request: SignedInRequest, missing: str) -> dict[str, Any] | JsonResponse:
    """Return the request's JSON object, which has a "value", or the 400 to answer (with
    `missing` as its message when the object has no "value")."""
    body = json_body(request)
    if body is None:
        return error(400, "bad_json", "the body must be a JSON object")
    if "value" not in body:
        return error(400, "invalid", missing)
    return body


async def owned_session(request: SignedInRequest, session_id: UUID) -> Session | HttpResponse:
    """Return the caller's session `session_id`, or the error to answer instead: 401 to a
    caller not signed in, 404 when it is no session of theirs."""
    user = await request.auser()
    if not user.is_authenticated:
        return error(401, "unauthenticated", "sign in first")
    session = await db_sync_to_async(Session.objects.one_of)(user, session_id)
    if session is None:
        return error(404, "not_found", "no such session")
    return session


async def owned_session_and_body(
    request: SignedInRequest, session_id: UUID
) -> tuple[Session, dict[str, Any]] | HttpResponse:
    """Return the caller's session `session_id` and the request's JSON object, or the error
    to answer instead (as `owned_session`, or 400 when the body is no JSON object)."""
    session = await owned_session(request, session_id)
    if isinstance(session, HttpResponse):
        return session
    body = json_body(request)
    if body is None:
        return error(400, "bad_json", "the body must be a JSON object")
    return session, body


def _own_session(request: SignedInRequest, session_id: UUID) -> Session | None:
    return Session.objects.one_of(request.user, session_id)


def _running(session: Session) -> bool:
    """Whether a turn runs (in whichever worker runs it): from `with_running()` if there."""
    running = getattr(session, "running", None)
    if running is None:
        return TurnRecord.objects.running().filter(session=session).exists()
    return bool(running)


def sandbox_json(sandbox: Sandbox) -> dict[str, Any]:
    return {
        "id": str(sandbox.pk),
        "backend": sandbox.backend,
        "status": sandbox.status,
        "detail": sandbox.status_detail,
        "error": sandbox.error,
        "created_at": sandbox.created_at.isoformat(),
        "last_activity_at": sandbox.last_activity_at.isoformat(),
        "disk_bytes": sandbox.disk_bytes,
        "disk_measured_at": (
            sandbox.disk_measured_at.isoformat() if sandbox.disk_measured_at else None
        ),
        "disk_limit_bytes": settings.CRAFT_SANDBOX_DISK or None,
    }


def session_json(session: Session) -> dict[str, Any]:
    """Return a session as the API shows it (its repository read from the session when it
    was fetched with it, `select_related("repository")`, else with one query)."""
    return {
        "id": str(session.pk),
        "title": session.title,
        "created_at": session.created_at.isoformat(),
        "updated_at": session.updated_at.isoformat(),
        "last_seq": session.last_seq,
        "running": _running(session),
        "sandbox": str(session.sandbox_id),
        "agent": session.agent,
        "repository": _repository_of(session),
    }


def _repository_of(session: Session) -> dict[str, Any] | None:
    try:
        return repository_json(session.repository)
    except SessionRepository.DoesNotExist:
        return None


@require_http_methods(["GET", "POST"])
@api_login_required
def sessions(request: SignedInRequest) -> HttpResponse:
    if request.method == "GET":
        items = (
            Session.objects.owned_by(request.user)
            .recent_first()
            .with_status()
            .select_related("repository")
        )
        listed = [
            {**session_json(s), "state": s.state, "unread": getattr(s, "unread", False)}
            for s in items
        ]
        return JsonResponse({"sessions": listed})
    body = json_body(request)
    if body is None:
        return error(400, "bad_json", "the body must be a JSON object")
    title = body.get("title", "")
    if not isinstance(title, str):
        return error(400, "invalid", "'title' must be a string")
    agent = body.get("agent", "")
    if not isinstance(agent, str):
        return error(400, "invalid", "'agent' must be a string, the id of an agent")
    repository, branch = body.get("repository"), body.get("branch")
    try:
        session = services.open_session(
            request.user, title, agent=agent, repository=repository or "", branch=branch or ""
        )
    except services.RepositoryRefused as exc:
        return error(400, exc.code, exc.message)
    except services.UnknownAgent as exc:
        return error(400, "unknown_agent", str(exc))
    except services.SessionLimit as exc:
        return error(409, "too_many_sessions", str(exc))
    except services.SessionError as exc:
        return error(503, "sandbox_unavailable", str(exc))
    session.running = False  # new: no prompt, so no turn yet (saves the query)
    if repository is not None:
        start_cloning(session.pk)
    elif session.sandbox.status == Sandbox.Status.RUNNING:
        start_agent_early(session.pk)
    return JsonResponse(session_json(session), status=201)


def start_agent_early(session_id: UUID) -> None:
    """Start the new session's agent in the background (from a sync view), as the page's
    `start_agent` does: an API client does not send it, and its first prompt would otherwise
    wait for the warm agent's `session/new` and the session's first checkpoint."""
    try:
        async_to_sync(services.start_agent_soon)(session_id)
    except Exception as exc:  # its first prompt starts it then
        logger.info("session %s: the agent did not start early: %s", session_id, exc)


def start_cloning(session_id: UUID) -> None:
    """Start the new session's clone now (from a sync view); what cannot start now starts at
    its first prompt, or when its page opens."""
    try:
        async_to_sync(services.run_command)(session_id, PrepareRepository())
    except Exception as exc:  # its first prompt (or its page) starts it then
        logger.info("session %s: the clone did not start yet: %s", session_id, exc)


@require_http_methods(["GET", "PATCH", "DELETE"])
@api_login_required
def session_detail(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    session = _own_session(request, session_id)
    if session is None:
        return error(404, "not_found", "no such session")
    if request.method == "DELETE":
        services.delete_session(session)
        return HttpResponse(status=204)
    if request.method == "PATCH":
        body = json_body(request)
        if body is None or not isinstance(body.get("title"), str):
            return error(400, "invalid", "send a JSON object with a 'title' string")
        try:
            services.set_session_title(session.pk, body["title"], "user")
        except services.SessionError as exc:
            return error(400, "invalid", str(exc))
        session.refresh_from_db()
    return JsonResponse({**session_json(session), "sandbox": sandbox_json(session.sandbox)})


@require_http_methods(["GET"])
@api_login_required
def session_events(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """Return stored events after `after` (the page's session load)."""
    session = _own_session(request, session_id)
    if session is None:
        return error(404, "not_found", "no such session")
    page = page_of(request, "after", MAX_EVENTS_PAGE, MAX_EVENTS_PAGE)
    if isinstance(page, JsonResponse):
        return page
    after, limit = page
    # The events are spliced in as the JSON text they are stored as: a long session's page
    # load must not decode and re-encode thousands of events. The workspace's host path is
    # replaced for people who are not staff (craft.workspace_paths).
    events = events_json_after(session.pk, after, limit + 1)
    scrub = workspace_paths.scrubber_for(request.user, session.sandbox, session.pk)
    if scrub is not None:
        events = [scrub(event) for event in events]
    rest = json.dumps(
        {
            "has_more": len(events) > limit,
            "last_seq": session.last_seq,
            "running": _running(session),
            "sandbox": sandbox_json(session.sandbox),
        }
    )
    body = '{"events":[' + ",".join(events[:limit]) + "]," + rest[1:]
    return HttpResponse(body, content_type="application/json")


@require_http_methods(["GET"])
@api_login_required
def session_event(request: SignedInRequest, session_id: UUID, seq: int) -> HttpResponse:
    """Return one stored event in full (what "Show all" fetches for a truncated event)."""
    session = _own_session(request, session_id)
    event = None if session is None else Event.objects.filter(session=session, seq=seq).first()
    if event is None:
        return error(404, "not_found", "no such event")
    assert session is not None
    body = json.dumps(
        {
            "seq": event.seq,
            "kind": event.kind,
            "data": event.data,
            "created_at": event.created_at.isoformat(),
        }
    )
    scrub = workspace_paths.scrubber_for(request.user, session.sandbox, session.pk)
    return HttpResponse(scrub(body) if scrub else body, content_type="application/json")


@require_http_methods(["GET", "POST", "DELETE"])
@api_login_required
def sandbox(request: SignedInRequest) -> HttpResponse:
    if request.method == "POST":
        started = sandbox_services.request_sandbox(request.user)
        if started.status == Sandbox.Status.TERMINATING:
            return error(409, "sandbox_terminating", "your sandbox is being stopped; try again")
        ready = started.status == Sandbox.Status.RUNNING
        return JsonResponse(sandbox_json(started), status=200 if ready else 202)
    current = Sandbox.objects.live().owned_by(request.user).first()
    if current is None:
        return error(404, "not_found", "you have no sandbox")
    if request.method == "DELETE":
        current = sandbox_services.terminate_sandbox(current)
    return JsonResponse(sandbox_json(current))


@require_http_methods(["GET"])
@api_login_required
def agents(request: SignedInRequest) -> HttpResponse:
    """Return the agents a new session can pick, and whether the caller can use each."""
    listed = [
        {"id": agent.id, "title": agent.title, "ready": not missing, "missing": missing}
        for agent, missing in credentials.agents_for(request.user)
    ]
    return JsonResponse({"agents": listed})


def credential_json(stored: credentials.Stored) -> dict[str, Any]:
    return {
        "name": stored.name,
        "hint": stored.hint,
        "updated_at": stored.updated_at.isoformat(),
        "readable": stored.readable,
    }


@require_http_methods(["GET"])
@api_login_required
def credential_list(request: SignedInRequest) -> HttpResponse:
    """Return the caller's stored credentials: names and hints, never values."""
    stored = credentials.credentials_of(request.user)
    return JsonResponse({"credentials": [credential_json(c) for c in stored]})


@sensitive_variables("body")
@require_http_methods(["PUT", "DELETE"])
@api_login_required
def credential_detail(request: SignedInRequest, name: str) -> HttpResponse:
    """Store or replace (`PUT {"value": ...}`) or delete one of the caller's credentials."""
    if request.method == "DELETE":
        if not credentials.delete_credential(request.user, name):
            return error(404, "not_found", f"you have no credential {name[:100]!r}")
        return HttpResponse(status=204)
    body = value_sent(request, "send a JSON object with a 'value' string")
    if isinstance(body, JsonResponse):
        return body
    try:
        stored = credentials.store_credential(request.user, name, body["value"])
    except credentials.CredentialError as exc:
        return error(400, "invalid_credential", str(exc))
    return JsonResponse(credential_json(stored))


def git_token_json(host: str, stored: git_tokens.Stored | None) -> dict[str, Any]:
    entry = git_hosts.hosts().get(host)
    return {
        "host": host,
        "kind": entry.kind if entry else None,
        "configured": entry is not None,
        "stored": stored is not None,
        "hint": stored.hint if stored else "",
        "login": stored.login if stored else "",
        "updated_at": stored.updated_at.isoformat() if stored else None,
        "readable": stored.readable if stored else None,
    }


# How each refusal of a token is answered: the host's failures are a bad gateway.
GIT_TOKEN_STATUS = {"host_api_error": 502}


@require_http_methods(["GET"])
@api_login_required
def git_token_list(request: SignedInRequest) -> HttpResponse:
    """Return the configured git hosts, each with what is stored of the caller's token (never
    the token), then tokens kept for hosts no longer configured (so that they can go)."""
    stored = {t.host: t for t in git_tokens.tokens_of(request.user)}
    listed = [git_token_json(host, stored.pop(host, None)) for host in sorted(git_hosts.hosts())]
    listed += [git_token_json(host, token) for host, token in sorted(stored.items())]
    return JsonResponse({"hosts": listed})


@sensitive_variables("body")
@require_http_methods(["GET", "PUT", "DELETE"])
@api_login_required
def git_token_detail(request: SignedInRequest, host: str) -> HttpResponse:
    """Read, store or replace (`PUT {"value": ...}`, checked with the host first), or delete
    the caller's token for `host` (a name, or name:port)."""
    host = host.lower()
    if request.method in ("GET", "DELETE"):
        stored = git_tokens.token_of(request.user, host)
        if stored is None or (
            request.method == "DELETE" and not git_tokens.delete_token(request.user, host)
        ):
            return error(404, "not_found", f"you have no token for {host[:255]!r}")
        if request.method == "DELETE":
            return HttpResponse(status=204)
        return JsonResponse(git_token_json(host, stored))
    body = value_sent(request, "send a JSON object with a 'value' string: the token")
    if isinstance(body, JsonResponse):
        return body
    try:
        stored = git_tokens.store_token(request.user, host, body["value"])
    except git_tokens.GitTokenError as exc:
        return error(GIT_TOKEN_STATUS.get(exc.code, 400), exc.code, exc.message)
    return JsonResponse(git_token_json(stored.host, stored))
