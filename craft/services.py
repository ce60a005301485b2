"""Every state change of a chat session goes through these verbs.

The session's life (`open_session`, `set_session_title`, `delete_session`) blocks (ORM,
sandbox and process calls): async callers wrap it in `sync_to_async`. What happens in the
session is async: each checked command (craft.commands) goes through `run_command` to the
worker that runs the session's agent (`fork_session` and `start_agent_soon` do more around
it). Sandboxes are reached only through `sandboxes.services`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import uuid

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from craft import git_hosts
from craft.cluster import forwarding
from craft.commands import Fork, ForkRequest, SessionCommand, StartAgent
from craft.errors import Refused, RepositoryRefused, SessionError, SessionLimit, UnknownAgent
from craft.live import delivery, status
from craft.models import Session, SessionRepository, TurnRecord
from craft.storage.db import db_sync_to_async
from craft.storage.normalise import clean_title
from craft.storage.titles import set_session_title
from craft.turns.registry import runners
from craft.turns.repository import branch_name
from sandboxes import catalog
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

DEFAULT_TITLE = "New session"


__all__ = [
    "RepositoryRefused",
    "SessionError",
    "SessionLimit",
    "UnknownAgent",
    "delete_session",
    "fork_session",
    "mark_seen",
    "open_session",
    "run_command",
    "set_session_title",
    "start_agent_soon",
]


def open_session(
    user: User,
    title: str = "",
    *,
    reuse_untouched: bool = False,
    agent: str = "",
    repository: str = "",
    branch: str = "",
) -> Session:
    """Create a session in the user's sandbox, at once, talking to the catalog's `agent`
    (default: the catalog's first) for its whole life.

    A sandbox that is not running yet is provisioned in the background (see
    `sandbox_services.request_sandbox`): the session's page follows its progress, and its
    agent starts, in the session's own workspace, at the first prompt after it is ready.
    With `reuse_untouched` (the page's "New session") and no title, the user's newest session
    that nothing happened in yet (no event, the default title, in that sandbox) is returned
    instead of a new one, so that pressing the button again piles up no empty sessions.
    With `repository` (an https URL on one of the server's git hosts) the workspace becomes a
    clone of it (of `branch`, default the remote's default branch) on a branch of the
    session's own, made before its first turn (`PrepareRepository` starts it); such a session
    is always a new one. RepositoryRefused says why a repository or branch is not taken.
    Raises UnknownAgent for an agent the catalog does not offer, SessionLimit when the user
    has CRAFT_MAX_SESSIONS_PER_USER sessions (concurrent requests can pass it by a few),
    SessionError when the sandbox is being stopped.
    """
    chosen = catalog.agent(agent) if agent else catalog.default_agent()
    if chosen is None:
        offered = ", ".join(a.id for a in catalog.agents())
        raise UnknownAgent(f"there is no agent {agent[:64]!r} here (offered: {offered})")
    cloned = _repository_of(repository, branch) if repository or branch else None
    sandbox = None
    if reuse_untouched and not clean_title(title) and cloned is None:
        sandbox = sandbox_services.request_sandbox(user)
        untouched = (
            Session.objects.owned_by(user)
            .filter(sandbox=sandbox, last_seq=0, title=DEFAULT_TITLE, agent=chosen.id)
            .order_by("-created_at")
            .first()
        )
        if untouched is not None:
            return untouched
    limit = settings.CRAFT_MAX_SESSIONS_PER_USER
    if limit and Session.objects.owned_by(user).count() >= limit:
        raise SessionLimit(
            f"you have {limit} sessions, the most one person can have: delete some first"
        )
    sandbox = sandbox or sandbox_services.request_sandbox(user)
    if sandbox.status not in (Sandbox.Status.RUNNING, Sandbox.Status.PROVISIONING):
        # Terminating (a failed one was claimed for provisioning above).
        raise SessionError("your sandbox is being stopped: open a session again in a moment")
    with transaction.atomic():
        session = Session.objects.create(
            owner=user, sandbox=sandbox, title=clean_title(title) or DEFAULT_TITLE, agent=chosen.id
        )
        if cloned is not None:
            url, base = cloned
            SessionRepository.objects.create(
                session=session, url=url.url, host=url.host.host, path=url.path, base=base,
                branch=branch_name(clean_title(title), session.pk),
            )  # fmt: skip
    status.sessions_changed(user.pk, session.pk)
    return session


# A branch name git takes (`git check-ref-format --branch`), more strictly: no control
# character, space or `~^:?*[\`, no `..`, `@{`, `//`, no leading `-` or `/`, no `.lock` end.
_BRANCH = re.compile(
    r"(?!-)(?!/)(?!.*(?:\.\.|@\{|//|/\.|\.lock$|/$|\.$))"
    r"[^\x00-\x20\x7f~^:?*\[\\]{1,200}"
)


def _repository_of(repository: object, branch: object) -> tuple[git_hosts.RepositoryUrl, str]:
    """Check a new session's repository and branch; raise RepositoryRefused."""
    if not isinstance(repository, str) or not repository.strip():
        raise RepositoryRefused("invalid_repository_url", "'repository' must be an https URL")
    if not isinstance(branch, str) or (branch and not _BRANCH.fullmatch(branch)):
        raise RepositoryRefused("invalid_branch", "'branch' must be the name of a branch")
    try:
        url = git_hosts.parse_repository_url(repository.strip())
    except git_hosts.GitHostError as exc:
        raise RepositoryRefused(exc.code, exc.message) from None
    return url, branch


def recent_repositories(user: User, limit: int = 8) -> list[str]:
    """Return the URLs of the repositories of the user's latest sessions, newest first."""
    urls = (
        SessionRepository.objects.filter(session__owner=user)
        .order_by("-created_at")
        .values_list("url", flat=True)
    )
    return list(dict.fromkeys(urls[: limit * 4]))[:limit]


def delete_session(session: Session) -> None:
    """Stop the session's agent, remove its workspace, then delete it and its events."""
    try:
        sandbox_services.remove_session_workspace(session.sandbox, session.pk)
    except SandboxError as exc:
        # The record goes anyway: a leftover folder is better than an undeletable session.
        logger.warning("removing workspace of session %s failed: %s", session.pk, exc)
    with transaction.atomic():
        session_id = session.pk
        session.delete()
        transaction.on_commit(
            lambda: delivery.tell_session(session_id, {"type": "session.deleted"})
        )
        status.sessions_changed(session.owner_id, session_id)
    runners.forget(session_id)


def mark_seen(user: User, session_id: uuid.UUID) -> None:
    """Record that the user has the session's page in view now: the turns that ended so far
    are read. Tells the user's pages when that changed what their list shows."""
    sessions = Session.objects.owned_by(user).filter(pk=session_id)
    before = sessions.values_list("seen_at", flat=True).first()
    if before is None:
        return
    now = timezone.now()
    sessions.update(seen_at=now)
    ended = TurnRecord.objects.filter(session_id=session_id, ended_at__gt=before, ended_at__lte=now)
    if ended.exists():
        status.sessions_changed(user.pk, session_id)


# --- A session's commands (async, on the event loop) -----------------------------------------


async def run_command(session_id: uuid.UUID, command: SessionCommand) -> None:
    """Carry out a checked command (craft.commands: each command's class says what it does
    and what refuses it) in the session: route it to the worker that owns the session's agent
    (craft.cluster.forwarding), this one or another, and return once it is carried out there
    (a prompt: stored, and its turn started or queued). Raises Refused with the error for the
    client (when the server shuts down, too)."""
    await forwarding.route(session_id, command)


# Agents being started in the background (`start_agent_soon`), held until they are done.
_starting: set[asyncio.Task[None]] = set()


async def start_agent_soon(session_id: uuid.UUID) -> None:
    """Start the session's agent in the background, as `StartAgent` does, and return at
    once: a session created through the API, whose client sends no `start_agent`, then finds
    its agent started (the warm agent's `session/new` done) and its first checkpoint taken
    when its first prompt comes. A start that fails is only logged: the first prompt starts
    the agent again, and stores why."""
    task = asyncio.get_running_loop().create_task(
        _start_quietly(session_id), context=contextvars.Context()
    )
    _starting.add(task)
    task.add_done_callback(_starting.discard)


async def _start_quietly(session_id: uuid.UUID) -> None:
    try:
        await run_command(session_id, StartAgent())
    except (Refused, Session.DoesNotExist) as exc:
        logger.info("session %s: the agent did not start ahead of a prompt: %s", session_id, exc)
    except Exception:
        logger.exception("session %s: starting the agent ahead of a prompt failed", session_id)


async def fork_session(session: Session, request: ForkRequest) -> uuid.UUID:
    """Make a new session of the same owner, sandbox and agent from `session` as it was just
    after turn `request.seq` (or just before it): its conversation (the agent's next session
    is given the transcript) and its workspace (docs/workbench.md); return its id (its
    first prompt, the request's `text`, is the caller's to post). Carried out by the source's
    runner between turns: refused `turn_running` while one runs, `invalid` for a seq that is
    no turn of the session; SessionLimit at CRAFT_MAX_SESSIONS_PER_USER."""
    limit = settings.CRAFT_MAX_SESSIONS_PER_USER
    if limit and await _session_count(session.owner_id) >= limit:
        raise SessionLimit(
            f"you have {limit} sessions, the most one person can have: delete some first"
        )
    new_id = uuid.uuid4()
    await run_command(session.pk, Fork(request.seq, str(new_id), request.before))
    status.tell_user(session.owner_id, status.SESSIONS_CHANGED, session=str(new_id))
    return new_id


@db_sync_to_async
def _session_count(owner_id: int) -> int:
    return Session.objects.filter(owner_id=owner_id).count()
