"""The search API (docs/http-api.md, "Search"): a person's sessions by title and text, and the
messages of one session (craft.storage.search)."""

from __future__ import annotations

from uuid import UUID

from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_http_methods

from craft.api.sessions import api_login_required, error
from craft.http.requests import SignedInRequest
from craft.models import Session
from craft.storage import search


def _query(request: SignedInRequest) -> str | None:
    query = request.GET.get("q", "")
    if len(query) > search.MAX_QUERY_CHARS or not search.words_of(query):
        return None
    return query


@require_http_methods(["GET"])
@api_login_required
def sessions(request: SignedInRequest) -> HttpResponse:
    """`?q=`: the sessions whose title or text has every word of it (newest first)."""
    query = _query(request)
    if query is None:
        return error(400, "invalid", f"search for a word or more (at most "
                                     f"{search.MAX_QUERY_CHARS} characters): ?q=")  # fmt: skip
    return JsonResponse({"results": search.search_sessions(request.user, query)})


@require_http_methods(["GET"])
@api_login_required
def in_session(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """`?q=`: the session's prompts, replies and tool cards that have every word of it."""
    if Session.objects.one_of(request.user, session_id) is None:
        return error(404, "not_found", "no such session")
    query = _query(request)
    if query is None:
        return error(400, "invalid", f"search for a word or more (at most "
                                     f"{search.MAX_QUERY_CHARS} characters): ?q=")  # fmt: skip
    found = search.search_session(request.user, session_id, query)
    return JsonResponse({"matches": [match.__dict__ for match in found]})
