"""Going back in a conversation over HTTP: fork a session from a turn, rewind it to one.

Only the session's owner (someone else's session is 404, as everywhere in the API); carried
out by the session's runner between turns (`craft.turns.going_back`).
"""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_http_methods

from craft import services
from craft.api.sessions import error, owned_session_and_body
from craft.commands import Prompt, Rewind, parse_fork, parse_turn_seq
from craft.errors import Refused
from craft.http.requests import SignedInRequest

# Refusals, as HTTP statuses (others: 400).
STATUS = {
    "turn_running": 409,
    "nothing_to_rewind": 409,
    "too_many_sessions": 409,
    "not_empty": 409,
    "no_checkpoint": 404,
    "not_found": 404,
    "too_large": 413,
    "sandbox_unavailable": 503,
    "workspace_unavailable": 503,
    "unavailable": 503,
    "shutting_down": 503,
}


@require_http_methods(["POST"])
async def fork(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """`{"seq": N}`: a new session with the conversation and the workspace as they were just
    after turn N (its user_message's seq), or just before it with `"before": true`; with
    `"text"`, that is the new session's first prompt (an earlier message, edited): 201
    `{"id"}`."""
    owned = await owned_session_and_body(request, session_id)
    if isinstance(owned, HttpResponse):
        return owned
    session, body = owned
    try:
        asked = parse_fork(body)
        new_id = await services.fork_session(session, asked)
    except services.SessionLimit as exc:
        return error(409, "too_many_sessions", str(exc))
    except Refused as refused:
        return error(STATUS.get(refused.code, 400), refused.code, refused.message)
    answer: dict[str, Any] = {"id": str(new_id)}
    if asked.text:
        # The fork exists whatever happens to its first prompt: a refusal is told beside it.
        try:
            await services.run_command(new_id, Prompt(uuid.uuid4().hex, asked.text))
        except Refused as refused:
            answer["prompt_error"] = {"code": refused.code, "message": refused.message}
    return JsonResponse(answer, status=201)


@require_http_methods(["POST"])
async def rewind(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """`{"seq": N}`: the workspace and the conversation back to just after turn N; the later
    turns set aside (a `rewound` event). 200 `{"seq": N}` once the event is stored."""
    owned = await owned_session_and_body(request, session_id)
    if isinstance(owned, HttpResponse):
        return owned
    session, body = owned
    try:
        seq = parse_turn_seq(body)
        await services.run_command(session.pk, Rewind(seq))
    except Refused as refused:
        return error(STATUS.get(refused.code, 400), refused.code, refused.message)
    return JsonResponse({"seq": seq})
