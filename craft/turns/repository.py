"""A session's repository, for its runner: cloned into its workspace before its first turn,
then committed, pushed, updated and offered as a pull request (docs/repositories.md).

The git work itself runs in the sandbox (`sandboxes.repository`), on threads of its own here
(`git_calls`: a clone takes minutes, never a database or agent thread); the host's API is
called from those threads too (`craft.host_api`). What happens is stored in the session's log
under the runner's lease, like everything else of the session: `repository_status` while the
clone is made (`cloning` with git's progress, `setting_up` with the set-up's output, `ready`
or `failed`), then `repository_committed`, `repository_pushed`, `repository_updated`,
`pull_request_opened` and `pull_request_updated`.

The clone is made once: the row's status says how far it got. A clone cut short (the server
stopped, the worker died) is made again from an empty workspace by whichever worker runs the
session next; a failed one stays failed, and the session goes on in its empty workspace.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from craft import git_hosts, git_tokens, host_api
from craft.errors import Refused
from craft.models import Event, Session, SessionRepository
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import Stored
from craft.turns.records import PREPARING
from sandboxes import catalog
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox
from sandboxes.repository import GitRefused, Remote, Repository

logger = logging.getLogger(__name__)

T = TypeVar("T")
Append = Callable[[list[tuple[str, dict[str, Any]]]], Awaitable[Stored | None]]

git_calls = ThreadPoolExecutor(max_workers=8, thread_name_prefix="craft-git")
# Progress and set-up output are stored at most this often (a long clone is minutes long).
PROGRESS_EVERY_SECONDS = 1.0
# How much of a set-up's output the log keeps, in all (its end is in the `ready` event).
MAX_SETUP_OUTPUT_CHARS = 64 * 1024
# A pull request's state is read from its host again when asked and older than this.
PULL_REQUEST_FRESH_SECONDS = 30.0
SANDBOX_POLL_SECONDS = 0.5
SETUP_SCRIPT = ".craft/setup.sh"


def branch_name(title: str, session_id: UUID) -> str:
    """Return the session's own branch: `craft/<short title>-<id>`."""
    words = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:32].strip("-")
    if not words or words == "new-session":
        words = "session"
    return f"craft/{words}-{session_id.hex[:8]}"


async def in_thread(func: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(git_calls, partial(func, *args))


async def repository_of(sandbox: Sandbox, session_id: UUID) -> Repository:
    """Return the session's repository, got on a thread: the backend looks at the sandbox's
    folder (and installs its tools the first time), which the event loop must not wait for."""
    return await in_thread(sandbox_services.session_repository, sandbox, session_id)


class SessionRepositoryWork:
    """The repository work of one session's runner (all methods run on the event loop)."""

    def __init__(
        self, session_id: UUID, append: Append, first_checkpoint: Callable[[], Awaitable[None]]
    ) -> None:
        self.session_id = session_id
        self._append = append
        self._first_checkpoint = first_checkpoint
        self._preparing: asyncio.Task[None] | None = None
        self._prepared = False  # a preparation ran to its end here: none is started again
        self._ready: Callable[[], None] = lambda: None

    @property
    def preparing(self) -> bool:
        return self._preparing is not None and not self._preparing.done()

    def prepare(self, ready: Callable[[], None]) -> None:
        """Make the clone in the background if it is not made (nor being made here); call
        `ready` once it is ready or failed."""
        self._ready = ready
        if not self.preparing and not self._prepared:
            self._preparing = asyncio.get_running_loop().create_task(self._prepare_logged())

    async def close(self) -> None:
        """Stop a clone being made here (the lease was lost, the server stops): the next owner
        makes it again."""
        if self._preparing is not None and not self._preparing.done():
            self._preparing.cancel()
            await asyncio.gather(self._preparing, return_exceptions=True)

    async def _prepare_logged(self) -> None:
        try:
            await self._prepare()
        except asyncio.CancelledError:
            raise  # stopped (the lease was lost, the server stops): made again by the next
        except Exception:
            logger.exception("session %s: preparing its repository failed", self.session_id)
        # Once made (or failed) here, a row that says `cloning` again is another runner's:
        # this one would only clear and clone the workspace under it.
        self._prepared = True
        self._ready()

    async def _prepare(self) -> None:
        row = await _row(self.session_id)
        if row is None or row.status not in PREPARING:
            return
        sandbox = await self._running_sandbox()
        if sandbox is None:
            return
        if row.status != SessionRepository.Status.PENDING:
            # Cut short earlier: made again from an empty workspace.
            await db_sync_to_async(sandbox_services.remove_session_workspace)(
                sandbox, self.session_id
            )
        try:
            remote = await db_sync_to_async(_remote)(row)
        except (git_hosts.GitHostError, git_tokens.GitTokenError) as exc:
            await self._failed(exc.code, exc.message)
            return
        await self._status(SessionRepository.Status.CLONING, {"url": row.url, "branch": row.branch,
                                                               "base": row.base})  # fmt: skip
        progress = _Progress(asyncio.get_running_loop(), self._progress_event)
        repository = await repository_of(sandbox, self.session_id)
        try:
            cloned = await in_thread(
                partial(
                    repository.clone,
                    remote,
                    base=row.base or None,
                    branch_name=row.branch,
                    progress=progress.put,
                    max_bytes=settings.CRAFT_CLONE_MAX_BYTES,
                    timeout=settings.CRAFT_CLONE_TIMEOUT_SECONDS,
                )
            )
        except GitRefused as refused:
            await progress.close()
            await self._failed(refused.code, str(refused))
            return
        except SandboxError as exc:
            await progress.close()
            await self._failed("git_failed", str(exc))
            return
        await progress.close()
        await _update(self.session_id, base=cloned.base, branch=cloned.branch,
                      commit=cloned.commit)  # fmt: skip
        setup = await self._setup(repository, sandbox, row)
        # The state before the first turn, recorded now: a checkpoint of a large clone takes
        # seconds, which its first prompt would otherwise wait for.
        await self._first_checkpoint()
        await _update(self.session_id, status=SessionRepository.Status.READY, detail="")
        ready: dict[str, Any] = {
            "status": "ready", "commit": cloned.commit, "base": cloned.base,
            "branch": cloned.branch, "setup": setup,
        }  # fmt: skip
        await self._append([("repository_status", ready)])

    async def _running_sandbox(self) -> Sandbox | None:
        """Wait for the session's sandbox to run (at most the provisioning timeout); mark the
        clone failed and return None if it does not."""
        deadline = time.monotonic() + settings.CRAFT_SANDBOX_PROVISIONING_TIMEOUT
        while True:
            sandbox = await _sandbox(self.session_id)
            if sandbox.status == Sandbox.Status.RUNNING:
                return sandbox
            if sandbox.status != Sandbox.Status.PROVISIONING or time.monotonic() > deadline:
                why = f": {sandbox.error}" if sandbox.error else ""
                await self._failed("sandbox_unavailable", f"your sandbox is {sandbox.status}{why}")
                return None
            await asyncio.sleep(SANDBOX_POLL_SECONDS)

    async def _setup(
        self, repository: Repository, sandbox: Sandbox, row: SessionRepository
    ) -> dict[str, Any] | None:
        """Run the repository's set-up, if it names one; return what the `ready` event says
        of it (None: there was none)."""
        host = git_hosts.hosts().get(row.host)
        command = host.setup_for(row.path) if host is not None else None
        if command is None and not await in_thread(_has_setup_script, sandbox, self.session_id):
            return None
        shown = command or SETUP_SCRIPT
        await self._status(SessionRepository.Status.SETTING_UP, {"command": shown})
        output = _Output(asyncio.get_running_loop(), self._output_event)
        try:
            run = await in_thread(
                partial(
                    repository.setup,
                    command,
                    timeout=settings.CRAFT_SETUP_TIMEOUT_SECONDS,
                    output=output.put,
                )
            )
        except SandboxError as exc:
            await output.close()
            return {"command": shown, "ok": False, "exit_code": None, "timed_out": False,
                    "tail": str(exc)}  # fmt: skip
        await output.close()
        ok = run.ran and run.exit_code == 0 and not run.timed_out
        return {"command": shown, "ok": ok, "exit_code": run.exit_code,
                "timed_out": run.timed_out, "tail": "" if ok else run.tail}  # fmt: skip

    async def _status(self, status: str, data: dict[str, Any]) -> None:
        await _update(self.session_id, status=status)
        await self._append([("repository_status", {"status": status, **data})])

    async def _progress_event(self, steps: list[dict[str, Any]]) -> None:
        await self._append(
            [("repository_status", {"status": "cloning", "progress": step}) for step in steps]
        )

    async def _output_event(self, texts: list[str]) -> None:
        await self._append(
            [("repository_status", {"status": "setting_up", "output": text}) for text in texts]
        )

    async def _failed(self, code: str, reason: str) -> None:
        await _update(self.session_id, status=SessionRepository.Status.FAILED, failure=code,
                      detail=reason)  # fmt: skip
        await self._append([("repository_status", {"status": "failed", "code": code,
                                                   "reason": reason})])  # fmt: skip

    # --- shipping the work ----------------------------------------------------------------

    async def commit(self, message: str) -> str:
        """Commit the workspace's changes to the session's branch; return the commit."""
        row, sandbox = await self._ready_row()
        user, drafted = await db_sync_to_async(commit_draft)(self.session_id)
        repository = await repository_of(sandbox, self.session_id)
        name = user.get_full_name() or user.username
        email = user.email or f"{user.username}@users.craft.invalid"
        commit = await self._git(
            partial(repository.commit, message.strip() or drafted, name=name, email=email)
        )
        title = (message.strip() or drafted).splitlines()[0]
        await self._append([("repository_committed", {"commit": commit, "branch": row.branch,
                                                      "message": title})])  # fmt: skip
        return commit

    async def push(self) -> tuple[str, str]:
        """Push the session's branch; return it and the commit pushed."""
        row, sandbox = await self._ready_row()
        return await self._push(row, sandbox)

    async def _push(self, row: SessionRepository, sandbox: Sandbox) -> tuple[str, str]:
        remote = await self._remote(row)
        repository = await repository_of(sandbox, self.session_id)
        timeout = settings.CRAFT_CLONE_TIMEOUT_SECONDS
        head = await self._git(partial(repository.push, remote, row.branch, timeout=timeout))
        await _update(self.session_id, pushed=head)
        await self._append([("repository_pushed", {"branch": row.branch, "head": head})])
        return row.branch, head

    async def update(self) -> tuple[str, list[str]]:
        """Fetch the base branch and merge it in; return the head and the files in conflict."""
        row, sandbox = await self._ready_row()
        remote = await self._remote(row)
        repository = await repository_of(sandbox, self.session_id)
        timeout = settings.CRAFT_CLONE_TIMEOUT_SECONDS
        updated = await self._git(partial(repository.update, remote, row.base, timeout=timeout))
        await self._append([("repository_updated", {"head": updated.head, "base": row.base,
                                                    "conflicts": updated.conflicts})])  # fmt: skip
        return updated.head, updated.conflicts

    async def open_pull_request(self, title: str, body: str, link: str) -> host_api.PullRequest:
        """Push the branch if it moved, then open its pull request (or find the open one)."""
        row, sandbox = await self._ready_row()
        repository = await repository_of(sandbox, self.session_id)
        state = await self._git(partial(repository.state, row.base))
        if state.head != row.pushed:
            await self._push(row, sandbox)
        host, token = await db_sync_to_async(_host_and_token)(row)
        drafted_title, drafted_body = await db_sync_to_async(pull_request_draft)(
            self.session_id, link
        )
        opened = await self._host(
            partial(
                host_api.open_pull_request,
                host,
                row.path,
                token,
                head=row.branch,
                base=row.base,
                title=title.strip() or drafted_title,
                body=body.strip() or drafted_body,
            )
        )
        await _update(self.session_id, pull_request_url=opened.url,
                      pull_request_number=opened.number, pull_request_state=opened.state,
                      pull_request_checked_at=timezone.now())  # fmt: skip
        await self._append([("pull_request_opened", {"url": opened.url, "number": opened.number,
                                                     "state": opened.state})])  # fmt: skip
        return opened

    async def refresh_pull_request(self, *, stale_only: bool = True) -> None:
        """Read the pull request's state from its host; store `pull_request_updated` when it
        changed. Nothing when there is none, or it was read a moment ago."""
        row = await _row(self.session_id)
        if row is None or row.pull_request_number is None:
            return
        checked = row.pull_request_checked_at
        fresh = timezone.now() - timedelta(seconds=PULL_REQUEST_FRESH_SECONDS)
        if stale_only and checked is not None and checked > fresh:
            return
        host, token = await db_sync_to_async(_host_and_token)(row)
        now = await self._host(
            partial(host_api.read_pull_request, host, row.path, token, row.pull_request_number)
        )
        await _update(self.session_id, pull_request_state=now.state,
                      pull_request_url=now.url, pull_request_checked_at=timezone.now())  # fmt: skip
        if now.state != row.pull_request_state:
            await self._append([("pull_request_updated", {"url": now.url, "number": now.number,
                                                          "state": now.state})])  # fmt: skip

    async def _ready_row(self) -> tuple[SessionRepository, Sandbox]:
        row = await _row(self.session_id)
        if row is None:
            raise Refused("no_repository", "this session is not on a repository")
        if row.status != SessionRepository.Status.READY:
            raise Refused("repository_not_ready", _not_ready(row))
        sandbox = await _sandbox(self.session_id)
        if sandbox.status != Sandbox.Status.RUNNING:
            raise Refused("sandbox_unavailable", f"your sandbox is {sandbox.status}")
        return row, sandbox

    async def _remote(self, row: SessionRepository) -> Remote:
        try:
            return await db_sync_to_async(_remote)(row)
        except (git_hosts.GitHostError, git_tokens.GitTokenError) as exc:
            raise Refused(exc.code, exc.message) from None

    @staticmethod
    async def _git(call: Callable[[], T]) -> T:
        try:
            return await in_thread(call)
        except GitRefused as refused:
            raise Refused(refused.code, str(refused)) from None
        except SandboxError as exc:
            raise Refused("git_failed", str(exc)) from None

    @staticmethod
    async def _host(call: Callable[[], T]) -> T:
        try:
            return await in_thread(call)
        except host_api.HostApiError as exc:
            raise Refused(exc.code, exc.message) from None


def _not_ready(row: SessionRepository) -> str:
    if row.status == SessionRepository.Status.FAILED:
        return f"the repository could not be cloned: {row.detail}"
    return "the repository is still being cloned"


class _Progress:
    """Git's progress, from the clone's thread to the log: at most every second, the latest
    word of each phase (a phase that ended meanwhile keeps its last one)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, store: Callable[[list[Any]], Awaitable[None]]
    ):
        self._loop = loop
        self._store = store
        self._pending: list[Any] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def put(self, item: Any) -> None:
        """Called from any thread."""
        self._loop.call_soon_threadsafe(self._take, item)

    def _take(self, item: Any) -> None:
        self._merge(item)
        if self._task is None and not self._closed:
            self._task = self._loop.create_task(self._flush_later())

    def _merge(self, item: Any) -> None:
        pending = self._pending
        if pending and pending[-1].get("phase") == item.get("phase"):
            pending[-1] = item
        else:
            pending.append(item)

    async def _flush_later(self) -> None:
        await asyncio.sleep(PROGRESS_EVERY_SECONDS)
        await self._flush()

    async def _flush(self) -> None:
        self._task = None
        items, self._pending = self._pending, []
        if items:
            try:
                await self._store(items)
            except Exception:
                logger.warning("storing a repository's progress failed", exc_info=True)

    async def close(self) -> None:
        """Store what is left (the items put before this was called)."""
        await asyncio.sleep(0)  # the thread's last call_soon_threadsafe runs first
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        await self._flush()


class _Output(_Progress):
    """A set-up's output, in pieces of at most a second, bounded in all."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, store: Callable[[list[Any]], Awaitable[None]]
    ):
        super().__init__(loop, store)
        self._kept = 0

    def _merge(self, item: Any) -> None:
        text = str(item)
        if not text.endswith("\n"):
            text += "\n"
        left = MAX_SETUP_OUTPUT_CHARS - self._kept
        if left <= 0:
            return
        if len(text) > left:
            text = text[:left] + "… (the rest of the output is not kept here)\n"
        self._kept += len(text)
        self._pending = ["".join([*self._pending, text])]


# --- the database's part (on the database threads) -------------------------------------------


@db_sync_to_async
def _row(session_id: UUID) -> SessionRepository | None:
    return SessionRepository.objects.filter(session_id=session_id).first()


@db_sync_to_async
def _sandbox(session_id: UUID) -> Sandbox:
    return Sandbox.objects.get(sessions__pk=session_id)


@db_sync_to_async
def _update(session_id: UUID, **fields: Any) -> None:
    SessionRepository.objects.filter(session_id=session_id).update(**fields)


def _remote(row: SessionRepository) -> Remote:
    owner_id = Session.objects.values_list("owner_id", flat=True).get(pk=row.session_id)
    return git_tokens.remote_for(owner_id, git_hosts.parse_repository_url(row.url))


def _host_and_token(row: SessionRepository) -> tuple[git_hosts.GitHost, str]:
    owner_id = Session.objects.values_list("owner_id", flat=True).get(pk=row.session_id)
    host = git_hosts.hosts().get(row.host)
    if host is None:
        raise Refused("unknown_git_host", f"{row.host} is no longer a git host of this server")
    try:
        token = git_tokens.token_for(owner_id, row.host)
    except git_tokens.GitTokenError as exc:
        raise Refused(exc.code, exc.message) from None
    if not token:
        raise Refused("git_auth_failed", f"store your token for {row.host} on the Keys page")
    return host, token


def _has_setup_script(sandbox: Sandbox, session_id: UUID) -> bool:
    workspace = sandbox_services.session_workspace(sandbox, session_id, just_read=True)
    try:
        listing = workspace.list_folder(".craft")
    except SandboxError:
        return False  # no such folder (or not one)
    return any(e.get("name") == "setup.sh" and e.get("type") == "file" for e in listing.entries)


def _asked_since(session_id: UUID, kind: str) -> list[str]:
    """Return the first lines of the prompts since the latest event of `kind` (all: none)."""
    events = Event.objects.filter(session_id=session_id)
    last = events.filter(kind=kind).order_by("-seq").values_list("seq", flat=True).first()
    prompts = events.filter(kind="user_message", seq__gt=last or 0).order_by("seq")
    asked = []
    for data in prompts.values_list("data", flat=True):
        text = str(data.get("text", "")).strip()
        if text:
            asked.append(text.splitlines()[0][:120])
    return asked


def commit_draft(session_id: UUID) -> tuple[User, str]:
    """Return the session's owner and the commit message drafted from the session: its title,
    the prompts since the last commit, a trailer naming the agent."""
    session = Session.objects.select_related("owner").get(pk=session_id)
    asked = _asked_since(session_id, "repository_committed")
    agent = catalog.agent(session.agent)
    agent_title = agent.title if agent is not None else session.agent
    lines = [session.title[:72]]
    if asked:
        lines += ["", *(f"- {text}" for text in asked[:20])]
    lines += ["", f"Co-authored-by: {agent_title} <{session.agent}@agents.craft.invalid>"]
    return session.owner, "\n".join(lines)


def pull_request_draft(session_id: UUID, link: str) -> tuple[str, str]:
    """Return a pull request's title and body drafted from the session: what was asked, what
    changed (the files its turns changed), a link back to it."""
    session = Session.objects.get(pk=session_id)
    asked = _asked_since(session_id, "pull_request_opened")
    changed: dict[str, None] = {}
    changes = Event.objects.filter(session_id=session_id, kind__in=("turn_changes",))
    for data in changes.order_by("seq").values_list("data", flat=True):
        for item in data.get("files", []) if isinstance(data, dict) else []:
            if isinstance(item, dict) and item.get("path"):
                changed[str(item["path"])] = None
    body = ["## What was asked", *(f"- {text}" for text in asked[:20] or ["(nothing yet)"])]
    if changed:
        body += ["", "## What changed", *(f"- `{path}`" for path in list(changed)[:50])]
        if len(changed) > 50:
            body.append(f"- … and {len(changed) - 50} more")
    if link:
        body += ["", f"Opened from a Craft session: {link}"]
    return session.title[:200], "\n".join(body)


def repository_json(row: SessionRepository) -> dict[str, Any]:
    """Return what a list of sessions and the session's header show of its repository."""
    pull_request = None
    if row.pull_request_number is not None:
        pull_request = {"url": row.pull_request_url, "number": row.pull_request_number,
                        "state": row.pull_request_state}  # fmt: skip
    return {
        "url": row.url, "host": row.host, "path": row.path, "branch": row.branch,
        "base": row.base, "status": row.status, "detail": row.detail,
        "failure": row.failure or None, "commit": row.commit, "pull_request": pull_request,
    }  # fmt: skip
