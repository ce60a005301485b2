"""What a client asks of a session, as typed commands: parsed and checked once, at the socket.

Each command class names its frame type and parses itself; `parse` picks the class by the
frame's `type` (`COMMANDS`). The consumer turns each client frame into one of these, or
refuses it; from then on the command travels as it is: to the worker that owns the session
(`craft.cluster`, which sends it through the channel layer with `to_wire` and `from_wire`
without knowing what it means), and into that worker's runner, which carries it out
(`craft.turns`).

Only what the agent must decide (an option its permission request offers, a config value it
offers, whether it takes images) is checked later, by the runner that knows the agent.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import posixpath
from dataclasses import dataclass
from typing import Any, ClassVar, Self, cast

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


# Every command by its frame type: how clients and workers name it (filled by `BaseCommand`).
COMMANDS: dict[str, type[BaseCommand]] = {}


class BaseCommand:
    """A command, known by its frame type: `class Cancel(BaseCommand, frame_type="cancel",
    socket=True)` declares it once, in `COMMANDS`; `socket` says a session socket's client may
    send it (the rest come over HTTP, or between workers only)."""

    frame_type: ClassVar[str]
    from_socket: ClassVar[bool]

    def __init_subclass__(cls, *, frame_type: str, socket: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        assert frame_type not in COMMANDS, f"two commands of frame type {frame_type!r}"
        cls.frame_type, cls.from_socket = frame_type, socket
        COMMANDS[frame_type] = cls

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        """Return the command a client frame of this type asks for, or raise Refused saying
        what is wrong with it (a command that takes nothing from its frame: itself)."""
        return cls()

    @classmethod
    def from_wire(cls, fields: dict[str, Any]) -> Self:
        """Return the command whose fields another worker sent (`to_wire`)."""
        return cls(**fields)


@dataclass(frozen=True)
class Prompt(BaseCommand, frame_type="prompt", socket=True):
    """Start a turn with this text (cleaned as it will be stored) and attachments.

    Refused for images the agent does not take, when the queue is full, and when the server
    shuts down; a repeated prompt id is ignored."""

    id: str
    text: str
    attachments: tuple[Attachment, ...] = ()
    # While the session is busy (a turn runs, the sandbox starts): wait in its queue (True),
    # or be refused with `turn_running` / `sandbox_starting` (False).
    queue: bool = True

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        client_id, text, queue = frame.get("id"), frame.get("text"), frame.get("queue", True)
        if not isinstance(client_id, str) or not is_client_id(client_id):
            raise Refused(
                "bad_frame", "prompt needs an 'id' string of 1 to 100 printable characters"
            )
        if not isinstance(queue, bool):
            raise Refused("bad_frame", "'queue' must be true or false")
        attachments = parse_attachments(frame.get("attachments"))
        return cls(client_id, _prompt_text(text, "prompt"), tuple(attachments), queue)

    @classmethod
    def from_wire(cls, fields: dict[str, Any]) -> Self:
        attachments = tuple(Attachment(**item) for item in fields.pop("attachments", ()))
        return cls(**fields, attachments=attachments)


@dataclass(frozen=True)
class Cancel(BaseCommand, frame_type="cancel", socket=True):
    """Cancel the running turn; it ends with stop reason `cancelled`."""


@dataclass(frozen=True)
class AnswerPermission(BaseCommand, frame_type="permission", socket=True):
    """Answer an open permission request of the running turn with one of its options."""

    request: str
    option: str

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        return cls(*_strings(frame, "request", "option"))


ELICITATION_ACTIONS = ("accept", "decline", "cancel")
MAX_ELICITATION_VALUES = 100  # as many as a form has fields (sandboxes.elicitation)


@dataclass(frozen=True)
class AnswerElicitation(BaseCommand, frame_type="elicitation", socket=True):
    """Answer an open elicitation request: `accept` (with a form's `content`, checked against
    its fields by the runner), `decline` or `cancel`."""

    request: str
    action: str
    content: dict[str, Any] | None = None

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        request, action, content = frame.get("request"), frame.get("action"), frame.get("content")
        if not isinstance(request, str) or action not in ELICITATION_ACTIONS:
            raise Refused(
                "bad_frame", "elicitation needs a 'request' string and an 'action': accept, "
                "decline or cancel",
            )  # fmt: skip
        if content is not None and (
            not isinstance(content, dict) or len(content) > MAX_ELICITATION_VALUES
        ):
            raise Refused(
                "bad_frame",
                f"'content' must be an object of at most {MAX_ELICITATION_VALUES} values",
            )
        return cls(request, str(action), content if action == "accept" else None)


@dataclass(frozen=True)
class SetConfigOption(BaseCommand, frame_type="set_config_option", socket=True):
    """Change one of the agent's session config options (starting the agent if needed). The
    agent's answer, every option with its current value, is stored as a
    `config_option_update` event; refused for an option or value the agent does not offer, or
    when the agent refuses."""

    config: str
    value: str

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        return cls(*_strings(frame, "config", "value"))


@dataclass(frozen=True)
class SetMode(BaseCommand, frame_type="set_mode", socket=True):
    """Switch the agent to one of its modes; stored as a `current_mode_update` event."""

    mode: str

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        return cls(*_strings(frame, "mode"))


def _strings(frame: dict[str, Any], *names: str) -> list[str]:
    """Return the frame's values of `names`, each checked to be a string."""
    values = [frame.get(name) for name in names]
    if not all(isinstance(value, str) for value in values):
        wanted = " and ".join(f"'{name}'" for name in names)
        what = f"{wanted} strings" if len(names) > 1 else f"a {wanted} string"
        raise Refused("bad_frame", f"{frame['type']} needs {what}")
    return [str(value) for value in values]


@dataclass(frozen=True)
class Revert(BaseCommand, frame_type="revert"):
    """Put the workspace back as it was before change `seq` (a turn, by its user_message's
    seq, or an earlier revert): all of it, one file (`path`), or one hunk of that file; stored
    as a `workspace_reverted` event (docs/workspace.md). Over HTTP (`parse_revert`). Refused
    while a turn runs, and when the change has no checkpoints or the hunk no longer applies."""

    seq: int
    path: str = ""
    hunk: int | None = None


@dataclass(frozen=True)
class Fork(BaseCommand, frame_type="fork"):
    """Make session `new_id` from this one as it was just after turn `seq` (its user_message's
    seq), or just before it (`before`): the conversation and the workspace
    (craft.turns.going_back). Over HTTP (`craft.services.fork_session`)."""

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
class Rewind(BaseCommand, frame_type="rewind"):
    """Take the session back to just after turn `seq`: its workspace to the checkpoint after
    that turn, its later turns set aside (a `rewound` event names them), and its agent's
    conversation (a new agent session, given the transcript of the turns kept). Over HTTP.
    Refused `turn_running` while a turn runs, `invalid`, `nothing_to_rewind`,
    `no_checkpoint`."""

    seq: int


@dataclass(frozen=True)
class EditQueued(BaseCommand, frame_type="edit_queued", socket=True):
    """Replace the text of a queued prompt that has not started (refused with `not_queued`
    once it has)."""

    id: str
    text: str

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        return cls(_queued_id(frame), _prompt_text(frame.get("text"), cls.frame_type))


@dataclass(frozen=True)
class RemoveQueued(BaseCommand, frame_type="remove_queued", socket=True):
    """Take a queued prompt that has not started out of the queue (refused with `not_queued`
    once it has)."""

    id: str

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        return cls(_queued_id(frame))


@dataclass(frozen=True)
class SendNow(BaseCommand, frame_type="send_now", socket=True):
    """Steer: run this queued prompt next, cancelling the running turn for it (refused with
    `not_queued` once it has started)."""

    id: str

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        return cls(_queued_id(frame))


def _queued_id(frame: dict[str, Any]) -> str:
    """Return the queued prompt's `id` a queue change names, checked."""
    client_id = frame.get("id")
    if not isinstance(client_id, str) or not is_client_id(client_id):
        raise Refused("bad_frame", f"{frame['type']} needs the queued prompt's 'id'")
    return client_id


@dataclass(frozen=True)
class RunQueue(BaseCommand, frame_type="run_queue"):
    """Start the session's next queued prompt if nothing runs (the server's own command: after
    a restart or a takeover, or once the sandbox is ready; never a client frame)."""


@dataclass(frozen=True)
class Resume(BaseCommand, frame_type="resume", socket=True):
    """Send the stored events after `after`, then follow the session live (the socket's own)."""

    after: int

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Self:
        after = frame.get("after", 0)
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63:
            raise Refused("bad_frame", "resume needs 'after': a non-negative integer")
        return cls(after)


@dataclass(frozen=True)
class StartAgent(BaseCommand, frame_type="start_agent", socket=True):
    """Start the session's agent now if none runs, so that what it offers (config options,
    modes, commands) is known before the first prompt; stored as events (`agent_info`, its
    commands). A start that fails is refused (`agent_not_started`, saying why)."""


# Over HTTP (POST .../repository/...), or between workers; never a socket frame.


@dataclass(frozen=True)
class PrepareRepository(BaseCommand, frame_type="prepare_repository"):
    """Clone the session's repository into its workspace and run its set-up, if that is not
    done yet (the server's own command: when the session is opened, or after a restart);
    `repository_status` events follow it. Nothing for a session without one."""


@dataclass(frozen=True)
class CommitRepository(BaseCommand, frame_type="commit_repository"):
    """Commit everything in the workspace to the session's branch (`message`: "" drafts one);
    stored as `repository_committed`. Refused `nothing_to_commit`, `turn_running`,
    `repository_not_ready`, `no_repository`."""

    message: str = ""


@dataclass(frozen=True)
class PushRepository(BaseCommand, frame_type="push_repository"):
    """Push the session's branch to the remote (never forced); stored as `repository_pushed`."""


@dataclass(frozen=True)
class OpenPullRequest(BaseCommand, frame_type="open_pull_request"):
    """Push if need be, then open a pull request of the session's branch against its base
    through the host's API ("" drafts the text from the session); stored as
    `pull_request_opened`."""

    title: str = ""
    body: str = ""
    link: str = ""  # the session's page, for the body


@dataclass(frozen=True)
class UpdateRepository(BaseCommand, frame_type="update_repository"):
    """Fetch the base branch and merge it into the session's branch (conflicts are left in the
    files for the agent or the person); stored as `repository_updated`."""


@dataclass(frozen=True)
class RefreshPullRequest(BaseCommand, frame_type="refresh_pull_request"):
    """Read the pull request's state from its host again unless it was read a moment ago (the
    server's own command); a change is stored as `pull_request_updated`."""


@dataclass(frozen=True)
class Seen(BaseCommand, frame_type="seen", socket=True):
    """The person has now looked at everything the session's page shows (the socket's own)."""


@dataclass(frozen=True)
class FollowSessions(BaseCommand, frame_type="follow_sessions", socket=True):
    """Send a `sessions` frame whenever one of the person's sessions changes what a list of
    sessions shows (the socket's own)."""


# What the session's owner carries out; the others stay with the socket that received them.
SessionCommand = (
    Prompt | Cancel | AnswerPermission | AnswerElicitation | SetConfigOption | SetMode | Revert
    | Fork | Rewind | EditQueued | RemoveQueued | SendNow | RunQueue | StartAgent
    | PrepareRepository | CommitRepository | PushRepository | OpenPullRequest | UpdateRepository
    | RefreshPullRequest
)  # fmt: skip
SocketCommand = Resume | Seen | FollowSessions
Command = SessionCommand | SocketCommand


def parse(frame: dict[str, Any]) -> Command:
    """Return the command a client frame (a JSON object with a string `type`) asks for, or
    raise Refused saying what is wrong with it."""
    kind = frame["type"]
    command = COMMANDS.get(kind)
    if command is None or not command.from_socket:
        raise Refused("unknown_type", f"unknown frame type {kind!r}")
    return cast(Command, command.parse(frame))


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


def _prompt_text(text: Any, frame_type: str) -> str:
    if not isinstance(text, str):
        raise Refused("bad_frame", f"{frame_type} needs a 'text' string")
    if not text.strip():
        raise Refused("empty_prompt", "a prompt needs some text")
    if len(text) > MAX_PROMPT_CHARS:
        raise Refused("prompt_too_long", f"prompts are limited to {MAX_PROMPT_CHARS} characters")
    # The agent gets the prompt as it is stored: text no one could encode is cleaned.
    return clean_text(text)


# --- between workers -------------------------------------------------------------------------


def to_wire(command: SessionCommand) -> dict[str, Any]:
    """Return the command as a message for another worker (it was checked here already)."""
    return {"type": command.frame_type, **dataclasses.asdict(command)}


def from_wire(message: dict[str, Any]) -> SessionCommand:
    """Return the command another worker sent with `to_wire` (through the signed layer)."""
    fields = {key: value for key, value in message.items() if key != "type"}
    return cast(SessionCommand, COMMANDS[message["type"]].from_wire(fields))


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
