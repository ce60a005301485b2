"""A small, deterministic coding agent that speaks the Agent Client Protocol (ACP).

Craft runs coding agents inside sandboxes and talks to them over ACP: JSON-RPC 2.0
messages, one JSON object per line, on the agent's stdin and stdout (logs go to stderr).
This module is a real ACP agent that needs no network and no model. The first word of
each prompt picks a scenario (see ``SCENARIOS`` and docs/demo-agent.md): it can stream
text and thoughts, publish a plan, ask for permission and then really write a file in
the session's working directory, read files, stream slowly so cancellation can be tried,
and misbehave on purpose (crash, print non-JSON, send huge lines or unknown update kinds)
so the client's error handling can be tested.

It keeps each session's state (what it was asked to remember, the conversation, its
settings) in a file in the session's working directory, so a new process can resume or
load the session (`--restore` says which of the two it advertises). It offers slash
commands, config options and modes (`--controls`), reports usage, and names the session
when asked.

What it does not do: it has no model and does not understand prompts; it does not accept
audio, connect to MCP servers, or use the client's terminal. It never touches files
outside the session's working directory.

It uses only the standard library and imports nothing from the project, because it also
runs inside sandbox container images and through Kubernetes pod exec.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

NAME = "craft-demo-agent"
VERSION = "1.2.0"
PROTOCOL_VERSION = 1

# Where a session's state lives, relative to its working directory.
STATE_DIR = ".craft-demo-agent"
# The context window the agent reports in usage_update, in (pretend) tokens.
CONTEXT_TOKENS = 100_000
FRESH_MARKER = "I remember nothing: this is a fresh start."
HISTORY_CHARS = 10_000

# JSON-RPC 2.0 error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002
AUTH_REQUIRED = -32000
REQUEST_CANCELLED = -32800
# The sign-in ways `--auth` advertises (and then insists on: every session is refused).
AUTH_METHODS = [
    {"id": "demo-login", "name": "Demo login", "description": "Sign in with a demo account"},
    {"id": "demo-key", "name": "Demo API key", "description": "Set DEMO_API_KEY in the sandbox"},
]

PERMISSION_OPTIONS = [
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]
# The `ask` scenario offers every kind of option ACP has, each under the agent's own name.
ALL_PERMISSION_OPTIONS = [
    {"optionId": "once", "name": "Yes, this time", "kind": "allow_once"},
    {"optionId": "always", "name": "Yes, and don't ask again", "kind": "allow_always"},
    {"optionId": "no", "name": "No, not this time", "kind": "reject_once"},
    {"optionId": "never", "name": "No, and don't ask again", "kind": "reject_always"},
]

MODELS = [
    ("fast", "Demo fast", "Answers at once"),
    ("careful", "Demo careful", "Thinks before it answers"),
]
MODES = [
    ("ask", "Ask", "Asks before changing files"),
    ("code", "Code", "Changes files without asking"),
]
COMMANDS = [
    ("remember", "Remember a word for later", "a word"),
    ("recall", "Say what you asked me to remember", None),
    ("config", "Say which model and mode are in use", None),
    ("title", "Name this session", "a title"),
    ("demo", "The guided tour", None),
    ("plan", "Show a plan that progresses", None),
]

DEMO_FILE = "hello.txt"
DEMO_CONTENT = "Hello from the Craft demo agent\n"

# Each line of the `big` payload is exactly 64 bytes of UTF-8 (61 characters), so one
# MiB is exactly 16384 lines. The counter makes reordered or dropped data easy to spot.
BIG_LINE_BYTES = 64
BIG_LINE_TEMPLATE = "{:08d} Craft demo agent big payload é✓ ...................\n"
BIG_MAX_MEGABYTES = 100


def log(message: str) -> None:
    """Write one diagnostic line to stderr; stdout is reserved for the protocol."""
    print(f"{NAME}: {message}", file=sys.stderr, flush=True)


def format_exc() -> str:
    """The exception being handled, with its traceback (imported only then: a start of the
    agent stays quick)."""
    import traceback

    return traceback.format_exc()


class Cancelled(Exception):
    """Raised inside a scenario when its turn has been cancelled by the client."""


class PromptFailed(Exception):
    """Raised by a scenario to answer session/prompt with a JSON-RPC error."""

    def __init__(self, message: str, code: int = -32603) -> None:
        super().__init__(message)
        self.code = code


class UsageError(Exception):
    """Raised when a scenario's arguments cannot be parsed; carries the usage text."""


class PathRefused(Exception):
    """Raised when a path would leave the session's working directory."""


class RpcError(Exception):
    """Raised while handling a client request to answer it with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Session:
    """One ACP session: a working directory and at most one running prompt turn.

    What a later process needs to continue the session (`STATE_FIELDS`) is saved to
    `<cwd>/.craft-demo-agent/<session id>.json` after every change.
    """

    session_id: str
    cwd: Path
    turn: Turn | None = None
    tool_call_numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    memory: list[str] = field(default_factory=list)
    # The conversation as (role, text) pairs, role "user" or "agent": replayed by session/load.
    history: list[list[str]] = field(default_factory=list)
    model: str = MODELS[0][0]
    mode: str = MODES[0][0]
    used: int = 0  # tokens "in context", for usage_update

    STATE_FIELDS = ("memory", "history", "model", "mode", "used")

    @property
    def state_file(self) -> Path:
        return state_file(self.cwd, self.session_id)

    def save(self) -> None:
        """Write the session's state atomically (a crash leaves the old or the new file)."""
        state = {name: getattr(self, name) for name in self.STATE_FIELDS}
        path = self.state_file
        path.parent.mkdir(exist_ok=True)
        # One temporary file per thread: a turn and a settings change may save at once.
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        temporary.write_text(json.dumps(state, ensure_ascii=False), encoding="utf-8")
        os.replace(temporary, path)

    def restore(self) -> None:
        """Read the state a previous process saved; raise OSError or ValueError if none."""
        state = json.loads(self.state_file.read_text(encoding="utf-8"))
        if not isinstance(state, dict):
            raise ValueError("the state file does not hold an object")
        for name in self.STATE_FIELDS:
            if name in state and isinstance(state[name], type(getattr(self, name))):
                setattr(self, name, state[name])


def state_file(cwd: Path, session_id: str) -> Path:
    """Return where the state of `session_id` lives (its id is checked to be a file name)."""
    if not re.fullmatch(r"demo-[0-9a-f]{32}", session_id):
        raise RpcError(RESOURCE_NOT_FOUND, f"Resource not found: session {session_id}")
    return cwd / STATE_DIR / f"{session_id}.json"


@dataclass(frozen=True)
class Options:
    """What the agent advertises, chosen on its command line."""

    restore: str = "both"  # which of session/resume and session/load: both, resume, load, none
    controls: str = "both"  # config options, modes, both or none
    images: bool = True
    embedded_context: bool = True
    replay_on_resume: bool = False  # replay history on session/resume too, as some agents do
    close: bool = False  # advertise and answer session/close
    auth: bool = False  # advertise AUTH_METHODS and refuse every session: authenticate first


@dataclass
class PendingRequest:
    """A request this agent sent to the client and is still waiting on."""

    turn: Turn | None
    done: threading.Event = field(default_factory=threading.Event)
    response: dict[str, Any] | None = None


class Turn:
    """One running session/prompt: what a scenario sees of the connection."""

    def __init__(
        self,
        agent: Agent,
        session: Session,
        text: str,
        attachments: list[dict[str, Any]] | None = None,
    ) -> None:
        self.agent = agent
        self.session = session
        self.text = text
        self.attachments = attachments or []
        # How many of the user's messages a transcript given with the prompt held (None: no
        # transcript: see `take_transcript`).
        self.transcript_heard: int | None = None
        words = text.split(maxsplit=1)
        # A slash command ("/recall") runs the scenario of the same name.
        self.word = words[0].lower().removeprefix("/") if words else ""
        self.args = words[1] if len(words) > 1 else ""
        self.cancelled = threading.Event()
        self.said: list[str] = []  # the agent's message text, for the session's history

    @property
    def cwd(self) -> Path:
        """Return the session's working directory."""
        return self.session.cwd

    def check_cancelled(self) -> None:
        """Raise Cancelled if the client has cancelled this turn."""
        if self.cancelled.is_set():
            raise Cancelled

    def sleep(self, seconds: float) -> None:
        """Wait, but wake up at once and raise Cancelled if the turn is cancelled."""
        if self.cancelled.wait(max(seconds, 0.0)):
            raise Cancelled

    def update(self, update: dict[str, Any]) -> None:
        """Send one session/update notification for this session."""
        params = {"sessionId": self.session.session_id, "update": update}
        self.agent.send({"jsonrpc": "2.0", "method": "session/update", "params": params})

    def chunk(self, text: str, kind: str = "agent_message_chunk") -> None:
        """Send one message (or thought) chunk."""
        if kind == "agent_message_chunk" and len(self.said) < 1000:
            self.said.append(text)
        self.update({"sessionUpdate": kind, "content": {"type": "text", "text": text}})

    def stream(self, text: str, kind: str = "agent_message_chunk") -> None:
        """Send text as several chunks, one word plus its following whitespace each."""
        for piece in re.findall(r"\s*\S+\s*", text) or [text]:
            self.chunk(piece, kind)

    def plan(self, entries: list[tuple[str, str, str]]) -> None:
        """Send the complete plan; entries are (content, priority, status)."""
        self.update(
            {
                "sessionUpdate": "plan",
                "entries": [
                    {"content": content, "priority": priority, "status": status}
                    for content, priority, status in entries
                ],
            }
        )

    def new_tool_call_id(self) -> str:
        """Return a tool call id that is unique within the session."""
        return f"call-{next(self.session.tool_call_numbers)}"

    def tool_call_update(self, tool_call_id: str, **fields: Any) -> None:
        """Send a tool_call_update carrying only the fields that changed."""
        self.update({"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id, **fields})

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request to the client and return its response (result or error)."""
        return self.agent.request(method, params, self)

    def request_and_withdraw(
        self, method: str, params: dict[str, Any], after: float
    ) -> dict[str, Any]:
        """Send a request; if the client has not answered within `after` seconds, withdraw
        it with `$/cancel_request` and return the answer the client then owes."""
        return self.agent.request(method, params, self, withdraw_after=after)

    def ask_permission(self, tool_call: dict[str, Any]) -> bool:
        """Ask the client whether a tool call may run; return True only for "allow".

        A cancelled outcome, or a session/cancel while waiting, raises Cancelled.
        A JSON-RPC error or any other option counts as a rejection.
        """
        return self.choose(tool_call, PERMISSION_OPTIONS) == "allow"

    def choose(self, tool_call: dict[str, Any], options: list[dict[str, Any]]) -> str | None:
        """Ask the client to pick one of `options`; return the option id, None if none.

        A cancelled outcome, or a session/cancel while waiting, raises Cancelled.
        """
        params = {
            "sessionId": self.session.session_id,
            "toolCall": tool_call,
            "options": options,
        }
        response = self.request("session/request_permission", params)
        if "error" in response:
            log(f"permission request failed, treating as rejected: {response['error']}")
            return None
        result = response.get("result")
        outcome = result.get("outcome") if isinstance(result, dict) else None
        if not isinstance(outcome, dict):
            return None
        if outcome.get("outcome") == "cancelled":
            raise Cancelled
        chosen = outcome.get("optionId")
        if outcome.get("outcome") != "selected" or not isinstance(chosen, str):
            return None
        return chosen


class Agent:
    """The ACP connection: reads client messages, runs turns, writes agent messages."""

    def __init__(self, out: BinaryIO, options: Options | None = None) -> None:
        self.options = options or Options()
        self._out = out
        # What to send once the answer to the request being handled is out (commands after
        # session/new, say): ACP clients must take updates that follow an answer.
        self._after_answer: list[Callable[[], None]] = []
        self._out_closed = False
        # One lock for stdout so concurrent turns never interleave partial lines.
        self._write_lock = threading.Lock()
        # One lock for sessions, turns and pending requests, which several threads touch.
        self._state_lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._pending: dict[int | str, PendingRequest] = {}
        self._request_ids = itertools.count()
        self._workers: list[threading.Thread] = []
        # What the client said it can do at initialize (terminal output, elicitation).
        self.client_capabilities: dict[str, Any] = {}
        # Client requests of `_demo/wait` still waiting: request id -> its wake-up event.
        self._waits: dict[Any, threading.Event] = {}

    # -- writing ---------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        """Write one JSON-RPC message as a single UTF-8 line and flush it."""
        try:
            line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
            data = (line + "\n").encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates (legal in JSON input) cannot be raw UTF-8; escape them.
            data = (json.dumps(message, separators=(",", ":")) + "\n").encode("ascii")
        self.send_raw(data)

    def send_raw(self, data: bytes) -> None:
        """Write bytes to stdout under the write lock; survive a vanished reader."""
        with self._write_lock:
            if self._out_closed:
                return
            try:
                self._out.write(data)
                self._out.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                self._out_closed = True
                log(f"stdout is gone ({exc}); dropping further output")
                # Point fd 1 at /dev/null so interpreter shutdown cannot fail on it.
                try:
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, self._out.fileno())
                except (OSError, ValueError, AttributeError):
                    pass

    def respond(self, request_id: Any, result: dict[str, Any]) -> None:
        """Send a successful response."""
        self.send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def respond_error(self, request_id: Any, code: int, message: str) -> None:
        """Send an error response."""
        error = {"code": code, "message": message}
        self.send({"jsonrpc": "2.0", "id": request_id, "error": error})

    # -- reading ---------------------------------------------------------------------

    def serve(self, lines: Iterable[bytes]) -> int:
        """Handle stdin lines until EOF, then stop running turns; return the exit status."""
        for raw in lines:
            self.handle_line(raw)
        log("stdin closed; exiting")
        self.shutdown()
        return 0

    def handle_line(self, raw: bytes) -> None:
        """Parse one input line and route it as a request, notification or response."""
        if not raw.strip():
            return
        try:
            message = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            log(f"ignoring malformed input line ({exc}): {raw[:200]!r}")
            self.respond_error(None, PARSE_ERROR, f"Parse error: {exc}")
            return
        if not isinstance(message, dict):
            self.respond_error(None, INVALID_REQUEST, "Invalid Request: expected a JSON object")
            return
        has_id = "id" in message
        try:
            if "method" in message and has_id:
                self.handle_request(message)
            elif "method" in message:
                self.handle_notification(message)
            elif has_id:
                self.handle_response(message)
            else:
                self.respond_error(None, INVALID_REQUEST, "Invalid Request: no method and no id")
        except Exception as exc:  # odd input must never take the agent down
            log("failed to handle a message:\n" + format_exc())
            if "method" in message and has_id:
                self.respond_error(message["id"], INTERNAL_ERROR, f"Internal error: {exc}")

    def handle_request(self, message: dict[str, Any]) -> None:
        """Answer a client request (session/prompt is answered later by its worker)."""
        request_id = message["id"]
        method = message["method"]
        params = message.get("params")
        handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {
            "initialize": self.initialize,
            "authenticate": lambda params: {},
            "session/new": self.new_session,
            "session/prompt": lambda params: self.start_prompt(request_id, params),
            "session/set_config_option": self.set_config_option,
            "session/set_mode": self.set_mode,
        }
        if self.options.close:
            handlers["session/close"] = self.close_session
        if self.options.restore in ("both", "resume"):
            handlers["session/resume"] = lambda params: self.open_session(params, replay=False)
        if self.options.restore in ("both", "load"):
            handlers["session/load"] = lambda params: self.open_session(params, replay=True)
        if method == "_demo/wait" and isinstance(params, dict):
            self.start_wait(request_id, params)
            return
        handler = handlers.get(method) if isinstance(method, str) else None
        if handler is None:
            self.respond_error(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")
            return
        self._after_answer = []
        try:
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, f"Invalid params: {method} needs an object")
            result = handler(params)
        except RpcError as exc:
            self.respond_error(request_id, exc.code, exc.message)
            return
        if result is not None:
            self.respond(request_id, result)
        for send in self._after_answer:
            send()

    def handle_notification(self, message: dict[str, Any]) -> None:
        """Act on session/cancel; ignore every other notification, as ACP allows."""
        params = message.get("params")
        if message["method"] == "session/cancel" and isinstance(params, dict):
            self.cancel(params.get("sessionId"))
        elif message["method"] == "$/cancel_request" and isinstance(params, dict):
            self.cancel_wait(params.get("requestId"))
        else:
            log(f"ignoring notification {message['method']!r}")

    def handle_response(self, message: dict[str, Any]) -> None:
        """Hand a client response to the turn waiting for it."""
        request_id = message["id"]
        if not isinstance(request_id, int | str):
            log(f"ignoring response with unusable id {request_id!r}")
            return
        with self._state_lock:
            pending = self._pending.pop(request_id, None)
            if pending is not None:
                pending.response = message
                pending.done.set()
        if pending is None:
            # Normal after a cancel: the client still answers the permission request.
            log(f"ignoring response to request id {request_id!r}: nobody is waiting")

    # -- methods ---------------------------------------------------------------------

    def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        """Answer initialize: protocol version 1 and the capabilities the options give."""
        client = params.get("clientInfo") or {}
        log(f"initialize from {client.get('name', 'unknown client')}")
        capabilities = params.get("clientCapabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        options = self.options
        sessions: dict[str, Any] = {}
        if options.restore in ("both", "resume"):
            sessions["resume"] = {}
        if options.close:
            sessions["close"] = {}
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": options.restore in ("both", "load"),
                "sessionCapabilities": sessions,
                "promptCapabilities": {
                    "image": options.images,
                    "audio": False,
                    "embeddedContext": options.embedded_context,
                },
            },
            "authMethods": AUTH_METHODS if options.auth else [],
            "agentInfo": {"name": NAME, "title": "Craft demo agent", "version": VERSION},
        }

    def new_session(self, params: dict[str, Any]) -> dict[str, Any]:
        """Create a session rooted at params["cwd"], which must be an existing directory."""
        self.check_authenticated()
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise RpcError(INVALID_PARAMS, f"Invalid params: cwd must be an absolute path: {cwd!r}")
        if not os.path.isdir(cwd):
            raise RpcError(INVALID_PARAMS, f"Invalid params: cwd is not a directory: {cwd}")
        session = Session(session_id=f"demo-{os.urandom(16).hex()}", cwd=Path(cwd))
        self.save(session)
        with self._state_lock:
            self._sessions[session.session_id] = session
        log(f"new session {session.session_id} in {cwd}")
        self._after_answer.append(lambda: self.send_commands(session))
        return {"sessionId": session.session_id, **self.controls(session)}

    def open_session(self, params: dict[str, Any], *, replay: bool) -> dict[str, Any]:
        """Continue a session an earlier process saved (session/resume, or session/load).

        A load replays the conversation as updates before it answers; a resume does not
        (unless `--replay-on-resume` asks it to misbehave that way).
        """
        self.check_authenticated()
        session_id, cwd = params.get("sessionId"), params.get("cwd")
        if not isinstance(session_id, str):
            raise RpcError(INVALID_PARAMS, "Invalid params: sessionId must be a string")
        if not isinstance(cwd, str) or not os.path.isabs(cwd) or not os.path.isdir(cwd):
            raise RpcError(INVALID_PARAMS, f"Invalid params: cwd is not a directory: {cwd!r}")
        session = Session(session_id=session_id, cwd=Path(cwd))
        try:
            session.restore()
        except (OSError, ValueError) as exc:
            raise RpcError(RESOURCE_NOT_FOUND, f"Resource not found: {session_id}") from exc
        with self._state_lock:
            known = self._sessions.get(session_id)
            if known is not None and known.turn is not None:
                raise RpcError(INVALID_PARAMS, "This session is running a prompt")
            self._sessions[session_id] = session
        log(f"{'loaded' if replay else 'resumed'} session {session_id} in {cwd}")
        if replay or self.options.replay_on_resume:
            for role, text in session.history:
                kind = "user_message_chunk" if role == "user" else "agent_message_chunk"
                update = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
                self.send(
                    {
                        "jsonrpc": "2.0",
                        "method": "session/update",
                        "params": {"sessionId": session_id, "update": update},
                    }
                )
        self._after_answer.append(lambda: self.send_commands(session))
        return self.controls(session)

    def start_wait(self, request_id: Any, params: dict[str, Any]) -> None:
        """Answer `_demo/wait` (an extension method) after `seconds`, or at once with error
        -32800 if the client withdraws it with `$/cancel_request` first."""
        seconds = params.get("seconds")
        seconds = float(seconds) if isinstance(seconds, int | float) else 1.0
        wake = threading.Event()
        with self._state_lock:
            self._waits[request_id] = wake

        def wait() -> None:
            cancelled = wake.wait(min(max(seconds, 0.0), 60.0))
            with self._state_lock:
                self._waits.pop(request_id, None)
            if cancelled:
                self.respond_error(request_id, REQUEST_CANCELLED, "Request cancelled")
            else:
                self.respond(request_id, {"waited": seconds})

        threading.Thread(target=wait, name="wait", daemon=True).start()

    def cancel_wait(self, request_id: Any) -> None:
        """Honour the client's `$/cancel_request`: stop a `_demo/wait` early (every other
        request of the client is answered at once, so nothing else is left to stop)."""
        with self._state_lock:
            wake = self._waits.get(request_id) if isinstance(request_id, int | str) else None
        log(f"client withdrew request {request_id!r}" + ("" if wake else " (already answered)"))
        if wake is not None:
            wake.set()

    def check_authenticated(self) -> None:
        """With `--auth`, refuse to open sessions: someone must authenticate first."""
        if self.options.auth:
            raise RpcError(AUTH_REQUIRED, "Authentication required")

    def close_session(self, params: dict[str, Any]) -> dict[str, Any]:
        """Close a session (session/close, with `--close`): cancel its prompt, forget it."""
        session = self.session_of(params)
        self.cancel(session.session_id)
        with self._state_lock:
            self._sessions.pop(session.session_id, None)
        log(f"closed session {session.session_id}")
        return {}

    def save(self, session: Session) -> None:
        """Save the session's state; a failure is logged (the session goes on in memory)."""
        try:
            session.save()
        except OSError as exc:
            log(f"cannot save session {session.session_id}: {exc}")

    def controls(self, session: Session) -> dict[str, Any]:
        """Return the configOptions and modes of a session/new, resume or load answer."""
        answer: dict[str, Any] = {}
        if self.options.controls in ("both", "config"):
            answer["configOptions"] = config_options(session)
        if self.options.controls in ("both", "modes"):
            answer["modes"] = {
                "currentModeId": session.mode,
                "availableModes": [
                    {"id": mode, "name": name, "description": text} for mode, name, text in MODES
                ],
            }
        return answer

    def send_commands(self, session: Session) -> None:
        """Tell the client which slash commands the session offers."""
        commands = []
        for name, description, hint in COMMANDS:
            command: dict[str, Any] = {"name": name, "description": description}
            if hint:
                command["input"] = {"hint": hint}
            commands.append(command)
        update = {"sessionUpdate": "available_commands_update", "availableCommands": commands}
        self.send(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": session.session_id, "update": update},
            }
        )

    def session_of(self, params: dict[str, Any]) -> Session:
        session_id = params.get("sessionId")
        with self._state_lock:
            session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise RpcError(INVALID_PARAMS, f"Unknown session: {session_id}")
        return session

    def set_config_option(self, params: dict[str, Any]) -> dict[str, Any]:
        """Change the model or the mode; answer with every config option as it is now."""
        session = self.session_of(params)
        config_id, value = params.get("configId"), params.get("value")
        if self.options.controls not in ("both", "config"):
            raise RpcError(METHOD_NOT_FOUND, "Method not found: session/set_config_option")
        choices = {"model": [m[0] for m in MODELS], "mode": [m[0] for m in MODES]}
        if config_id not in choices:
            raise RpcError(INVALID_PARAMS, f"Invalid params: no config option {config_id!r}")
        if value not in choices[config_id]:
            raise RpcError(INVALID_PARAMS, f"Invalid params: {value!r} is not a {config_id}")
        setattr(session, config_id, value)
        self.save(session)
        return {"configOptions": config_options(session)}

    def set_mode(self, params: dict[str, Any]) -> dict[str, Any]:
        """Switch the session's mode."""
        session = self.session_of(params)
        if self.options.controls not in ("both", "modes"):
            raise RpcError(METHOD_NOT_FOUND, "Method not found: session/set_mode")
        mode = params.get("modeId")
        if mode not in [m[0] for m in MODES]:
            raise RpcError(INVALID_PARAMS, f"Invalid params: no mode {mode!r}")
        session.mode = str(mode)
        self.save(session)
        return {}

    def start_prompt(self, request_id: Any, params: dict[str, Any]) -> None:
        """Start a worker thread for the prompt; it sends the response when done."""
        prompt = params.get("prompt")
        if not isinstance(prompt, list):
            raise RpcError(INVALID_PARAMS, "Invalid params: prompt must be a list")
        transcripts = [block for block in prompt if transcript_of(block) is not None]
        text = "".join(
            block["text"]
            for block in prompt
            if isinstance(block, dict)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
            and block not in transcripts
        )
        attachments = [
            block
            for block in prompt
            if isinstance(block, dict) and block.get("type") != "text" and block not in transcripts
        ]
        session_id = params.get("sessionId")
        with self._state_lock:
            session = self._sessions.get(session_id) if isinstance(session_id, str) else None
            if session is None:
                raise RpcError(INVALID_PARAMS, f"Unknown session: {session_id}")
            if session.turn is not None:
                raise RpcError(INVALID_PARAMS, "This session is already running a prompt")
            turn = Turn(self, session, text, attachments)
            session.turn = turn
            for block in transcripts:
                turn.transcript_heard = take_transcript(session, transcript_of(block) or "")
        worker = threading.Thread(
            target=self.run_turn, args=(turn, request_id), name="turn", daemon=True
        )
        # Forget finished workers so a long-lived agent does not collect them forever.
        self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()

    def run_turn(self, turn: Turn, request_id: Any) -> None:
        """Run a turn's scenario and send the session/prompt response."""
        result = {"stopReason": "end_turn"}
        error: tuple[int, str] | None = None
        try:
            scenario = SCENARIOS.get(turn.word)
            try:
                if turn.transcript_heard is not None:
                    turn.chunk(
                        f"I was given the conversation so far ({turn.transcript_heard} of your"
                        " messages).\n"
                    )
                if turn.attachments:
                    turn.chunk(describe_attachments(turn.attachments) + "\n")
                (scenario.run if scenario else scenario_echo)(turn)
            except UsageError as exc:
                turn.chunk(f"Usage: {exc}")
            # ACP: once the client has sent session/cancel the answer must be "cancelled",
            # even if the scenario happened to finish anyway.
            if turn.cancelled.is_set():
                result = {"stopReason": "cancelled"}
        except Cancelled:
            result = {"stopReason": "cancelled"}
        except PromptFailed as exc:
            error = (exc.code, str(exc))
        except Exception as exc:  # a bug in a scenario must not take the agent down
            log("scenario crashed:\n" + format_exc())
            error = (INTERNAL_ERROR, f"Internal error: {exc}")
        finally:
            self.remember_turn(turn)
            # Free the session before answering, so the client may prompt again at once.
            with self._state_lock:
                turn.session.turn = None
        if error is not None:
            self.respond_error(request_id, *error)
        else:
            self.respond(request_id, result)

    def remember_turn(self, turn: Turn) -> None:
        """Add the turn to the session's history, report usage, and save the session."""
        session = turn.session
        reply = "".join(turn.said)
        # Long texts are kept cut: the history is for the demo's replays, not an archive.
        session.history += [["user", turn.text[:HISTORY_CHARS]], ["agent", reply[:HISTORY_CHARS]]]
        del session.history[:-200]  # a demo, not an archive
        session.used = min(CONTEXT_TOKENS, session.used + (len(turn.text) + len(reply)) // 4 + 1)
        self.save(session)
        if turn.word not in ("crash", "fail") and not turn.cancelled.is_set():
            turn.update(
                {
                    "sessionUpdate": "usage_update",
                    "used": session.used,
                    "size": CONTEXT_TOKENS,
                    "cost": {"amount": round(session.used * 0.00001, 6), "currency": "USD"},
                }
            )

    def cancel(self, session_id: Any) -> None:
        """Cancel the session's running turn and stop it waiting on the client."""
        with self._state_lock:
            session = self._sessions.get(session_id) if isinstance(session_id, str) else None
            turn = session.turn if session else None
            if turn is None:
                return
            turn.cancelled.set()
            for pending in self._pending.values():
                if pending.turn is turn:
                    pending.done.set()
        log(f"cancelled the running prompt of session {session_id}")

    def request(
        self,
        method: str,
        params: dict[str, Any],
        turn: Turn,
        withdraw_after: float | None = None,
    ) -> dict[str, Any]:
        """Send a request to the client and block until it answers or the turn is cancelled.

        With `withdraw_after`, a request still unanswered after that many seconds is withdrawn
        (`$/cancel_request`); the client's answer to it (error -32800) is returned.
        """
        with self._state_lock:
            # Checked under the lock that cancel() takes, so a cancel cannot slip in
            # between this check and registering the request and leave us waiting forever.
            turn.check_cancelled()
            request_id = next(self._request_ids)
            pending = PendingRequest(turn)
            self._pending[request_id] = pending
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        try:
            if withdraw_after is not None and not pending.done.wait(withdraw_after):
                log(f"withdrawing request {request_id} ({method})")
                cancel = {"requestId": request_id}
                self.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": cancel})
            pending.done.wait()
        finally:
            with self._state_lock:
                self._pending.pop(request_id, None)
        turn.check_cancelled()
        if pending.response is None:
            raise Cancelled
        return pending.response

    def shutdown(self, grace: float = 1.0) -> None:
        """Cancel every running turn (nobody can answer any more) and let them finish."""
        with self._state_lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            self.cancel(session.session_id)
        for worker in self._workers:
            worker.join(timeout=grace)


# -- helpers shared by scenarios -------------------------------------------------------


def resolve_inside(cwd: Path, relative: str) -> Path:
    """Return the absolute path of `relative` in cwd, or raise PathRefused saying why."""
    if os.path.isabs(relative):
        raise PathRefused(
            f"Refused: {relative} is an absolute path; use a path relative to the working "
            "directory."
        )
    if ".." in Path(relative).parts:
        raise PathRefused(
            f"Refused: {relative} contains '..' and could leave the working directory."
        )
    path = Path(os.path.normpath(cwd / relative))
    # A symbolic link inside cwd could still point outside; compare real locations.
    if not path.resolve().is_relative_to(cwd.resolve()):
        raise PathRefused(f"Refused: {relative} leads outside the working directory.")
    return path


def open_inside(cwd: Path, relative: str, flags: int, *, make_parents: bool = False) -> int:
    """Open `relative` under cwd without following a symbolic link anywhere; return the fd.

    Checking a path and then opening it by name is a race: a folder on the way can be swapped
    for a link to elsewhere in between (the write waits for a person's permission, which makes
    the window wide). So every folder is opened relative to the one before it with O_NOFOLLOW,
    and the file itself too: what is opened is what lies inside cwd at that moment, or nothing.
    A link anywhere on the way raises PathRefused; `make_parents` creates missing folders
    (the last one too when a folder is opened, with O_DIRECTORY).
    """
    parts = Path(relative).parts
    if not parts or os.path.isabs(relative) or ".." in parts:
        raise PathRefused(f"Refused: {relative} is not a path inside the working directory.")
    folder_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            if make_parents:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # a folder, a file or a link: the open below tells them apart
            try:
                next_fd = os.open(name, folder_flags, dir_fd=fd)
            except OSError as exc:
                raise _refusal(relative, exc, name, fd) from exc
            os.close(fd)
            fd = next_fd
        if make_parents and flags & os.O_DIRECTORY:
            try:
                os.mkdir(parts[-1], 0o755, dir_fd=fd)
            except FileExistsError:
                pass
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        except OSError as exc:
            raise _refusal(relative, exc, parts[-1], fd) from exc
    finally:
        os.close(fd)


def _refusal(relative: str, exc: OSError, name: str, dir_fd: int) -> Exception:
    """Return PathRefused if `name` is a link (O_NOFOLLOW fails with ELOOP, or with ENOTDIR
    when O_DIRECTORY is asked too), else the error itself."""
    try:
        is_link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        is_link = False
    if is_link or exc.errno == errno.ELOOP:
        return PathRefused(f"Refused: {relative} goes through a symbolic link.")
    return exc


def read_inside(cwd: Path, relative: str) -> str:
    """Return the text of `relative` in cwd, read without following a symbolic link."""
    fd = open_inside(cwd, relative, os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, encoding="utf-8", errors="replace") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused(f"Refused: {relative} is not a regular file.")
        return handle.read()


def write_inside(cwd: Path, relative: str, content: str) -> None:
    """Write `relative` in cwd (creating folders) without following a symbolic link.

    A file with other hard links is refused too: writing it would change a file elsewhere.
    """
    # O_NONBLOCK: a FIFO planted under the name fails at once instead of hanging the turn.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK
    fd = open_inside(cwd, relative, flags, make_parents=True)
    with open(fd, "w", encoding="utf-8") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PathRefused(f"Refused: {relative} is not a regular file.")
        if info.st_nlink > 1:
            raise PathRefused(f"Refused: {relative} has other hard links.")
        handle.truncate(0)
        handle.write(content)


def text_content(text: str) -> dict[str, Any]:
    """Return a tool call content item holding plain text."""
    return {"type": "content", "content": {"type": "text", "text": text}}


def config_options(session: Session) -> list[dict[str, Any]]:
    """Return the session's config options (model and mode) with their current values."""

    def select(
        config_id: str, name: str, category: str, current: str, values: list[tuple[str, str, str]]
    ) -> dict[str, Any]:
        return {
            "id": config_id,
            "name": name,
            "category": category,
            "type": "select",
            "currentValue": current,
            "options": [
                {"value": value, "name": label, "description": text}
                for value, label, text in values
            ],
        }

    return [
        select("model", "Model", "model", session.model, MODELS),
        select("mode", "Mode", "mode", session.mode, MODES),
    ]


# The conversation so far, as a client gives it to a new session that continues an earlier
# one (Craft, after a fork or a rewind): a resource of this URI, or a text block so opening.
TRANSCRIPT_URI = "craft:transcript"
TRANSCRIPT_OPENING = "This conversation continues an earlier one"


def transcript_of(block: Any) -> str | None:
    """Return the transcript a prompt's block carries, or None if it is no transcript."""
    if not isinstance(block, dict):
        return None
    if block.get("type") == "text" and str(block.get("text", "")).startswith(TRANSCRIPT_OPENING):
        return str(block["text"])
    resource = block.get("resource")
    if block.get("type") != "resource" or not isinstance(resource, dict):
        return None
    if resource.get("uri") == TRANSCRIPT_URI and isinstance(resource.get("text"), str):
        return resource["text"]
    return None


def take_transcript(session: Session, transcript: str) -> int:
    """Learn the conversation so far from a transcript (the user's words in <user>, the
    agent's in <agent>): its history, and what the user asked it to remember. Return how
    many of the user's messages it held."""
    said = re.findall(r"<(user|agent)>\n(.*?)\n</\1>", transcript, flags=re.DOTALL)
    for role, text in said:
        session.history.append([role, text[:HISTORY_CHARS]])
        words = text.split()
        if role == "user" and words and words[0].lower().lstrip("/") == "remember":
            session.memory += words[1:]
    return sum(1 for role, _ in said if role == "user")


def describe_attachments(blocks: list[dict[str, Any]]) -> str:
    """Say what came with the prompt besides its text (resource links, resources, images)."""
    parts = []
    for block in blocks:
        kind = block.get("type")
        if kind == "resource_link":
            parts.append(f"link to {block.get('name') or block.get('uri')} ({block.get('uri')})")
        elif kind == "resource" and isinstance(block.get("resource"), dict):
            resource = block["resource"]
            size = len(resource["text"]) if isinstance(resource.get("text"), str) else 0
            parts.append(f"resource {resource.get('uri')} ({size} characters)")
        elif kind == "image" and isinstance(block.get("data"), str):
            size = len(block["data"]) * 3 // 4
            parts.append(f"image {block.get('mimeType')} (about {size} bytes)")
        else:
            parts.append(f"a block of type {kind!r} I do not read")
    return f"I received {len(parts)} attachment(s): " + "; ".join(parts) + "."


def parse_numbers(args: str, defaults: list[float], usage: str) -> list[float]:
    """Parse up to len(defaults) numbers from args, filling in defaults."""
    words = args.split()
    if len(words) > len(defaults):
        raise UsageError(usage)
    try:
        values = [float(word) for word in words]
    except ValueError:
        raise UsageError(usage) from None
    if any(value < 0 for value in values):
        raise UsageError(usage)
    return values + defaults[len(values) :]


def write_file(turn: Turn, relative: str, content: str) -> bool:
    """Write a file in cwd after asking permission, reporting it as an edit tool call.

    Returns True if the file was written. Raises Cancelled if the turn is cancelled.
    """
    tool_call_id = turn.new_tool_call_id()
    title = f"Write {relative}"
    try:
        path = resolve_inside(turn.cwd, relative)
        old_text = read_inside(turn.cwd, relative) if path.is_file() else None
    except (PathRefused, OSError) as exc:
        turn.update(
            {
                "sessionUpdate": "tool_call",
                "toolCallId": tool_call_id,
                "title": title,
                "kind": "edit",
                "status": "pending",
                "rawInput": {"path": relative, "content": content},
            }
        )
        turn.tool_call_update(tool_call_id, status="failed", content=[text_content(str(exc))])
        turn.chunk(f"Did not write {relative}.")
        return False

    diff = {"type": "diff", "path": str(path), "oldText": old_text, "newText": content}
    tool_call = {
        "toolCallId": tool_call_id,
        "title": title,
        "kind": "edit",
        "status": "pending",
        "locations": [{"path": str(path)}],
        "rawInput": {"path": relative, "content": content},
    }
    # Not `path`: what it named when it was checked may have been swapped for a link since.
    return change_after_permission(
        turn, tool_call, [diff], lambda: write_inside(turn.cwd, relative, content),
        f"Wrote {relative}.", f"Did not write {relative}.",
    )  # fmt: skip


def change_after_permission(
    turn: Turn,
    tool_call: dict[str, Any],
    content: list[dict[str, Any]],
    change: Callable[[], None],
    done: str,
    not_done: str,
) -> bool:
    """Announce a tool call that changes files, ask permission (showing `content`), then
    `change()`; report how it went. Returns True if the change was made. Raises Cancelled
    if the turn is cancelled."""
    tool_call_id = tool_call["toolCallId"]
    turn.update({"sessionUpdate": "tool_call", **tool_call})
    try:
        # What would change rides along so the person deciding can see it.
        allowed = turn.ask_permission({**tool_call, "content": content})
    except Cancelled:
        # Close the tool call so the client does not show it as pending forever.
        turn.tool_call_update(tool_call_id, status="failed", content=[text_content("Cancelled")])
        raise
    if not allowed:
        turn.tool_call_update(
            tool_call_id, status="failed", content=[text_content("Permission denied")]
        )
        turn.chunk(not_done)
        return False
    turn.tool_call_update(tool_call_id, status="in_progress")
    try:
        change()
    except (PathRefused, OSError) as exc:
        turn.tool_call_update(tool_call_id, status="failed", content=[text_content(str(exc))])
        turn.chunk(not_done)
        return False
    turn.tool_call_update(tool_call_id, status="completed", content=content)
    turn.chunk(done)
    return True


def folder_and_name(cwd: Path, relative: str) -> tuple[int, str]:
    """Open the folder holding `relative` (following no link); return it and the name."""
    parent, name = os.path.split(os.path.normpath(relative))
    if not name or name in (".", "..") or os.path.isabs(relative) or ".." in Path(relative).parts:
        raise PathRefused(f"Refused: {relative} is not a path inside the working directory.")
    if not parent:
        return os.open(cwd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), name
    return open_inside(cwd, parent, os.O_RDONLY | os.O_DIRECTORY), name


def delete_inside(cwd: Path, relative: str) -> None:
    """Delete file `relative` in cwd (a link itself, never what it points to)."""
    folder, name = folder_and_name(cwd, relative)
    try:
        os.unlink(name, dir_fd=folder)
    finally:
        os.close(folder)


def rename_inside(cwd: Path, old: str, new: str) -> None:
    """Rename `old` to `new` in cwd (creating folders); neither may lead through a link."""
    source, old_name = folder_and_name(cwd, old)
    try:
        parent = os.path.dirname(os.path.normpath(new))
        if parent:
            os.close(open_inside(cwd, parent, os.O_RDONLY | os.O_DIRECTORY, make_parents=True))
        target, new_name = folder_and_name(cwd, new)
        try:
            os.rename(old_name, new_name, src_dir_fd=source, dst_dir_fd=target)
        finally:
            os.close(target)
    finally:
        os.close(source)


def file_tool_call(turn: Turn, kind: str, title: str, paths: list[str]) -> dict[str, Any]:
    return {
        "toolCallId": turn.new_tool_call_id(),
        "title": title,
        "kind": kind,
        "status": "pending",
        "locations": [{"path": str(turn.cwd / path)} for path in paths],
        "rawInput": {"paths": paths},
    }


def read_file(turn: Turn, relative: str) -> str | None:
    """Read a text file in cwd, reporting it as a read tool call; return its text."""
    tool_call_id = turn.new_tool_call_id()
    tool_call: dict[str, Any] = {
        "sessionUpdate": "tool_call",
        "toolCallId": tool_call_id,
        "title": f"Read {relative}",
        "kind": "read",
        "status": "in_progress",
        "rawInput": {"path": relative},
    }
    try:
        path = resolve_inside(turn.cwd, relative)
    except PathRefused as exc:
        turn.update(tool_call)
        turn.tool_call_update(tool_call_id, status="failed", content=[text_content(str(exc))])
        return None
    turn.update({**tool_call, "locations": [{"path": str(path)}]})
    try:
        text = read_inside(turn.cwd, relative)
    except FileNotFoundError:
        problem = f"No such file: {relative}"
    except PathRefused as exc:
        problem = str(exc)
    except OSError as exc:
        problem = f"Cannot read {relative}: {exc.strerror or exc}"
    else:
        turn.tool_call_update(tool_call_id, status="completed", content=[text_content(text)])
        return text
    turn.tool_call_update(tool_call_id, status="failed", content=[text_content(problem)])
    return None


def big_text(megabytes: float) -> str:
    """Return deterministic text whose UTF-8 encoding is `megabytes` MiB (64-byte lines)."""
    lines = round(megabytes * 1024 * 1024 / BIG_LINE_BYTES)
    return "".join(BIG_LINE_TEMPLATE.format(number) for number in range(1, lines + 1))


# -- scenarios ---------------------------------------------------------------------------


def scenario_echo(turn: Turn) -> None:
    """Stream "Echo: <prompt>" word by word (the default for any other prompt)."""
    turn.stream(f"Echo: {turn.text}")


def scenario_think(turn: Turn) -> None:
    """Stream a thought about the rest of the prompt, then a short answer."""
    turn.stream(f"Thinking about: {turn.args or 'nothing in particular'}", "agent_thought_chunk")
    turn.chunk("Done thinking.")


PLAN_STEPS = [
    ("Read the request", "high"),
    ("Do the work", "medium"),
    ("Report back", "low"),
]


def plan_entries(statuses: list[str], steps: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """Combine (content, priority) steps with their current statuses."""
    return [
        (content, priority, status)
        for (content, priority), status in zip(steps, statuses, strict=True)
    ]


def scenario_plan(turn: Turn) -> None:
    """Publish a three-step plan four times as the steps progress."""
    turn.plan(plan_entries(["pending", "pending", "pending"], PLAN_STEPS))
    turn.plan(plan_entries(["in_progress", "pending", "pending"], PLAN_STEPS))
    turn.chunk("Working on step 1.\n")
    turn.plan(plan_entries(["completed", "in_progress", "pending"], PLAN_STEPS))
    turn.chunk("Working on steps 2 and 3.\n")
    turn.plan(plan_entries(["completed", "completed", "completed"], PLAN_STEPS))
    turn.chunk("Plan complete.")


def scenario_write(turn: Turn) -> None:
    """Write `<path> <content...>` in cwd after asking permission."""
    parts = turn.args.split(maxsplit=1)
    if not parts:
        raise UsageError("write <relative path> <content...>")
    write_file(turn, parts[0], parts[1] if len(parts) > 1 else "")


def scenario_delete(turn: Turn) -> None:
    """Delete `<path>` in cwd after asking permission."""
    parts = turn.args.split()
    if len(parts) != 1:
        raise UsageError("delete <relative path>")
    tool_call = file_tool_call(turn, "delete", f"Delete {parts[0]}", parts)
    change_after_permission(
        turn, tool_call, [text_content(f"Delete {parts[0]}")],
        lambda: delete_inside(turn.cwd, parts[0]),
        f"Deleted {parts[0]}.", f"Did not delete {parts[0]}.",
    )  # fmt: skip


def scenario_rename(turn: Turn) -> None:
    """Rename `<old path> <new path>` in cwd after asking permission."""
    parts = turn.args.split()
    if len(parts) != 2:
        raise UsageError("rename <relative path> <new relative path>")
    old, new = parts
    tool_call = file_tool_call(turn, "move", f"Rename {old} to {new}", parts)
    change_after_permission(
        turn, tool_call, [text_content(f"Rename {old} to {new}")],
        lambda: rename_inside(turn.cwd, old, new),
        f"Renamed {old} to {new}.", f"Did not rename {old}.",
    )  # fmt: skip


def scenario_read(turn: Turn) -> None:
    """Read `<path>` from cwd and show it as the tool call's content."""
    parts = turn.args.split()
    if len(parts) != 1:
        raise UsageError("read <relative path>")
    text = read_file(turn, parts[0])
    if text is None:
        turn.chunk(f"Could not read {parts[0]}.")
    else:
        turn.chunk(f"Read {parts[0]} ({len(text)} characters).")


DEMO_STEPS = [
    (f"Write {DEMO_FILE}", "high"),
    (f"Read {DEMO_FILE} back", "medium"),
    ("Sum up", "low"),
]


def scenario_demo(turn: Turn) -> None:
    """Show everything a human should see: thought, plan, permission, edit, read."""
    (delay,) = parse_numbers(turn.args, [0.3], "demo [delay seconds between steps=0.3]")
    turn.stream(
        "The user asked for the demo. I will make a plan, write a file, read it back and sum up.",
        "agent_thought_chunk",
    )
    turn.plan(plan_entries(["pending", "pending", "pending"], DEMO_STEPS))
    turn.sleep(delay)
    turn.stream("Let me show you what a coding agent looks like in Craft.\n\n")
    turn.plan(plan_entries(["in_progress", "pending", "pending"], DEMO_STEPS))
    turn.sleep(delay)
    steps = DEMO_STEPS
    if write_file(turn, DEMO_FILE, DEMO_CONTENT):
        turn.plan(plan_entries(["completed", "in_progress", "pending"], steps))
        turn.sleep(delay)
        read_file(turn, DEMO_FILE)
        outcome = f"You allowed the edit, so {DEMO_FILE} now exists in the workspace."
    else:
        steps = [DEMO_STEPS[0], (f"Read {DEMO_FILE} back (skipped)", "medium"), DEMO_STEPS[2]]
        outcome = "You rejected the edit, so nothing in the workspace changed."
    turn.plan(plan_entries(["completed", "completed", "in_progress"], steps))
    turn.sleep(delay)
    turn.plan(plan_entries(["completed", "completed", "completed"], steps))
    words = ", ".join(word for word in SCENARIOS if word != "demo")
    turn.stream(
        f"\n\nThat was the tour: a thought, a plan that follows the work, a file edit that "
        f"waited for your permission, and a file read. {outcome} Other prompts to try: "
        f"{words}."
    )


def scenario_slow(turn: Turn) -> None:
    """Stream n chunks with a delay before each, stopping at once on cancel."""
    count, delay = parse_numbers(turn.args, [50, 0.1], "slow [n=50] [delay seconds=0.1]")
    for number in range(1, int(count) + 1):
        turn.sleep(delay)
        turn.chunk(f"chunk {number} ")


def scenario_count(turn: Turn) -> None:
    """Send n chunks "1\\n" .. "n\\n" as fast as possible."""
    (count,) = parse_numbers(turn.args, [10], "count [n=10]")
    for number in range(1, int(count) + 1):
        turn.check_cancelled()
        turn.chunk(f"{number}\n")


def scenario_big(turn: Turn) -> None:
    """Send one message chunk of several MiB, i.e. one very long JSON line."""
    usage = f"big [megabytes=5, at most {BIG_MAX_MEGABYTES}]"
    (megabytes,) = parse_numbers(turn.args, [5], usage)
    if megabytes > BIG_MAX_MEGABYTES:
        raise UsageError(usage)
    turn.chunk(big_text(megabytes))


def scenario_crash(turn: Turn) -> None:
    """Send one chunk, then exit the whole process with status 3 without answering."""
    turn.chunk("About to crash")
    log("crash requested; exiting with status 3")
    os._exit(3)


def scenario_noise(turn: Turn) -> None:
    """Print a non-JSON line on stdout, then answer normally."""
    turn.agent.send_raw(b"this line is not JSON\n")
    turn.chunk("I printed a line that is not JSON on stdout.")


def scenario_stderr(turn: Turn) -> None:
    """Write a line to stderr, then answer normally."""
    log("this line was written to stderr on request")
    turn.chunk("I wrote a line to stderr.")


def scenario_unknown(turn: Turn) -> None:
    """Send a session/update of a kind no client knows, then answer normally."""
    turn.update(
        {
            "sessionUpdate": "craft_demo_unknown_kind",
            "detail": "Clients should ignore update kinds they do not understand.",
        }
    )
    turn.chunk("I sent an update of an unknown kind.")


# Drawn once per process: in a PID namespace (a jailed local agent, a pod) every agent may
# have the same process id.
PROCESS_TOKEN = os.urandom(4).hex()


def scenario_pid(turn: Turn) -> None:
    """Answer with this process's id and token, so a client can tell agent processes apart."""
    turn.chunk(f"pid {os.getpid()} {PROCESS_TOKEN}")


def scenario_fail(turn: Turn) -> None:
    """Answer session/prompt with a JSON-RPC error instead of a stop reason."""
    raise PromptFailed("demo failure requested")


def scenario_signin(turn: Turn) -> None:
    """Answer session/prompt with ACP's "authentication required" error (-32000)."""
    raise PromptFailed("Authentication required", AUTH_REQUIRED)


def scenario_fs(turn: Turn) -> None:
    """Ask the client for fs/read_text_file and report how it answered.

    Sent regardless of the client's fs capability on purpose: it tests that the
    client answers requests it does not support with an error instead of hanging.
    """
    parts = turn.args.split()
    if len(parts) > 1:
        raise UsageError(f"fs [relative path={DEMO_FILE}]")
    relative = parts[0] if parts else DEMO_FILE
    try:
        path = resolve_inside(turn.cwd, relative)
    except PathRefused as exc:
        turn.chunk(str(exc))
        return
    params = {"sessionId": turn.session.session_id, "path": str(path)}
    response = turn.request("fs/read_text_file", params)
    error = response.get("error")
    if isinstance(error, dict):
        turn.chunk(
            f"The client answered fs/read_text_file with an error: {error.get('message')} "
            f"(code {error.get('code')})."
        )
        return
    result = response.get("result")
    content = result.get("content") if isinstance(result, dict) else None
    size = f"{len(content)} characters" if isinstance(content, str) else "no content"
    turn.chunk(f"The client answered fs/read_text_file with a result ({size}).")


def scenario_remember(turn: Turn) -> None:
    """Remember the words after `remember`, in the session's state on disk."""
    words = turn.args.split()
    if not words:
        raise UsageError("remember <word...>")
    turn.session.memory += words
    turn.chunk(f"I will remember {' '.join(words)}.")


def scenario_recall(turn: Turn) -> None:
    """Say what the session was asked to remember, or that it starts fresh."""
    memory = turn.session.memory
    turn.chunk(f"You asked me to remember: {' '.join(memory)}." if memory else FRESH_MARKER)


def scenario_config(turn: Turn) -> None:
    """Say which model and mode the session uses."""
    turn.chunk(f"Model: {turn.session.model}. Mode: {turn.session.mode}.")


def scenario_title(turn: Turn) -> None:
    """Name the session (session_info_update with a title)."""
    title = " ".join(turn.args.split())
    if not title:
        raise UsageError("title <text...>")
    turn.update({"sessionUpdate": "session_info_update", "title": title})
    turn.chunk(f"I named this session {title}.")


def scenario_ask(turn: Turn) -> None:
    """Ask a permission question with all four kinds of option; say which was chosen."""
    tool_call_id = turn.new_tool_call_id()
    tool_call = {
        "toolCallId": tool_call_id,
        "title": "Tidy the workspace",
        "kind": "other",
        "status": "pending",
    }
    turn.update({"sessionUpdate": "tool_call", **tool_call})
    try:
        chosen = turn.choose(tool_call, ALL_PERMISSION_OPTIONS)
    except Cancelled:
        turn.tool_call_update(tool_call_id, status="failed", content=[text_content("Cancelled")])
        raise
    names = {option["optionId"]: option for option in ALL_PERMISSION_OPTIONS}
    option = names.get(chosen or "")
    status = "completed" if option and option["kind"].startswith("allow") else "failed"
    turn.tool_call_update(tool_call_id, status=status)
    if option is None:
        turn.chunk("You chose none of my options.")
    else:
        turn.chunk(f"You chose {option['name']} ({option['kind']}).")


TERMINAL_CHUNK_BYTES = 64 * 1024
TERMINAL_MAX_MEGABYTES = 200


def scenario_terminal(turn: Turn) -> None:
    """Run a pretend command whose output streams live, the way Zed's agents send it: the
    tool call's `_meta.terminal_info`, then `terminal_output` chunks, then `terminal_exit`.

    Only for a client that advertised `_meta.terminal_output`; others get the output as
    text content when the command ends, as ACP without the extension allows.
    """
    usage = (
        f"terminal [lines=5] [delay seconds=0.05] [megabytes=0, at most {TERMINAL_MAX_MEGABYTES}]"
    )
    lines, delay, megabytes = parse_numbers(turn.args, [5, 0.05, 0], usage)
    if megabytes > TERMINAL_MAX_MEGABYTES or lines < 0:
        raise UsageError(usage)
    meta = turn.agent.client_capabilities.get("_meta")
    live = isinstance(meta, dict) and meta.get("terminal_output") is True
    tool_call_id = turn.new_tool_call_id()
    command = f"demo-build --lines {int(lines)}"
    start: dict[str, Any] = {
        "sessionUpdate": "tool_call",
        "toolCallId": tool_call_id,
        "title": command,
        "kind": "execute",
        "status": "in_progress",
        "rawInput": {"command": command},
    }
    if live:
        start["content"] = [{"type": "terminal", "terminalId": tool_call_id}]
        start["_meta"] = {"terminal_info": {"terminal_id": tool_call_id, "cwd": str(turn.cwd)}}
    turn.update(start)
    said: list[str] = []

    def output(data: str) -> None:
        if live:
            meta = {"terminal_output": {"terminal_id": tool_call_id, "data": data}}
            turn.tool_call_update(tool_call_id, _meta=meta)
        elif len(said) < 1000:
            said.append(data)

    for number in range(1, int(lines) + 1):
        turn.sleep(delay)
        output(f"step {number} of {int(lines)}: ok\n")
    if megabytes:
        line = "0123456789abcdef" * 4 + "\n"
        chunk = line * (TERMINAL_CHUNK_BYTES // len(line))
        for _ in range(max(1, round(megabytes * 1024 * 1024 / len(chunk)))):
            turn.check_cancelled()
            output(chunk)
    if live:
        exit_meta = {"terminal_exit": {"terminal_id": tool_call_id, "exit_code": 0, "signal": None}}
        turn.tool_call_update(tool_call_id, status="completed", _meta=exit_meta)
    else:
        turn.tool_call_update(
            tool_call_id, status="completed", content=[text_content("".join(said))]
        )
    turn.chunk(f"The command finished ({'live output' if live else 'output at the end'}).")


# The form of `elicit`: one field of each kind ACP's forms have.
ELICIT_FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Project name", "minLength": 1, "default": "demo"},
        "replicas": {"type": "integer", "title": "Replicas", "minimum": 1, "maximum": 9},
        "ratio": {"type": "number", "title": "Sample ratio", "minimum": 0, "maximum": 1},
        "public": {"type": "boolean", "title": "Public", "default": False},
        "colour": {
            "type": "string",
            "title": "Colour",
            "oneOf": [
                {"const": "red", "title": "Red"},
                {"const": "green", "title": "Green"},
            ],
        },
    },
    "required": ["name", "colour"],
}
ELICIT_URL = "https://example.com/demo/authorize?step=1"


def elicit_params(turn: Turn, kind: str) -> dict[str, Any]:
    """Return the `elicitation/create` params of one `elicit` case."""
    base = {"sessionId": turn.session.session_id}
    if kind == "url":
        return {**base, "mode": "url", "elicitationId": f"demo-{os.urandom(4).hex()}",
                "url": ELICIT_URL, "message": "Authorize the demo service"}  # fmt: skip
    schema: dict[str, Any] = ELICIT_FORM
    message = "Configure the demo project"
    if kind == "unknown":
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "title": "Name"},
                "shade": {"type": "color", "title": "Shade"},
            },
            "required": ["name"],
        }
        message = "A form with a field of a type no client knows"
    elif kind == "unknown-required":
        schema = {"type": "object", "properties": {"shade": {"type": "color"}},
                  "required": ["shade"]}  # fmt: skip
        message = "A form whose only, required field is of an unknown type"
    elif kind == "many":
        schema = {
            "type": "object",
            "properties": {f"field{n}": {"type": "string"} for n in range(1000)},
        }
        message = "A form of 1,000 fields"
    elif kind == "html":
        schema = {
            "type": "object",
            "properties": {
                "note": {
                    "type": "string",
                    "title": "<b>Bold</b><img src=x onerror=alert(1)>",
                    "description": "<script>alert(2)</script>",
                },
            },
        }
        message = "<i>HTML</i> in a message <a href='https://example.com'>link</a>"
    return {**base, "mode": "form", "message": message, "requestedSchema": schema}


def scenario_elicit(turn: Turn) -> None:
    """Ask the person for information with `elicitation/create` and say what came back.

    Cases: `form` (default: one field of each kind), `url`, `unknown` (a field of an unknown
    type), `unknown-required`, `many` (1,000 fields), `html` (HTML in labels). Only modes the
    client advertised are asked for.
    """
    kind = turn.args.strip() or "form"
    if kind not in ("form", "url", "unknown", "unknown-required", "many", "html"):
        raise UsageError("elicit [form|url|unknown|unknown-required|many|html]")
    mode = "url" if kind == "url" else "form"
    offered = turn.agent.client_capabilities.get("elicitation")
    if not isinstance(offered, dict) or offered.get(mode) is None:
        turn.chunk(f"The client does not take {mode} elicitations.")
        return
    params = elicit_params(turn, kind)
    response = turn.request("elicitation/create", params)
    result = response.get("result")
    if kind == "url" and isinstance(result, dict) and result.get("action") == "accept":
        # The pretend authorization is done at once: say so, as ACP lets URL mode agents.
        complete = {"elicitationId": params["elicitationId"]}
        turn.agent.send({"jsonrpc": "2.0", "method": "elicitation/complete", "params": complete})
    turn.chunk(describe_elicitation_answer(response))


def describe_elicitation_answer(response: dict[str, Any]) -> str:
    """Return what the agent says of a client's answer to `elicitation/create`."""
    error = response.get("error")
    if isinstance(error, dict):
        return f"The client refused: {error.get('message')} (code {error.get('code')})."
    result = response.get("result")
    action = result.get("action") if isinstance(result, dict) else None
    if action == "accept":
        content = result.get("content") if isinstance(result, dict) else None
        if content:
            return f"You accepted: {json.dumps(content, sort_keys=True)}."
        return "You accepted."
    if action == "decline":
        return "You declined."
    if action == "cancel":
        return "You cancelled."
    return f"The client answered {json.dumps(result)}."


def scenario_withdraw(turn: Turn) -> None:
    """Ask for permission (or, with `elicit`, for a form), then withdraw the request with
    `$/cancel_request` after a moment, as an agent does when it no longer needs the answer."""
    parts = turn.args.split()
    usage = "withdraw [permission|elicit] [seconds=1]"
    kind = parts[0] if parts else "permission"
    if kind not in ("permission", "elicit") or len(parts) > 2:
        raise UsageError(usage)
    (after,) = parse_numbers(" ".join(parts[1:]), [1.0], usage)
    if kind == "elicit":
        params = elicit_params(turn, "form")
        method = "elicitation/create"
    else:
        tool_call_id = turn.new_tool_call_id()
        tool_call = {"toolCallId": tool_call_id, "title": "Tidy the workspace",
                     "kind": "other", "status": "pending"}  # fmt: skip
        turn.update({"sessionUpdate": "tool_call", **tool_call})
        params = {"sessionId": turn.session.session_id, "toolCall": tool_call,
                  "options": PERMISSION_OPTIONS}  # fmt: skip
        method = "session/request_permission"
    response = turn.request_and_withdraw(method, params, after)
    error = response.get("error")
    if isinstance(error, dict) and error.get("code") == REQUEST_CANCELLED:
        turn.chunk("I withdrew my request; the client confirmed.")
    else:
        turn.chunk(f"The client answered before I withdrew: {json.dumps(response.get('result'))}.")


SERVE_USAGE = "serve [port=8080] [address=127.0.0.1]"
SERVE_START_SECONDS = 10.0
APP_PAGE = """<!doctype html>
<html lang="en">
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Demo app on port {port}</title>
<style>
body {{ font: 16px/1.5 system-ui, sans-serif; margin: 2rem; color: #1d2433; }}
code {{ background: #eef1f6; padding: 0 .3em; }}
#echo {{ font-weight: 600; }}
</style>
<h1>Demo app on port {port}</h1>
<p>Served by the Craft demo agent's <code>serve</code> scenario, in the sandbox.</p>
<p>Websocket: <span id="echo">connecting</span></p>
<script>
const scheme = location.protocol === "https:" ? "wss://" : "ws://";
const socket = new WebSocket(scheme + location.host + "/ws");
const echo = document.getElementById("echo");
socket.onopen = () => socket.send("hello over the websocket");
socket.onmessage = (event) => {{ echo.textContent = event.data; }};
socket.onclose = () => {{ if (!echo.textContent.startsWith("echo")) echo.textContent = "closed"; }};
</script>
</html>
"""


def scenario_serve(turn: Turn) -> None:
    """Start a small web app (a page and a websocket echo) on a port of the sandbox, left
    running after the turn: a detached child of the agent, so still in its sandbox."""
    import subprocess

    words = turn.args.split()
    if len(words) > 2 or (words and not words[0].isdigit()):
        raise UsageError(SERVE_USAGE)
    port = int(words[0]) if words else 8080
    address = words[1] if len(words) > 1 else "127.0.0.1"
    if not 0 < port < 65536:
        raise UsageError(SERVE_USAGE)
    folder = str(Path(__file__).resolve().parent)
    code = (
        f"import sys; sys.path.append({folder!r}); import demo_agent; "
        f"demo_agent.serve_app({port}, {address!r})"
    )
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", code],
        cwd=turn.cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        # Its own session: the agent's end does not signal it. It stays in the sandbox (its
        # jail, user and budget) all the same, and goes when the sandbox's processes go.
        start_new_session=True,
    )
    assert child.stdout is not None
    said = child.stdout.readline().decode("utf-8", "replace").strip()
    child.stdout.close()
    if said != "listening":
        child.wait(SERVE_START_SECONDS)
        turn.chunk(f"I could not serve on {address}:{port}: {said or 'the app exited'}.")
        return
    log(f"serving a demo app on {address}:{port} (pid {child.pid})")
    turn.chunk(
        f"I started a demo app on http://{address}:{port}/ (pid {child.pid}): a page and a "
        "websocket echo at /ws. It keeps running after this turn."
    )


def serve_app(port: int, address: str) -> None:
    """Serve the demo app on `address`:`port` until killed; say "listening" (or why not) on
    stdout first, then let stdout go."""
    import base64
    import hashlib
    import http.server
    import socket
    import socketserver
    import struct

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
                self.websocket()
                return
            if self.path not in ("/", "/index.html"):
                self.answer(404, b"not found\n", "text/plain")
                return
            self.answer(200, APP_PAGE.format(port=port).encode(), "text/html; charset=utf-8")

        def do_HEAD(self) -> None:
            self.answer(200, b"", "text/html; charset=utf-8")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            self.answer(200, b"got " + str(len(body)).encode() + b" bytes\n", "text/plain")

        def answer(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def websocket(self) -> None:
            """Echo each message back as "echo: <message>" (RFC 6455, text and binary)."""
            key = self.headers.get("Sec-WebSocket-Key", "")
            guid = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
            accept = base64.b64encode(hashlib.sha1(key.encode() + guid).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
            if "echo" in offered:
                self.send_header("Sec-WebSocket-Protocol", "echo")
            self.end_headers()
            self.close_connection = True
            while True:
                head = self.rfile.read(2)
                if len(head) < 2:
                    return
                opcode, length = head[0] & 0x0F, head[1] & 0x7F
                if length == 126:
                    (length,) = struct.unpack("!H", self.rfile.read(2))
                elif length == 127:
                    (length,) = struct.unpack("!Q", self.rfile.read(8))
                mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
                if opcode == 0x8:  # close: answered with its code
                    self.frame(0x8, data[:2])
                    return
                if opcode == 0x9:
                    self.frame(0xA, data)
                elif opcode in (0x1, 0x2):
                    if data == b"close 4000":  # the app closes with a code of its own
                        self.frame(0x8, struct.pack("!H", 4000))
                        return
                    self.frame(opcode, b"echo: " + data)

        def frame(self, opcode: int, data: bytes) -> None:
            length = len(data)
            if length < 126:
                head = struct.pack("!BB", 0x80 | opcode, length)
            elif length < 1 << 16:
                head = struct.pack("!BBH", 0x80 | opcode, 126, length)
            else:
                head = struct.pack("!BBQ", 0x80 | opcode, 127, length)
            self.wfile.write(head + data)
            self.wfile.flush()

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

    try:
        server = Server((address, port), Handler)
    except OSError as exc:
        print(exc.strerror or exc, flush=True)
        return
    print("listening", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    server.serve_forever()


@dataclass(frozen=True)
class Scenario:
    """A prompt's first word mapped to what the agent does."""

    run: Callable[[Turn], None]
    usage: str
    summary: str


SCENARIOS: dict[str, Scenario] = {
    "think": Scenario(scenario_think, "think <text>", "stream a thought, then a short answer"),
    "plan": Scenario(scenario_plan, "plan", "a three-step plan sent four times as it progresses"),
    "write": Scenario(
        scenario_write, "write <path> <content...>", "write a file in cwd after permission"
    ),
    "delete": Scenario(scenario_delete, "delete <path>", "delete a file in cwd after permission"),
    "rename": Scenario(
        scenario_rename, "rename <path> <new path>", "rename a file in cwd after permission"
    ),
    "read": Scenario(scenario_read, "read <path>", "read a file in cwd as a tool call"),
    "demo": Scenario(
        scenario_demo, "demo [delay=0.3]", "the guided tour: thought, plan, edit, read"
    ),
    "slow": Scenario(
        scenario_slow, "slow [n=50] [delay=0.1]", "n chunks, one per delay; try cancelling"
    ),
    "count": Scenario(scenario_count, "count [n=10]", 'n chunks "1\\n" .. "n\\n" with no delay'),
    "big": Scenario(scenario_big, "big [megabytes=5]", "one chunk that many MiB long"),
    "crash": Scenario(scenario_crash, "crash", "one chunk, then exit with status 3"),
    "noise": Scenario(scenario_noise, "noise", "print a non-JSON line on stdout, then answer"),
    "stderr": Scenario(scenario_stderr, "stderr", "write a line to stderr, then answer"),
    "unknown": Scenario(scenario_unknown, "unknown", "send an update of an unknown kind"),
    "pid": Scenario(scenario_pid, "pid", "answer with the agent's process id"),
    "fail": Scenario(scenario_fail, "fail", "answer the prompt with a JSON-RPC error"),
    "signin": Scenario(
        scenario_signin, "signin", "answer the prompt with -32000 (authentication required)"
    ),
    "fs": Scenario(scenario_fs, "fs [path=hello.txt]", "send fs/read_text_file, report answer"),
    "remember": Scenario(scenario_remember, "remember <word...>", "remember words (on disk)"),
    "recall": Scenario(scenario_recall, "recall", "say what it was asked to remember"),
    "config": Scenario(scenario_config, "config", "say which model and mode are in use"),
    "title": Scenario(scenario_title, "title <text...>", "name the session"),
    "ask": Scenario(scenario_ask, "ask", "a permission request with all four kinds of option"),
    "terminal": Scenario(
        scenario_terminal,
        "terminal [lines=5] [delay=0.05] [megabytes=0]",
        "a command whose output streams live (terminal _meta)",
    ),
    "elicit": Scenario(
        scenario_elicit,
        "elicit [form|url|unknown|unknown-required|many|html]",
        "ask for information with elicitation/create",
    ),
    "serve": Scenario(
        scenario_serve, SERVE_USAGE, "start a web app with a websocket echo, left running"
    ),
    "withdraw": Scenario(
        scenario_withdraw,
        "withdraw [permission|elicit] [seconds=1]",
        "ask, then withdraw the request with $/cancel_request",
    ),
}


def usage_epilog() -> str:
    """Return the scenario list shown by --help."""
    rows = [f"  {scenario.usage:<28} {scenario.summary}" for scenario in SCENARIOS.values()]
    rows.append(f"  {'<anything else>':<28} stream back 'Echo: <prompt>'")
    return "The first word of each prompt picks a scenario:\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the agent on stdin/stdout until stdin closes."""
    args = sys.argv[1:] if argv is None else argv
    # Without arguments, as Craft starts it, the defaults: no argparse to import.
    options = parse_options(args) if args else Options()
    log(f"version {VERSION} ready (pid {os.getpid()}, {options})")
    return Agent(sys.stdout.buffer, options).serve(sys.stdin.buffer)


def parse_options(argv: list[str]) -> Options:
    """Return the options the command line chooses (see --help)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=NAME,
        description=(
            "A deterministic, offline Agent Client Protocol agent for Craft.\n"
            "It speaks newline-delimited JSON-RPC 2.0 on stdin/stdout and logs to stderr."
        ),
        epilog=usage_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{NAME} {VERSION}")
    parser.add_argument(
        "--restore",
        choices=["both", "resume", "load", "none"],
        default="both",
        help="which of session/resume and session/load to offer (default: both)",
    )
    parser.add_argument(
        "--controls",
        choices=["both", "config", "modes", "none"],
        default="both",
        help="offer config options, modes, both or neither (default: both)",
    )
    parser.add_argument(
        "--images",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="accept images in prompts (default: yes)",
    )
    parser.add_argument(
        "--embedded-context",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="accept embedded resources in prompts (default: yes)",
    )
    parser.add_argument(
        "--replay-on-resume",
        action="store_true",
        help="misbehave: replay the conversation on session/resume too, as some agents do",
    )
    parser.add_argument(
        "--close",
        action="store_true",
        help="advertise and answer session/close (sessionCapabilities.close)",
    )
    parser.add_argument(
        "--auth",
        action="store_true",
        help="advertise two auth methods and refuse every session until authenticated",
    )
    args = parser.parse_args(argv)
    return Options(
        restore=args.restore,
        controls=args.controls,
        images=args.images,
        embedded_context=args.embedded_context,
        replay_on_resume=args.replay_on_resume,
        close=args.close,
        auth=args.auth,
    )


if __name__ == "__main__":
    sys.exit(main())
