"""Pages: the chat page (sidebar of sessions, one session's shell) and its htmx pieces.

The transcript itself is rendered in the browser (static/craft/session/) from the JSON event
log, the same data every API client reads: see "One renderer" in docs/architecture.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from craft import credentials, git_hosts, git_tokens, services, workspace_paths
from craft.api.sessions import MAX_EVENTS_PAGE, start_cloning
from craft.http.requests import SignedInRequest
from craft.models import Session, SessionRepository
from craft.turns.repository import repository_json
from sandboxes import catalog
from sandboxes.models import Sandbox


def _own_session(request: SignedInRequest, session_id: UUID) -> Session:
    """Return the signed-in user's session; 404 for anyone else's (do not reveal it exists)."""
    session = Session.objects.one_of(request.user, session_id)
    if session is None:
        raise Http404("no such session")
    return session


def _current_sandbox(user: User) -> Sandbox | None:
    """Return the user's live sandbox, else the last one they had (to offer "Start again")."""
    sandboxes = Sandbox.objects.owned_by(user)
    return sandboxes.live().first() or sandboxes.order_by("-created_at").first()


def _list_context(request: SignedInRequest, current: Session | None) -> dict[str, object]:
    sessions = (
        Session.objects.owned_by(request.user)
        .recent_first()
        .with_status()
        .select_related("repository")
    )
    # The item's URL is built in the page from the list's, with the item's id for the zero id.
    return {"sessions": with_links(list(sessions)), "current": current, "zero_id": ZERO_ID}


ZERO_ID = UUID(int=0)


# The URLs of a session's item in the list, as `links` names them.
ITEM_LINKS = {"page": "session", "rename": "rename_session", "delete": "delete_session"}


def with_links(sessions: list[Session]) -> list[Session]:
    """Give each session the URLs its list item needs (`s.links.page`, `.rename`, `.delete`).

    Reversed once for the list rather than five times per item: the sidebar is rendered
    again after every turn's start and end, for every page its person has open, and
    reversing was a tenth of its time."""
    marker = str(ZERO_ID)
    patterns = {key: reverse(name, args=[marker]) for key, name in ITEM_LINKS.items()}
    for session in sessions:
        session.links = {  # type: ignore[attr-defined]
            key: url.replace(marker, str(session.pk)) for key, url in patterns.items()
        }
    return sessions


def _list_item(session: Session) -> Session:
    """Return the session as its item in the list shows it (status and links)."""
    (item,) = with_links(
        [Session.objects.with_status().select_related("repository").get(pk=session.pk)]
    )
    return item


def _page_context(request: SignedInRequest, session: Session | None) -> dict[str, object]:
    return {
        **_list_context(request, session),
        "sandbox": _current_sandbox(request.user),
        "session": session,
        # What "New session" offers: (agent, the keys the person still has to store), the
        # agent of their newest session chosen (the choice is not reset by each new session).
        "agents": credentials.agents_for(request.user),
        "last_agent": Session.objects.filter(owner=request.user)
        .order_by("-created_at")
        .values_list("agent", flat=True)
        .first(),
    }


def session_workspace(session: Session) -> str:
    """Return the session's workspace as its agent sees it (the agent's cwd), or ""."""
    return workspace_paths.workspace_path(session.sandbox, session.pk)


def _repository_name(url: str) -> str:
    """Return how a list shows a repository's URL: its path, "owner/name"."""
    path = url.split("://", 1)[-1].partition("/")[2].strip("/")
    return path.removesuffix(".git") or url


def _home(
    request: SignedInRequest, form: dict[str, str] | None = None, status: int = 200
) -> HttpResponse:
    """Render the home page: the welcome and its new-session form (with what was sent and why
    it was refused, when it was)."""
    return render(request, "craft/session.html", _home_context(request, form), status=status)


def _home_context(request: SignedInRequest, form: dict[str, str] | None) -> dict[str, object]:
    recent = services.recent_repositories(request.user)
    return {
        **_page_context(request, None),
        "recent_repositories": [(url, _repository_name(url)) for url in recent],
        **{f"form_{key}": value for key, value in (form or {}).items()},
    }


@require_GET
@login_required
def home(request: SignedInRequest) -> HttpResponse:
    return _home(request)


@require_GET
@login_required
def session_page(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """Render the session's page shell; the browser loads and renders its events."""
    session = _own_session(request, session_id)
    context = _page_context(request, session)
    try:
        repository: SessionRepository | None = session.repository
    except SessionRepository.DoesNotExist:
        repository = None
    if repository is not None:
        # What the page starts from; the log keeps it current (static/craft/session/fold.mjs).
        context.update(
            repository=repository, repository_json=json.dumps(repository_json(repository))
        )
    # The history the page will load first, preloaded by the browser while it fetches the
    # page's scripts (the script's first requests are exactly these).
    events_url = reverse("api_session_events", args=[session.pk])
    pages = range(0, session.last_seq, MAX_EVENTS_PAGE)
    context.update(
        running=session.running,
        # Only to show paths relative to it; people who are not staff never see the host's
        # path (craft.workspace_paths).
        workspace=workspace_paths.shown_workspace(request.user, session.sandbox, session.pk),
        page_size=MAX_EVENTS_PAGE,
        # Files over it are refused by the page before they are sent.
        upload_max_bytes=settings.CRAFT_UPLOAD_MAX_BYTES,
        # Which of the catalog's agents it talks to (shown when there is a choice).
        session_agent=getattr(catalog.agent(session.agent), "title", session.agent),
        # The empty session's hint names the demo agent's commands to that agent only.
        demo_agent=getattr(catalog.agent(session.agent), "is_demo", False),
        # Said as the page opens, not only once a message is refused for it.
        keys_missing=str(credentials.missing_in(session) or ""),
        history_pages=[f"{events_url}?after={a}&limit={MAX_EVENTS_PAGE}" for a in pages][:8],
    )
    return render(request, "craft/session.html", context)


@require_GET
@login_required
def sandbox_status(request: SignedInRequest) -> HttpResponse:
    """Render the sidebar's sandbox line (polled by htmx while it is provisioning)."""
    return render(
        request, "craft/_sandbox_status.html", {"sandbox": _current_sandbox(request.user)}
    )


@require_GET
@login_required
def session_list(request: SignedInRequest) -> HttpResponse:
    """Render the sidebar's list of sessions (refreshed by the page, see sidebar.js)."""
    current = None
    try:
        current_id = UUID(request.GET.get("current", ""))
    except ValueError:
        pass
    else:
        current = Session.objects.owned_by(request.user).filter(pk=current_id).first()
    return render(request, "craft/_session_list.html", _list_context(request, current))


@require_GET
@login_required
def session_list_item(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """Render one item of the sidebar's list: what the page fetches when its socket names the
    sessions that changed (sidebar.js). 404 once the session is gone (or not the person's):
    the page takes the item out."""
    session = (
        Session.objects.owned_by(request.user)
        .with_status()
        .select_related("repository")
        .filter(pk=session_id)
        .first()
    )
    if session is None:
        raise Http404("no such session")
    current = session if request.GET.get("current") == str(session.pk) else None
    return render(
        request, "craft/_session_item.html", {"s": with_links([session])[0], "current": current}
    )


@require_POST
@login_required
def new_session(request: SignedInRequest) -> HttpResponse:
    """Open a session: the sidebar's button (an untouched session is opened again rather
    than another made), or the home page's form, which may name a repository and a branch:
    its clone starts at once, and a repository the server will not take is shown in the form
    with the reason, nothing created."""
    agent = request.POST.get("agent", "")
    repository = (request.POST.get("recent") or request.POST.get("repository", "")).strip()
    branch = request.POST.get("branch", "").strip()
    if branch and not repository:
        return _refused_form(
            request, "Give the repository's address too, or leave the branch empty."
        )
    try:
        session = services.open_session(
            request.user,
            request.POST.get("title", ""),
            reuse_untouched=not repository,
            agent=agent,
            repository=repository,
            branch=branch,
        )
    except services.RepositoryRefused as exc:
        return _refused_form(request, f"No session was opened: {exc.message}")
    except services.SessionError as exc:
        # Too many sessions, or a sandbox being stopped; one that cannot start is shown on
        # the new session's page (it starts in the background).
        messages.error(request, f"No session was opened: {exc}.")
        return HttpResponseClientRedirect(reverse("home")) if request.htmx else redirect("home")
    if repository:
        start_cloning(session.pk)
    url = reverse("session", args=[session.pk])
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


def _refused_form(request: SignedInRequest, error: str) -> HttpResponse:
    """Answer a refused new session with its form again: what was sent, and why (422)."""
    form = {
        "repository": (request.POST.get("recent") or request.POST.get("repository", "")).strip(),
        "branch": request.POST.get("branch", "").strip(),
        "agent": request.POST.get("agent", ""),
        "error": error,
    }
    if request.htmx:
        context = _home_context(request, form)
        return render(request, "craft/_new_session_form.html", context, status=422)
    return _home(request, form, status=422)


@require_POST
@login_required
def rename_session(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    session = _own_session(request, session_id)
    current_url = (request.htmx.current_url or "") if request.htmx else ""
    current = session if str(session.pk) in current_url else None
    try:
        services.set_session_title(session.pk, request.POST.get("title", ""), "user")
    except services.SessionError as exc:
        if request.htmx:
            # The item again, its menu open, with the message (htmx swaps 422, see base.html).
            context = {"s": _list_item(session), "current": current, "rename_error": str(exc)}
            return render(request, "craft/_session_item.html", context, status=422)
        messages.error(request, str(exc))
    if request.htmx:
        context = {"s": _list_item(session), "current": current}
        return render(request, "craft/_session_item.html", context)
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


@dataclass
class KeyRow:
    """One credential on the keys page: what it is, who needs it, what is stored."""

    name: str
    label: str
    help: str
    agents: list[str]
    stored: credentials.Stored | None
    error: str = ""


def _key_rows(user: User, errors: dict[str, str] | None = None) -> list[KeyRow]:
    """Return every credential some catalog agent needs, plus the ones stored for agents no
    longer offered (so that they can be deleted), by name."""
    stored = {c.name: c for c in credentials.credentials_of(user)}
    rows: dict[str, KeyRow] = {}
    for agent in catalog.agents():
        for needed in agent.credentials:
            row = rows.setdefault(
                needed.name,
                KeyRow(needed.name, needed.label, needed.help, [], stored.get(needed.name)),
            )
            row.agents.append(agent.title)
    for name, kept in stored.items():
        rows.setdefault(name, KeyRow(name, name, "", [], kept))
    for name, message in (errors or {}).items():
        if name in rows:
            rows[name].error = message
    return sorted(rows.values(), key=lambda row: row.name)


@dataclass
class GitHostRow:
    """One git host on the keys page: what it is and what is stored of the person's token."""

    host: str
    kind: str  # "" for a host no longer configured
    stored: git_tokens.Stored | None
    error: str = ""

    @property
    def title(self) -> str:
        return KIND_TITLES.get(self.kind, "")


KIND_TITLES = {"github": "GitHub", "gitlab": "GitLab", "gitea": "Gitea or Forgejo"}


def _git_host_rows(user: User, errors: dict[str, str] | None = None) -> list[GitHostRow]:
    """Return the configured hosts, then the hosts no longer configured that the person still
    has a token for (so that it can be deleted)."""
    stored = {t.host: t for t in git_tokens.tokens_of(user)}
    rows = [
        GitHostRow(h.host, h.kind, stored.pop(h.host, None))
        for h in sorted(git_hosts.hosts().values(), key=lambda h: h.host)
    ]
    rows += [GitHostRow(host, "", token) for host, token in sorted(stored.items())]
    for row in rows:
        row.error = (errors or {}).get(row.host, "")
    return rows


def _keys_page(
    request: SignedInRequest,
    errors: dict[str, str] | None = None,
    status: int = 200,
    git_errors: dict[str, str] | None = None,
) -> HttpResponse:
    context = {
        "rows": _key_rows(request.user, errors),
        "agents": credentials.agents_for(request.user),
        "git_hosts": _git_host_rows(request.user, git_errors),
    }
    return render(request, "craft/keys.html", context, status=status)


@require_GET
@login_required
def keys(request: SignedInRequest) -> HttpResponse:
    """Render the person's keys: what each agent needs, what is stored (never the values)."""
    return _keys_page(request)


@sensitive_post_parameters("value")
@require_POST
@login_required
def store_key(request: SignedInRequest, name: str) -> HttpResponse:
    """Store or replace one of the person's keys; a refused value is not shown again."""
    try:
        credentials.store_credential(request.user, name, request.POST.get("value", ""))
    except credentials.CredentialError as exc:
        return _keys_page(request, {name: str(exc)}, status=422)
    messages.success(request, f"{name} is stored. Agents started from now on get it.")
    return redirect("keys")


@require_POST
@login_required
def delete_key(request: SignedInRequest, name: str) -> HttpResponse:
    if credentials.delete_credential(request.user, name):
        messages.success(request, f"{name} is deleted.")
    return redirect("keys")


@sensitive_post_parameters("value")
@require_POST
@login_required
def store_git_token(request: SignedInRequest, host: str) -> HttpResponse:
    """Check one of the person's git tokens with its host, then store or replace it; a token
    refused (or that could not be checked) is said, not stored and not shown again."""
    try:
        stored = git_tokens.store_token(request.user, host, request.POST.get("value", ""))
    except git_tokens.GitTokenError as exc:
        return _keys_page(request, git_errors={host.lower(): exc.message}, status=422)
    messages.success(
        request, f"Your token for {stored.host} is stored (it belongs to {stored.login})."
    )
    return redirect(reverse("keys") + "#git-hosts")


@require_POST
@login_required
def delete_git_token(request: SignedInRequest, host: str) -> HttpResponse:
    if git_tokens.delete_token(request.user, host):
        messages.success(request, f"Your token for {host.lower()} is deleted.")
    return redirect(reverse("keys") + "#git-hosts")


def signin_locked(request: HttpRequest, *args: object) -> HttpResponse:
    """Render the sign-in page saying that signing in is locked for a while (429).

    django-axes calls it for a sign-in it refused or the failure that reached a limit (see
    craft.http.login_throttle); what else it passes differs between its sync and async paths, so
    only the request is used.
    """
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")})
    context = {
        "form": form,
        "locked_minutes": math.ceil(settings.CRAFT_LOGIN_COOLOFF_SECONDS / 60),
        "next": request.POST.get("next", ""),
    }
    return render(request, "registration/login.html", context, status=429)
