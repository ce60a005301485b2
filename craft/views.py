"""Pages: the session list and a session's page."""

from __future__ import annotations

from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from sandboxes.models import Sandbox

from . import services
from .models import Session
from .transcript import build_transcript


def _own_session(request: HttpRequest, session_id: UUID) -> Session:
    """Return the signed-in user's session; 404 for anyone else's (do not reveal it exists)."""
    return get_object_or_404(
        Session.objects.select_related("sandbox"), pk=session_id, owner=request.user
    )


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    sessions = Session.objects.owned_by(request.user).recent_first()
    sandbox = Sandbox.objects.live().owned_by(request.user).first()
    return render(request, "craft/home.html", {"sessions": sessions, "sandbox": sandbox})


@require_POST
@login_required
def new_session(request: HttpRequest) -> HttpResponse:
    try:
        session = services.open_session(request.user, request.POST.get("title", ""))
    except services.SessionError as exc:
        messages.error(request, str(exc))
        return redirect("home")
    return redirect("session", session_id=session.pk)


@login_required
def session_page(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = _own_session(request, session_id)
    if request.method == "POST":
        try:
            services.run_prompt(session, request.POST.get("text", ""))
        except services.SessionError as exc:
            messages.error(request, str(exc))
        return redirect("session", session_id=session.pk)
    blocks = build_transcript(session.events.order_by("seq"))
    return render(request, "craft/session.html", {"session": session, "blocks": blocks})
