"""ACP, the Agent Client Protocol, as Craft speaks it: JSON-RPC 2.0, one JSON object per line.

What the messages are, apart from any connection: the protocol version and what Craft says it
can do (`CLIENT_CAPABILITIES`), how a line is parsed (`parse_line`), what Craft reads of each
answer and how it checks it (`ANSWER_SHAPES`, `answer_of`), the errors an agent's answers
become (`AgentError` and its kinds), what a turn yields in wire order (`Update`,
`PermissionRequest`, `ElicitationRequest`, `RequestWithdrawn`, `TurnEnd`, `TurnFailed`: the
`TurnItem`s a `Sink` takes), and how a permission request's options and an agent's
`authMethods` are read (`normalise_options`, `read_auth_methods`). The conversation itself,
one agent process's, is `sandboxes.agent.connection.AgentConnection`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

PROTOCOL_VERSION = 1
CLIENT_INFO = {"name": "craft", "title": "Craft", "version": "0.1.0"}

# JSON-RPC error codes used when we answer the agent.
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
REQUEST_CANCELLED = -32800  # ACP: the answer to a request withdrawn with $/cancel_request
# ACP's error code for "authenticate first" (the agent's `authMethods` say how).
AUTH_REQUIRED = -32000

# Every byte a digit or not: a run of 19 digits may be an integer past 64 bits.
_DIGIT_RUNS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_NUMBER = b"0" * 19


def parse_line(line: bytes) -> Any:
    """Parse one line of an agent's JSON as `json.loads` does (ValueError or RecursionError
    if it is not JSON).

    orjson parses a line four times faster and gives the same value, except that it makes an
    integer past 64 bits a float (json keeps it exact): a line with a run of 19 digits takes
    json's way, as does every line orjson refuses (NaN, a lone surrogate's escape, nesting
    past 1,024 levels, bytes that are not UTF-8), so that json says what is wrong with it.
    """
    if _LONG_NUMBER not in line.translate(_DIGIT_RUNS):
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    # ACP is UTF-8; a bad byte spoils one character, not the line. Decoding here spares
    # json.loads its encoding detection.
    return json.loads(line.decode("utf-8", "replace"))


# What Craft tells the agent it can do. `_meta.terminal_output`: tool calls may carry live
# command output in their `_meta` (`terminal_info`, `terminal_output`, `terminal_exit`), as
# Zed's agents send it; `elicitation`: forms and URLs for the person (both modes).
CLIENT_CAPABILITIES: dict[str, Any] = {
    "fs": {"readTextFile": False, "writeTextFile": False},
    "terminal": False,
    "elicitation": {"form": {}, "url": {}},
    "_meta": {"terminal_output": True},
}


class AgentError(Exception):
    """The agent answered with an error, died, or did not answer in time.

    `details` go into the stored `agent_error` beside the message: what the agent wrote to
    stderr (see `AgentConnection.stderr_details`), when it did.
    """

    def __init__(self, message: str = "", details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


class TurnInProgress(AgentError):
    """A prompt was sent while another turn of this connection was still running."""


class PromptNotSent(AgentError):
    """Writing `session/prompt` failed: the agent never got the prompt, another one may."""


class MalformedAnswer(AgentError):
    """The agent answered a request with something JSON-RPC or ACP does not allow."""


class AuthRequired(AgentError):
    """The agent answered that someone must authenticate first (ACP error -32000).

    `methods` are the agent's `authMethods` (from `initialize`) as `{"id", "name",
    "description"}`, once the connection has added them.
    """

    def __init__(
        self,
        message: str,
        methods: list[dict[str, str]] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, details)
        self.methods = methods or []


# What an agent says within one turn: its words, thoughts, tool calls and plan (and Craft's
# note that a tool call's output was cut). ACP has every update of a turn come before the
# answer to its `session/prompt`; those that come after it belong to a turn that has ended
# (a cancelled Claude Code turn's last words, seen), and are dropped and counted, never
# stored after that turn's `turn_end`. What an agent says of the session (its commands,
# modes, options, usage, title, a finished URL elicitation, unknown kinds) may come any time.
TURN_UPDATES = frozenset(
    {
        "agent_message_chunk", "agent_thought_chunk", "user_message_chunk", "tool_call",
        "tool_call_update", "plan", "terminal_output_limited",
    }
)  # fmt: skip


# What Craft reads of the agent's answer to each request it sends, and so checks before anyone
# reads it: whether the result may be null, and its fields as name -> (type, required). A
# field that is null counts as absent. Answers to other methods are taken as they come.
ANSWER_SHAPES: dict[str, tuple[bool, dict[str, tuple[type, bool]]]] = {
    "initialize": (False, {"agentInfo": (dict, False), "agentCapabilities": (dict, False)}),
    "session/new": (False, {"sessionId": (str, True)}),
    "session/resume": (True, {}),
    "session/load": (True, {}),
    # A prompt answered null or without a stopReason ended normally (`end_turn`).
    "session/prompt": (True, {"stopReason": (str, False)}),
    "session/set_config_option": (False, {"configOptions": (list, True)}),
    "session/set_mode": (True, {}),
}


def json_kind(value: Any) -> str:
    """Return what a JSON value is, as a message says it ("a list", "null", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return "a number"


def answer_of(method: str, message: dict[str, Any]) -> Any:
    """Return the result of the agent's answer to a `method` request.

    Raise AgentError when the agent answered with an error, and MalformedAnswer, saying
    what is wrong, when the answer is not what JSON-RPC and ACP allow for `method` (see
    `ANSWER_SHAPES`): whoever waits for it then never reads a field of the wrong type.
    """
    said = f"the agent answered {method}"
    error = message.get("error")
    if error is not None:
        if message.get("result") is not None:
            raise MalformedAnswer(f"{said} with both a result and an error")
        if not isinstance(error, dict):
            raise MalformedAnswer(f"{said} with an error that is {json_kind(error)}, not an object")
        text, code = error.get("message"), error.get("code")
        if not isinstance(text, str):
            raise MalformedAnswer(
                f"{said} with an error whose message is {json_kind(text)}, not a string"
            )
        if code == AUTH_REQUIRED and type(code) is int:
            raise AuthRequired(f"{text} (code {code})")
        raise AgentError(f"{text} (code {code})" if type(code) is int else text)
    result = message.get("result")
    if method not in ANSWER_SHAPES:
        return result
    null_ok, fields = ANSWER_SHAPES[method]
    if result is None and null_ok:
        return result
    if not isinstance(result, dict):
        raise MalformedAnswer(f"{said} with {json_kind(result)}, not an object")
    for name, (kind, required) in fields.items():
        value = result.get(name)
        if value is None:
            if required:
                raise MalformedAnswer(f"{said} without {name}")
        elif not isinstance(value, kind):
            wanted = json_kind(kind())
            raise MalformedAnswer(f"{said} with {name} as {json_kind(value)}, not {wanted}")
    return result


# --- What a turn yields, in wire order ----------------------------------------------------


class Update(NamedTuple):
    """A `session/update` as the agent sent it; `kind` is its `sessionUpdate`.

    A tuple rather than a dataclass: one is made for every streamed token.
    """

    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class PermissionRequest:
    """The agent asks before acting; answer with `AgentConnection.answer_permission`."""

    request_id: str
    tool_call: dict[str, Any]
    options: list[dict[str, Any]]


@dataclass(frozen=True)
class ElicitationRequest:
    """The agent asks the person for information (`elicitation/create`): a form (`fields`,
    see `sandboxes.elicitation`) or a URL to open. Answer with
    `AgentConnection.answer_elicitation`; `refused` says why Craft answered it already."""

    request_id: str
    mode: str  # "form" or "url"
    message: str
    fields: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    elicitation_id: str = ""
    tool_call_id: str = ""
    refused: str = ""


@dataclass(frozen=True)
class RequestWithdrawn:
    """The agent withdrew its own open request (`$/cancel_request`): `kind` is
    "permission" or "elicitation"."""

    request_id: str
    kind: str


@dataclass(frozen=True)
class TurnEnd:
    """The prompt's response arrived; `stop_reason` is ACP's stopReason."""

    stop_reason: str


@dataclass(frozen=True)
class TurnFailed:
    """The turn ended without a stopReason: an error response, or the agent went away.

    `details` go into the stored `agent_error` beside the message: the agent's `authMethods`
    when it asks for authentication, and what it wrote to stderr (`stderr`, `stderr_line`)."""

    message: str
    details: dict[str, Any] = field(default_factory=dict)


TurnItem = Update | PermissionRequest | ElicitationRequest | RequestWithdrawn | TurnEnd | TurnFailed
Sink = Callable[[TurnItem], None]


def normalise_options(raw: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return the usable options of a permission request, and their ids as the agent sent them.

    ACP says an option is an object with a string `optionId`, `name` and `kind`; agents have
    sent numbers, nulls and objects instead. Options that are not objects, or have no id, are
    dropped; other ids become strings (JSON text for non-strings), the first of two equal ids
    wins, and `name` and `kind` become strings. The agent is answered with its own id.
    """
    options: list[dict[str, Any]] = []
    original_ids: dict[str, Any] = {}
    for option in raw if isinstance(raw, list) else []:
        if not isinstance(option, dict) or option.get("optionId") is None:
            continue
        original = option["optionId"]
        option_id = original if isinstance(original, str) else json.dumps(original)
        if option_id in original_ids:
            continue
        original_ids[option_id] = original
        name, kind = option.get("name"), option.get("kind")
        options.append(
            {
                **option,
                "optionId": option_id,
                "name": name if isinstance(name, str) else option_id,
                "kind": kind if isinstance(kind, str) else "",
            }
        )
    return options, original_ids


def read_auth_methods(raw: Any) -> list[dict[str, str]]:
    """Return the agent's `authMethods` as `{"id", "name", "description"}` strings (at most
    20; those without a name are named by their id, those without either dropped)."""
    methods: list[dict[str, str]] = []
    for method in raw[:20] if isinstance(raw, list) else []:
        if not isinstance(method, dict):
            continue
        ident, name, description = (method.get(k) for k in ("id", "name", "description"))
        ident = ident if isinstance(ident, str) else ""
        name = name if isinstance(name, str) and name else ident
        if name:
            description = description if isinstance(description, str) else ""
            methods.append(
                {"id": ident[:200], "name": name[:200], "description": description[:500]}
            )
    return methods
