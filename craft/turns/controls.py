"""The agent's own controls and what a prompt carries besides its text.

Kept out of the runner, which only calls these: what a new agent connection records in the
log (`start_events`), checks of a client's choice against the controls the agent offers
(`check_config_choice`, `check_mode`), the session title that follows the agent's
`session_info_update` (`follow_agent_title`), and prompt attachments (`parse_attachments`,
`prompt_blocks`).

Every state a person sees comes from the event log, so each of these ends in events: the agent
information and controls of a new connection (`agent_info`), one `agent_restarted` per
replaced agent process, the `config_option_update` or `current_mode_update` that a change made
through Craft produced, and a `session_title` when the agent names the session.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from uuid import UUID

from craft.models import Event, Session
from craft.storage.db import db_sync_to_async
from craft.storage.normalise import clean_text, clean_title
from sandboxes.acp import AgentConnection

Events = list[tuple[str, dict[str, Any]]]

# What one prompt may carry besides its text. A client frame is at most 4 MiB (daphne's
# limit as `make run` starts it); base64 makes an image a third bigger.
MAX_ATTACHMENTS = 10
MAX_IMAGE_BYTES = 2 * 1024 * 1024
MAX_IMAGES_BYTES = 2_500_000  # all images of one prompt, decoded
MAX_PATH_CHARS = 1_000
IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}


class Invalid(Exception):
    """A client's request does not fit what the agent offers; `code` names why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- a new agent connection ---------------------------------------------------------------


_announced: weakref.WeakSet[AgentConnection] = weakref.WeakSet()


def first_use(connection: AgentConnection) -> bool:
    """Return True the first time a connection is seen: its start events are due then."""
    if connection in _announced:
        return False
    _announced.add(connection)
    return True


def start_events(connection: AgentConnection) -> Events:
    """Return the events a newly started agent connection adds to the log.

    `agent_restarted` when the connection replaced an earlier agent process of the session
    (none at the session's first start), then `agent_info`: who the agent is, what its
    prompts may carry, and its config options and modes as it described them.
    """
    events: Events = []
    if connection.restored is not None:
        events.append(("agent_restarted", {"restored": connection.restored}))
    info: dict[str, Any] = {
        "agent": connection.agent_info,
        "promptCapabilities": connection.prompt_capabilities,
    }
    if connection.config_options is not None:
        info["configOptions"] = connection.config_options
    if connection.modes is not None:
        info["modes"] = connection.modes
    events.append(("agent_info", info))
    return events


# --- config options and modes ---------------------------------------------------------------


def _values(option: dict[str, Any]) -> Iterator[str]:
    """Yield the values a select option offers (flat, or in groups of `options`)."""
    for item in option.get("options") or []:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("value"), str):
            yield item["value"]
        group = item.get("options")
        for grouped in group if isinstance(group, list) else []:
            if isinstance(grouped, dict) and isinstance(grouped.get("value"), str):
                yield grouped["value"]


def check_config_choice(options: list[dict[str, Any]] | None, config_id: str, value: str) -> None:
    """Raise Invalid unless the agent offers config option `config_id` with `value`."""
    if not options:
        raise Invalid("no_config_options", "the agent offers no config options")
    option = next((o for o in options if o.get("id") == config_id), None)
    if option is None:
        raise Invalid("unknown_config", f"the agent has no config option {config_id!r}")
    if option.get("type") != "select" or value not in set(_values(option)):
        raise Invalid("invalid_value", f"{value!r} is not a value of {config_id!r}")


def check_mode(modes: dict[str, Any] | None, mode_id: str) -> None:
    """Raise Invalid unless the agent offers the mode `mode_id`."""
    available = (modes or {}).get("availableModes")
    if not isinstance(available, list) or not available:
        raise Invalid("no_modes", "the agent offers no modes")
    if not any(isinstance(m, dict) and m.get("id") == mode_id for m in available):
        raise Invalid("unknown_mode", f"the agent has no mode {mode_id!r}")


def config_event(options: list[dict[str, Any]]) -> Events:
    """Return the event that records the agent's options after a change made through Craft
    (the shape of the agent's own `config_option_update`, so that one fold serves both)."""
    return [("config_option_update", {"sessionUpdate": "config_option_update",
                                      "configOptions": options})]  # fmt: skip


def mode_event(mode_id: str) -> Events:
    """Return the event that records a mode change made through Craft."""
    return [("current_mode_update",
             {"sessionUpdate": "current_mode_update", "currentModeId": mode_id})]  # fmt: skip


# --- the session's title ----------------------------------------------------------------------


def agent_titles(events: Events) -> list[str]:
    """Return the titles the agent gave the session in these events (session_info_update)."""
    titles = (
        clean_title(data["title"])
        for kind, data in events
        if kind == "session_info_update" and isinstance(data.get("title"), str)
    )
    return [title for title in titles if title]


@db_sync_to_async
def follow_agent_title(session_id: UUID, title: str) -> Events:
    """Take the agent's title for the session unless its owner renamed it; return the
    `session_title` event to store (none if nothing changed)."""
    renamed = Event.objects.filter(
        session_id=session_id, kind="session_title", data__source="user"
    ).exists()
    if renamed:
        return []
    if not Session.objects.filter(pk=session_id).exclude(title=title).update(title=title):
        return []
    return [("session_title", {"title": title, "source": "agent"})]


# --- prompt attachments -------------------------------------------------------------------


@dataclass(frozen=True)
class Attachment:
    """One thing a prompt carries besides its text, checked."""

    kind: str  # "file" or "image"
    path: str = ""  # file: relative to the session's workspace
    mime_type: str = ""  # image
    data: str = ""  # image: base64
    name: str = ""
    size: int = 0  # image: decoded bytes

    def stored(self) -> dict[str, Any]:
        """Return what the log keeps of it (never an image's bytes)."""
        if self.kind == "file":
            return {"type": "file", "path": self.path}
        return {"type": "image", "mimeType": self.mime_type, "name": self.name,
                "bytes": self.size}  # fmt: skip


def parse_attachments(raw: Any) -> list[Attachment]:
    """Check a prompt frame's `attachments`; return them, or raise Invalid saying why."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise Invalid("bad_frame", "'attachments' must be a list")
    if len(raw) > MAX_ATTACHMENTS:
        raise Invalid(
            "too_many_attachments", f"a prompt carries at most {MAX_ATTACHMENTS} attachments"
        )
    attachments = [_attachment(item) for item in raw]
    if sum(a.size for a in attachments) > MAX_IMAGES_BYTES:
        raise Invalid(
            "attachment_too_large",
            f"the images of one prompt are limited to {MAX_IMAGES_BYTES // 1_000_000} MB",
        )
    return attachments


def _attachment(item: Any) -> Attachment:
    if not isinstance(item, dict) or item.get("type") not in ("file", "image"):
        raise Invalid("bad_attachment", "an attachment is {'type': 'file' | 'image', ...}")
    name = item.get("name")
    name = clean_text(name)[:200] if isinstance(name, str) else ""
    if item["type"] == "file":
        path = item.get("path")
        if not isinstance(path, str) or not _is_workspace_path(path):
            raise Invalid(
                "bad_attachment", "a file attachment needs a 'path' relative to the workspace"
            )
        return Attachment("file", path=posixpath.normpath(path), name=name)
    mime_type, data = item.get("mimeType"), item.get("data")
    if mime_type not in IMAGE_TYPES:
        raise Invalid("bad_attachment", f"images must be one of {', '.join(sorted(IMAGE_TYPES))}")
    if not isinstance(data, str) or len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise Invalid(
            "attachment_too_large",
            f"an image is limited to {MAX_IMAGE_BYTES // (1024 * 1024)} MiB",
        )
    try:
        size = len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        raise Invalid("bad_attachment", "an image's 'data' must be base64") from None
    if size > MAX_IMAGE_BYTES:
        raise Invalid(
            "attachment_too_large",
            f"an image is limited to {MAX_IMAGE_BYTES // (1024 * 1024)} MiB",
        )
    return Attachment("image", mime_type=str(mime_type), data=data, name=name, size=size)


def _is_workspace_path(path: str) -> bool:
    """Whether `path` names something inside the workspace: relative, without `..`."""
    if not 0 < len(path) <= MAX_PATH_CHARS or clean_text(path) != path or not path.isprintable():
        return False
    return not path.startswith("/") and ".." not in path.split("/")


def check_capabilities(attachments: list[Attachment], capabilities: dict[str, bool]) -> None:
    """Raise Invalid if the agent does not take images and the prompt has one.

    Files go as resource links, which every ACP agent must take.
    """
    if any(a.kind == "image" for a in attachments) and not capabilities.get("image"):
        raise Invalid("attachments_not_supported", "this agent does not accept images")


def prompt_blocks(attachments: list[Attachment], cwd: str) -> list[dict[str, Any]]:
    """Return the ACP content blocks of a prompt's attachments, after its text block.

    A file is a `resource_link` to its absolute path in the agent's workspace: the agent
    reads it where it runs, and Craft never reads files of the sandbox.
    """
    blocks: list[dict[str, Any]] = []
    for attachment in attachments:
        if attachment.kind == "file":
            path = posixpath.join(cwd, attachment.path)
            blocks.append(
                {
                    "type": "resource_link",
                    "uri": "file://" + quote(path),
                    "name": attachment.name or posixpath.basename(attachment.path),
                }
            )
        else:
            blocks.append(
                {"type": "image", "mimeType": attachment.mime_type, "data": attachment.data}
            )
    return blocks
