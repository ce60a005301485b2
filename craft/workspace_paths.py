"""The workspace's host path never leaves the server for a non-staff user.

Agents report absolute paths (tool call locations, diffs, file links, error messages), and a
session's workspace on the local backend lives under the server's own sandbox folder. For
people who are not staff, everything the server sends about a session (the page's HTML, the
websocket's frames, the HTTP events API, error messages) has the workspace's path replaced
by `NEUTRAL`; the page then shows paths relative to it, as it does with the real one. Staff
see the real path.

Frames are JSON text encoded once and shared by every socket of a session, so the
replacement works on text: a `str.replace` of the path as JSON writes it, and, for paths of
an earlier sandbox of the session (it moved to a new one after its old one was stopped), a
pattern for any path that ends in the session's `sessions/<id>` folder. Both run only on text
that holds the session's folder name, which most frames do not.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from uuid import UUID

from django.contrib.auth.models import AnonymousUser, User

from sandboxes import services as sandbox_services
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

NEUTRAL = "/workspace"

Scrub = Callable[[str], str]


def workspace_path(sandbox: Sandbox, session_id: UUID) -> str:
    """Return the session's workspace as its agent sees it (its working directory), or ""."""
    try:
        return sandbox_services.workspace_path(sandbox, session_id)
    except Exception:
        logger.exception("no workspace path for session %s", session_id)
        return ""


class PathScrubber:
    """Replace a session's workspace path by `NEUTRAL` in text (plain or JSON)."""

    def __init__(self, session_id: UUID, workspace: str) -> None:
        self.marker = f"/sessions/{session_id}"
        escaped = json.dumps(workspace)[1:-1]  # as JSON writes it (ASCII paths: the same)
        self.prefixes = [p for p in dict.fromkeys((workspace.rstrip("/"), escaped)) if p]
        # Any path of the session's folder, whichever sandbox it was in: path segments (no
        # quotes, spaces or backslashes, so that it stays inside one JSON string) before it.
        self.pattern = re.compile(r"(?:/[^/\s\"'\\<>]+)*" + re.escape(self.marker) + r"(?![\w-])")

    def __call__(self, text: str) -> str:
        if self.marker not in text:
            return text
        for prefix in self.prefixes:
            text = text.replace(prefix, NEUTRAL)
        if self.marker in text:
            text = self.pattern.sub(NEUTRAL, text)
        return text


def scrubber_for(user: User | AnonymousUser, sandbox: Sandbox, session_id: UUID) -> Scrub | None:
    """Return what hides the session's workspace path from `user`; None for staff (they see
    the real path)."""
    if user.is_staff:
        return None
    return PathScrubber(session_id, workspace_path(sandbox, session_id))


def shown_workspace(user: User | AnonymousUser, sandbox: Sandbox, session_id: UUID) -> str:
    """Return the workspace path the session's page may show `user`."""
    return workspace_path(sandbox, session_id) if user.is_staff else NEUTRAL
