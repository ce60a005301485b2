"""The files of a session's workspace over HTTP: list a folder, download a file or all of it,
see what a turn changed, revert it.

Only the session's owner; read through `sandboxes.services.session_workspace` (the workspace
tool, with the agent's rights, confined: invariant 11). Downloads are streamed as they are
read, never held whole, and never shown as a page of Craft's origin.
"""

from __future__ import annotations

import asyncio
import mimetypes
import re
from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote
from uuid import UUID

from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_http_methods

from craft import services
from craft.api.sessions import api_login_required, error, owned_session_and_body, page_of
from craft.commands import parse_revert
from craft.errors import Refused
from craft.http.requests import SignedInRequest
from craft.models import Session
from craft.turns.checkpoints import checkpoints_of
from craft.turns.records import is_cloning
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox
from sandboxes.workspace import Download, WorkspaceRefused, refuse_bad_path

MAX_PAGE = 10_000
WAKING_FOR_FILES = "your sandbox was asleep and is waking up: its files show once it is awake"
UPLOAD_CHUNK = 1 << 16
# Shown in the browser as what they are; anything else is downloaded as bytes.
INLINE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "image/svg+xml"}
# Refusals of the workspace tool, as HTTP statuses.
STATUS = {
    "not_found": 404,
    "no_workspace": 404,
    "invalid_path": 400,
    "is_link": 400,
    "not_a_folder": 400,
    "not_a_file": 400,
    "too_large": 413,
    "exists": 409,
}


def _refused(exc: SandboxError) -> JsonResponse:
    if isinstance(exc, sandbox_services.SandboxUnavailable):
        return error(503, "sandbox_unavailable", str(exc))
    if isinstance(exc, WorkspaceRefused):
        return error(STATUS.get(exc.code, 400), exc.code, str(exc))
    return error(502, "workspace_unreadable", str(exc))


def _session(request: SignedInRequest, session_id: UUID) -> Session | None:
    return Session.objects.one_of(request.user, session_id)


@require_http_methods(["GET"])
@api_login_required
def files(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """A folder's entries: `?path=` (default the workspace), `offset`, `limit` (≤ 10,000)."""
    session = _session(request, session_id)
    if session is None:
        return error(404, "not_found", "no such session")
    path = request.GET.get("path", "")
    page = page_of(request, "offset", 1000, MAX_PAGE)
    if isinstance(page, JsonResponse):
        return page
    offset, limit = page
    if session.sandbox.status == Sandbox.Status.SLEEPING:
        # Opening its files wakes it; the page lists them again once it runs.
        sandbox_services.request_sandbox(request.user)
        return error(503, "sandbox_unavailable", WAKING_FOR_FILES)
    try:
        refuse_bad_path(path)  # first: whether the sandbox runs or not
        workspace = sandbox_services.session_workspace(session.sandbox, session.pk)
        listing = workspace.list_folder(path, offset, limit)
    except WorkspaceRefused as exc:
        if exc.code == "no_workspace" and path.strip("/.") == "":
            # Created when the agent first starts: until then, an empty workspace.
            return JsonResponse(
                {"path": "", "total": 0, "offset": 0, "entries": [], "has_more": False}
            )
        return _refused(exc)
    except SandboxError as exc:
        return _refused(exc)
    # The tool's own JSON line (checked when it was read): not decoded and encoded again.
    return HttpResponse(listing.json, content_type="application/json")


@require_http_methods(["GET", "PUT"])
@api_login_required
def raw(request: SignedInRequest, session_id: UUID) -> HttpResponseBase:
    """One file (`?path=`): GET, as an attachment, streamed; PUT, the body written there."""
    session = _session(request, session_id)
    if session is None:
        return error(404, "not_found", "no such session")
    path = request.GET.get("path", "")
    if request.method == "PUT":
        return _upload(request, session, path)
    try:
        refuse_bad_path(path)
        workspace = sandbox_services.session_workspace(session.sandbox, session.pk)
        download = workspace.read(path, settings.CRAFT_ARCHIVE_MAX_BYTES)
    except SandboxError as exc:
        return _refused(exc)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    response = _streamed(download, _content_type(name), name)
    response["Content-Length"] = str(download.header["size"])
    return response


def _upload(request: SignedInRequest, session: Session, path: str) -> HttpResponse:
    """Write the request's body (read as it is read, never whole in memory) as the file
    `path` of the workspace, through the workspace tool: 201 `{"path", "size"}`; 409
    `exists` unless `?overwrite=1`; 413 past CRAFT_UPLOAD_MAX_BYTES (bodies over it are
    refused before a view runs: `craft.http.handler`); 400 `invalid_path`."""
    if not path.strip("/."):
        return error(400, "invalid_path", "name the file to write: ?path=folder/name")
    if is_cloning(session):
        return error(409, "repository_not_ready", "the session's repository is being cloned")
    overwrite = request.GET.get("overwrite") == "1"

    def chunks() -> Iterator[bytes]:
        while chunk := request.read(UPLOAD_CHUNK):
            yield chunk

    try:
        refuse_bad_path(path)
        workspace = sandbox_services.writable_workspace(session.sandbox, session.pk)
        written = workspace.write(
            path, chunks(), settings.CRAFT_UPLOAD_MAX_BYTES, overwrite=overwrite
        )
    except SandboxError as exc:
        return _refused(exc)
    return JsonResponse(written, status=201)


@require_http_methods(["GET"])
@api_login_required
def archive(request: SignedInRequest, session_id: UUID) -> HttpResponseBase:
    """The whole workspace as a zip, streamed; refused over CRAFT_ARCHIVE_MAX_BYTES."""
    session = _session(request, session_id)
    if session is None:
        return error(404, "not_found", "no such session")
    try:
        workspace = sandbox_services.session_workspace(session.sandbox, session.pk)
        download = workspace.archive(settings.CRAFT_ARCHIVE_MAX_BYTES)
    except SandboxError as exc:
        return _refused(exc)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", session.title).strip("-.")[:60] or "workspace"
    return _streamed(download, "application/zip", f"{slug}-{str(session.pk)[:8]}.zip")


@require_http_methods(["GET"])
@api_login_required
def turn_diff(request: SignedInRequest, session_id: UUID, seq: int) -> HttpResponseBase:
    """The unified diff of what turn `seq` (its user_message's seq) changed, `?path=` for one
    file: git's diff between the checkpoints before and after it, streamed."""
    session = _session(request, session_id)
    if session is None:
        return error(404, "not_found", "no such session")
    path = request.GET.get("path", "")
    try:
        refuse_bad_path(path)
    except WorkspaceRefused as exc:
        return _refused(exc)
    before, after = checkpoints_of(session.pk, seq)
    if not after:
        return error(404, "no_checkpoint", "that turn has no checkpoint of the files after it")
    try:
        workspace = sandbox_services.session_workspace(session.sandbox, session.pk)
        download = workspace.diff(before, after, path)
    except SandboxError as exc:
        return _refused(exc)
    response = StreamingHttpResponse(_chunks(download), content_type="text/plain; charset=utf-8")
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, no-store"
    return response


# Refusals of a revert, as HTTP statuses (others: 400).
REVERT_STATUS = {
    "turn_running": 409,
    "conflict": 409,
    "nothing_to_revert": 409,
    "no_checkpoint": 404,
    "not_found": 404,
    "sandbox_unavailable": 503,
    "workspace_unavailable": 503,
    "unavailable": 503,
    "shutting_down": 503,
}


@require_http_methods(["POST"])
async def revert(request: SignedInRequest, session_id: UUID, seq: int) -> HttpResponse:
    """Put the workspace back as it was before turn `seq` (or revert `seq`): JSON body
    `{}` for all of it, `{"path"}` for one file, `{"path", "hunk"}` for one hunk of it.
    Answers 204 once the `workspace_reverted` event is stored."""
    owned = await owned_session_and_body(request, session_id)
    if isinstance(owned, HttpResponse):
        return owned
    session, body = owned
    try:
        await services.run_command(session.pk, parse_revert(seq, body))
    except Refused as refused:
        return error(REVERT_STATUS.get(refused.code, 400), refused.code, refused.message)
    return HttpResponse(status=204)


def _content_type(name: str) -> str:
    guessed, _ = mimetypes.guess_type(name, strict=False)
    if guessed in INLINE_TYPES:
        return guessed
    return "application/octet-stream"


def _streamed(download: Download, content_type: str, filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(_chunks(download), content_type=content_type)
    ascii_name = re.sub(r'[^\x20-\x7e]|["\\]', "_", filename) or "download"
    response["Content-Disposition"] = (
        f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename, safe='')}"
    )
    # Never a page of Craft's origin, whatever the bytes are (an SVG with a script, HTML).
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, no-store"
    return response


async def _chunks(download: Download) -> AsyncIterator[bytes]:
    """The download's bytes, each read on a thread: the event loop never waits on a pipe."""
    try:
        while chunk := await asyncio.to_thread(download.read):
            yield chunk
    finally:
        await asyncio.to_thread(download.close)
