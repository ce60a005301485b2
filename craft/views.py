"""Pages: the chat page (sidebar of sessions, one session's transcript) and its htmx pieces."""

from __future__ import annotations

from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from sandboxes.models import Sandbox

from . import services
from .http import SignedInRequest
from .models import Session
from .runner import runners
from .transcript import build_transcript


def _own_session(request: SignedInRequest, session_id: UUID) -> Session:
    """Return the signed-in user's session; 404 for anyone else's (do not reveal it exists)."""
    return get_object_or_404(
        Session.objects.select_related("sandbox"), pk=session_id, owner=request.user
    )


def _page_context(request: SignedInRequest, session: Session | None) -> dict[str, object]:
    return {
        "sessions": Session.objects.owned_by(request.user).recent_first(),
        "sandbox": session.sandbox
        if session is not None
        else Sandbox.objects.live().owned_by(request.user).first(),
        "session": session,
    }


@require_GET
@login_required
def home(request: SignedInRequest) -> HttpResponse:
    return render(request, "craft/session.html", _page_context(request, None))


@require_GET
@login_required
def session_page(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    session = _own_session(request, session_id)
    events = list(session.events.order_by("seq"))
    context = _page_context(request, session)
    context.update(
        blocks=build_transcript(events),
        last_seq=events[-1].seq if events else 0,
        running=runners.is_running(session.pk),
    )
    return render(request, "craft/session.html", context)


@require_GET
@login_required
def sandbox_status(request: SignedInRequest) -> HttpResponse:
    """Render the sidebar's sandbox line (polled by htmx while it is provisioning)."""
    sandbox = Sandbox.objects.live().owned_by(request.user).first()
    return render(request, "craft/_sandbox_status.html", {"sandbox": sandbox})


@require_POST
@login_required
def new_session(request: SignedInRequest) -> HttpResponse:
    try:
        session = services.open_session(request.user, request.POST.get("title", ""))
    except services.SessionError as exc:
        messages.error(request, str(exc))
        return HttpResponseClientRedirect(reverse("home")) if request.htmx else redirect("home")
    url = reverse("session", args=[session.pk])
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@require_POST
@login_required
def rename_session(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    session = _own_session(request, session_id)
    try:
        session = services.rename_session(session, request.POST.get("title", ""))
    except services.SessionError as exc:
        if request.htmx:
            return HttpResponse(str(exc), status=422)
        messages.error(request, str(exc))
    if request.htmx:
        current_url = request.htmx.current_url or ""
        current = session if str(session.pk) in current_url else None
        return render(request, "craft/_session_item.html", {"s": session, "current": current})
    return redirect("session", session_id=session.pk)


@require_POST
@login_required
def delete_session(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    session = _own_session(request, session_id)
    services.delete_session(session)
    if request.htmx:
        if str(session_id) in (request.htmx.current_url or ""):
            return HttpResponseClientRedirect(reverse("home"))
        return HttpResponse("")  # the list item swaps itself out
    return redirect("home")
