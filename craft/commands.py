"""What a client asks of a session, as typed commands: parsed and checked once, at the socket.

The consumer turns each client frame into one of these (`parse`), or refuses it; from then on
the command travels as it is: to the worker that owns the session (`craft.cluster`, which
sends it through the channel layer with `to_wire` and `from_wire` without knowing what it
means), and into that worker's runner, which carries it out (`craft.turns`).

Only what the agent must decide (an option its permission request offers, a config value it
offers, whether it takes images) is checked later, by the runner that knows the agent.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import posixpath
from dataclasses import dataclass
from typing import Any

from craft.errors import Refused
from craft.storage.normalise import clean_text, is_client_id

MAX_PROMPT_CHARS = 100_000
# What one prompt may carry besides its text. A client frame is at most 4 MiB (daphne's
# limit as `make run` starts it); base64 makes an image a third bigger.
MAX_ATTACHMENTS = 10
MAX_IMAGE_BYTES = 2 * 1024 * 1024
MAX_IMAGES_BYTES = 2_500_000  # all images of one prompt, decoded
MAX_PATH_CHARS = 1_000
IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}


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


@dataclass(frozen=True)
class Prompt:
    """Start a turn with this text (cleaned as it will be stored) and attachments."""

    id: str
    text: str
    attachments: tuple[Attachment, ...] = ()
    # While the session is busy (a turn runs, the sandbox starts): wait in its queue (True),
    # or be refused with `turn_running` / `sandbox_starting` (False).
    queue: bool = True


@dataclass(frozen=True)
class Cancel:
    """Cancel the running turn."""


@dataclass(frozen=True)
class AnswerPermission:
    """Answer an open permission request with one of its options."""

    request: str
    option: str


@dataclass(frozen=True)
class AnswerElicitation:
    """Answer an open elicitation request: `accept` (with a form's `content`), `decline` or
    `cancel`."""

    request: str
    action: str
    content: dict[str, Any] | None = None


@dataclass(frozen=True)
class SetConfigOption:
    """Change one of the agent's session config options."""

    config: str
    value: str


@dataclass(frozen=True)
class SetMode:
    """Switch the agent to one of its modes."""

    mode: str


@dataclass(frozen=True)
class Revert:
    """Put the workspace back as it was before change `seq` (a turn, by its user_message's
    seq, or an earlier revert): all of it, one file (`path`), or one hunk of that file."""

    seq: int
    path: str = ""
    hunk: int | None = None


@dataclass(frozen=True)
class Fork:
    """Make session `new_id` from this one as it was just after turn `seq` (its user_message's
    seq), or just before it (`before`): the conversation and the workspace
    (craft.turns.going_back)."""

    seq: int
    new_id: str
    before: bool = False


@dataclass(frozen=True)
class ForkRequest:
    """What a fork request asks (HTTP): from turn `seq` (after it, or `before` it), and the
    fork's first prompt (`text`, "" for none)."""

    seq: int
    before: bool = False
    text: str = ""


@dataclass(frozen=True)
class Rewind:
    """Take the session back to just after turn `seq`: its workspace, and its conversation
    (the later turns are set aside)."""

    seq: int


@dataclass(frozen=True)
class EditQueued:
    """Replace the text of a queued prompt that has not started."""

    id: str
    text: str


@dataclass(frozen=True)
class RemoveQueued:
    """Take a queued prompt that has not started out of the queue."""

    id: str


@dataclass(frozen=True)
class SendNow:
    """Steer: run this queued prompt next, cancelling the running turn for it."""

    id: str


@dataclass(frozen=True)
class RunQueue:
    """Start the session's next queued prompt if nothing runs (the server's own command: after
    a restart or a takeover, or once the sandbox is ready; never a client frame)."""


@dataclass(frozen=True)
class Resume:
    """Send the stored events after `after`, then follow the session live (the socket's own)."""

    after: int


@dataclass(frozen=True)
class StartAgent:
    """Start the session's agent now if none runs, so that what it offers (config options,
    modes, commands) is known before the first prompt."""


@dataclass(frozen=True)
class PrepareRepository:
    """Clone the session's repository into its workspace and run its set-up, if that is not
    done yet (the server's own command: when the session is opened, or after a restart)."""


@dataclass(frozen=True)
class CommitRepository:
    """Commit everything in the workspace to the session's branch (`message`: "" drafts one)."""

    message: str = ""


@dataclass(frozen=True)
class PushRepository:
    """Push the session's branch to the remote (never forced)."""


@dataclass(frozen=True)
class OpenPullRequest:
    """Open a pull request of the session's branch against its base ("" drafts the text)."""

    title: str = ""
    body: str = ""
    link: str = ""  # the session's page, for the body


@dataclass(frozen=True)
class UpdateRepository:
    """Fetch the base branch and merge it into the session's branch."""


@dataclass(frozen=True)
class RefreshPullRequest:
    """Read the pull request's state from its host again (the server's own command)."""


@dataclass(frozen=True)
class Seen:
    """The person has now looked at everything the session's page shows (the socket's own)."""


@dataclass(frozen=True)
class FollowSessions:
    """Send a `sessions` frame whenever one of the person's sessions changes what a list of
    sessions shows (the socket's own)."""


# What the session's owner carries out; the others stay with the socket that received them.
SessionCommand = (
    Prompt | Cancel | AnswerPermission | AnswerElicitation | SetConfigOption | SetMode | Revert
    | Fork | Rewind | EditQueued | RemoveQueued | SendNow | RunQueue | StartAgent
    | PrepareRepository | CommitRepository | PushRepository | OpenPullRequest | UpdateRepository
    | RefreshPullRequest
)  # fmt: skip
Command = SessionCommand | Resume | Seen | FollowSessions

# The frame type of each command, as clients send it.
FRAME_TYPES: dict[type, str] = {
    Prompt: "prompt",
    Cancel: "cancel",
    AnswerPermission: "permission",
    AnswerElicitation: "elicitation",
    SetConfigOption: "set_config_option",
    SetMode: "set_mode",
    Revert: "revert",  # over HTTP (POST .../turns/<seq>/revert/), not the socket
    Fork: "fork",  # over HTTP (POST .../fork/), not the socket
    Rewind: "rewind",  # over HTTP (POST .../rewind/), not the socket
    EditQueued: "edit_queued",
    RemoveQueued: "remove_queued",
    SendNow: "send_now",
    RunQueue: "run_queue",  # between workers only
    StartAgent: "start_agent",
    # Over HTTP (POST .../repository/...), or between workers; never a socket frame.
    PrepareRepository: "prepare_repository",
    CommitRepository: "commit_repository",
    PushRepository: "push_repository",
    OpenPullRequest: "open_pull_request",
    UpdateRepository: "update_repository",
    RefreshPullRequest: "refresh_pull_request",
    Resume: "resume",
    Seen: "seen",
    FollowSessions: "follow_sessions",
}


def parse(frame: dict[str, Any]) -> Command:
    """Return the command a client frame (a JSON object with a string `type`) asks for, or
    raise Refused saying what is wrong with it."""
    kind = frame["type"]
    if kind == "prompt":
        return _prompt(frame)
    if kind == "cancel":
        return Cancel()
    if kind == "start_agent":
        return StartAgent()
    if kind == "permission":
        request, option = frame.get("request"), frame.get("option")
        if not isinstance(request, str) or not isinstance(option, str):
            raise Refused("bad_frame", "permission needs 'request' and 'option' strings")
        return AnswerPermission(request, option)
    if kind == "elicitation":
        return _elicitation_answer(frame)
    if kind in ("edit_queued", "remove_queued", "send_now"):
        return _queue_change(kind, frame)
    if kind == "resume":
        after = frame.get("after", 0)
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63:
            raise Refused("bad_frame", "resume needs 'after': a non-negative integer")
        return Resume(after)
    if kind == "seen":
        return Seen()
    if kind == "follow_sessions":
        return FollowSessions()
    if kind == "set_config_option":
        config, value = frame.get("config"), frame.get("value")
        if not isinstance(config, str) or not isinstance(value, str):
            raise Refused("bad_frame", "set_config_option needs 'config' and 'value' strings")
        return SetConfigOption(config, value)
    if kind == "set_mode":
        mode = frame.get("mode")
        if not isinstance(mode, str):
            raise Refused("bad_frame", "set_mode needs a 'mode' string")
        return SetMode(mode)
    raise Refused("unknown_type", f"unknown frame type {kind!r}")


def parse_revert(seq: int, body: dict[str, Any]) -> Revert:
    """Check a revert request (HTTP): of change `seq`, and the body's optional `path`, and
    `hunk` of that path."""
    path, hunk = body.get("path", ""), body.get("hunk")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 < seq < 2**63:
        raise Refused("invalid", "a change is named by the seq of its event")
    if not isinstance(path, str) or (path and not _is_workspace_path(path)):
        raise Refused("invalid_path", "'path' must be a path relative to the workspace")
    if hunk is not None and (isinstance(hunk, bool) or not isinstance(hunk, int) or hunk < 0):
        raise Refused("invalid", "'hunk' must be a hunk's number (from 0) in the file's diff")
    if hunk is not None and not path:
        raise Refused("invalid", "a hunk is reverted in one file: give its 'path'")
    return Revert(seq, path, hunk)


def parse_turn_seq(body: dict[str, Any]) -> int:
    """Check a fork or rewind request (HTTP): its `seq`, a turn's user_message's."""
    seq = body.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 < seq < 2**63:
        raise Refused("invalid", "'seq' must be the seq of a user message of the session")
    return seq


def parse_fork(body: dict[str, Any]) -> ForkRequest:
    """Check a fork request (HTTP): `seq`, and the optional `before` and `text`."""
    seq, before, text = parse_turn_seq(body), body.get("before", False), body.get("text")
    if not isinstance(before, bool):
        raise Refused("invalid", "'before' must be true or false")
    return ForkRequest(seq, before, "" if text is None else _prompt_text(text, "fork"))


def _prompt(frame: dict[str, Any]) -> Prompt:
    client_id, text, queue = frame.get("id"), frame.get("text"), frame.get("queue", True)
    if not isinstance(client_id, str) or not is_client_id(client_id):
        raise Refused("bad_frame", "prompt needs an 'id' string of 1 to 100 printable characters")
    if not isinstance(queue, bool):
        raise Refused("bad_frame", "'queue' must be true or false")
    attachments = parse_attachments(frame.get("attachments"))
    return Prompt(client_id, _prompt_text(text, "prompt"), tuple(attachments), queue)


def _prompt_text(text: Any, frame_type: str) -> str:
    if not isinstance(text, str):
        raise Refused("bad_frame", f"{frame_type} needs a 'text' string")
    if not text.strip():
        raise Refused("empty_prompt", "a prompt needs some text")
    if len(text) > MAX_PROMPT_CHARS:
        raise Refused("prompt_too_long", f"prompts are limited to {MAX_PROMPT_CHARS} characters")
    # The agent gets the prompt as it is stored: text no one could encode is cleaned.
    return clean_text(text)


ELICITATION_ACTIONS = ("accept", "decline", "cancel")
MAX_ELICITATION_VALUES = 100  # as many as a form has fields (sandboxes.elicitation)


def _elicitation_answer(frame: dict[str, Any]) -> AnswerElicitation:
    request, action, content = frame.get("request"), frame.get("action"), frame.get("content")
    if not isinstance(request, str) or action not in ELICITATION_ACTIONS:
        raise Refused(
            "bad_frame", "elicitation needs a 'request' string and an 'action': accept, decline "
            "or cancel",
        )  # fmt: skip
    if content is not None and (
        not isinstance(content, dict) or len(content) > MAX_ELICITATION_VALUES
    ):
        raise Refused(
            "bad_frame", f"'content' must be an object of at most {MAX_ELICITATION_VALUES} values"
        )
    return AnswerElicitation(request, str(action), content if action == "accept" else None)


def _queue_change(kind: str, frame: dict[str, Any]) -> EditQueued | RemoveQueued | SendNow:
    client_id = frame.get("id")
    if not isinstance(client_id, str) or not is_client_id(client_id):
        raise Refused("bad_frame", f"{kind} needs the queued prompt's 'id'")
    if kind == "edit_queued":
        return EditQueued(client_id, _prompt_text(frame.get("text"), kind))
    if kind == "remove_queued":
        return RemoveQueued(client_id)
    return SendNow(client_id)


# --- between workers -------------------------------------------------------------------------


def to_wire(command: SessionCommand) -> dict[str, Any]:
    """Return the command as a message for another worker (it was checked here already)."""
    return {"type": FRAME_TYPES[type(command)], **dataclasses.asdict(command)}


def from_wire(message: dict[str, Any]) -> SessionCommand:
    """Return the command another worker sent with `to_wire` (through the signed layer)."""
    fields = {key: value for key, value in message.items() if key != "type"}
    if message["type"] == "prompt":
        attachments = tuple(Attachment(**item) for item in fields.pop("attachments", ()))
        return Prompt(**fields, attachments=attachments)
    kind = next(cls for cls, name in FRAME_TYPES.items() if name == message["type"])
    command: SessionCommand = kind(**fields)
    return command


# --- prompt attachments -------------------------------------------------------------------


def parse_attachments(raw: Any) -> list[Attachment]:
    """Check a prompt frame's `attachments`; return them, or raise Refused saying why."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise Refused("bad_frame", "'attachments' must be a list")
    if len(raw) > MAX_ATTACHMENTS:
        raise Refused(
            "too_many_attachments", f"a prompt carries at most {MAX_ATTACHMENTS} attachments"
        )
    attachments = [_attachment(item) for item in raw]
    if sum(a.size for a in attachments) > MAX_IMAGES_BYTES:
        raise Refused(
            "attachment_too_large",
            f"the images of one prompt are limited to {MAX_IMAGES_BYTES // 1_000_000} MB",
        )
    return attachments


def _attachment(item: Any) -> Attachment:
    if not isinstance(item, dict) or item.get("type") not in ("file", "image"):
        raise Refused("bad_attachment", "an attachment is {'type': 'file' | 'image', ...}")
    name = item.get("name")
    name = clean_text(name)[:200] if isinstance(name, str) else ""
    if item["type"] == "file":
        path = item.get("path")
        if not isinstance(path, str) or not _is_workspace_path(path):
            raise Refused(
                "bad_attachment", "a file attachment needs a 'path' relative to the workspace"
            )
        return Attachment("file", path=posixpath.normpath(path), name=name)
    mime_type, data = item.get("mimeType"), item.get("data")
    if mime_type not in IMAGE_TYPES:
        raise Refused("bad_attachment", f"images must be one of {', '.join(sorted(IMAGE_TYPES))}")
    if not isinstance(data, str) or len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise Refused(
            "attachment_too_large",
            f"an image is limited to {MAX_IMAGE_BYTES // (1024 * 1024)} MiB",
        )
    try:
        size = len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        raise Refused("bad_attachment", "an image's 'data' must be base64") from None
    if size > MAX_IMAGE_BYTES:
        raise Refused(
            "attachment_too_large",
            f"an image is limited to {MAX_IMAGE_BYTES // (1024 * 1024)} MiB",
        )
    return Attachment("image", mime_type=str(mime_type), data=data, name=name, size=size)


def _is_workspace_path(path: str) -> bool:
    """Whether `path` names something inside the workspace: relative, without `..`."""
    if not 0 < len(path) <= MAX_PATH_CHARS or clean_text(path) != path or not path.isprintable():
        return False
    return not path.startswith("/") and ".." not in path.split("/")
