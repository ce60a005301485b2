"""The ACP client: one `AgentConnection` talks JSON-RPC 2.0 to one agent process.

What the messages are, how a line is parsed and an answer checked, and the items a turn
yields are `sandboxes.agent.protocol`; this module holds the conversation: its reading,
writing, requests and turns.

ACP (Agent Client Protocol) frames one JSON object per line on the agent's stdin/stdout. The
process hands the connection its stdout's lines, of any length (multi-megabyte tool outputs are
normal), in order and from one thread at a time (`AgentProcess.read_lines`): the reader thread,
which for a local agent is the one thread that serves every agent's pipes (`sandboxes.pipes`)
and for a pod exec a thread of its own. The connection parses them in wire order and routes
them:

* a response (`id`, no `method`) resolves the request that is waiting for it;
* `session/update` notifications go to the running turn's sink, in the order they arrived;
* agent-to-client requests: `session/request_permission` is surfaced to the turn as a
  `PermissionRequest` (its options normalised, see `normalise_options`) and answered through
  `answer_permission()`; `elicitation/create` as an `ElicitationRequest` (its form checked,
  see `sandboxes.elicitation`) answered through `answer_elicitation()`; everything else
  (`fs/*`, `terminal/*`, ...) gets a JSON-RPC "method not found" error, because we advertise
  no such capability;
* `$/cancel_request` from the agent withdraws one of those requests: it is answered with
  error -32800 and the turn hears a `RequestWithdrawn`. Craft sends `$/cancel_request` itself
  for a request of its own whose answer it stopped waiting for;
* `elicitation/complete` for a URL elicitation it asked becomes an `elicitation_complete`
  update; tool call updates carrying live command output (`_meta.terminal_output`) are cut to
  `max_terminal_bytes` per tool call here, before anything holds them.

A message of an unforeseen shape (list params, odd ids, JSON nested too deep to parse) is
logged and skipped: it costs itself, never the reader thread, and an agent's request is always
answered.

It is deliberately thread-based rather than asyncio-based: the same connection is used from
Channels consumers (one event loop), from sync views and admin actions (worker threads) and
from the Kubernetes exec transport (a blocking websocket). Sinks are called on the reader
thread and must not block (a local agent's reader thread reads every local agent); an event
loop takes items with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NoReturn, Protocol

from sandboxes import elicitation, stderr_text
from sandboxes.agent.protocol import (
    CLIENT_CAPABILITIES,
    CLIENT_INFO,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    PROTOCOL_VERSION,
    REQUEST_CANCELLED,
    TURN_UPDATES,
    AgentError,
    AuthRequired,
    ElicitationRequest,
    MalformedAnswer,
    PermissionRequest,
    PromptNotSent,
    RequestWithdrawn,
    Sink,
    TurnEnd,
    TurnFailed,
    TurnInProgress,
    TurnItem,
    Update,
    answer_of,
    normalise_options,
    parse_line,
    read_auth_methods,
)
from sandboxes.catalog import Credential

logger = logging.getLogger(__name__)

# How long `stop()` waits for the agent's answer to `session/close` before ending it anyway.
CLOSE_SECONDS = 2.0


@dataclass(frozen=True)
class LineReader:
    """Where an agent's stdout goes (`AgentProcess.read_lines`): `line` is called with each
    line (its newline or not), in order and from one thread at a time, then `end()` once at
    the end of output (or on terminate). A line longer than `limit` bytes is skipped whole
    (never held in memory) and reported by `too_long(its size)`. `line` and `too_long` must
    not block; `end` may."""

    limit: int
    line: Callable[[bytes], None]
    too_long: Callable[[int], None]
    end: Callable[[], None]


class AgentProcess(Protocol):
    """A running agent program, wherever it runs (a local subprocess, a pod exec)."""

    ident: str  # a process id or exec id, for logs and tests
    # Whether `write` may wait for the agent (a pod exec's websocket). A local agent's pipe
    # never does (`sandboxes.pipes.Outbox`): what it cannot take at once waits in memory.
    writes_block: bool

    def write(self, data: bytes) -> None:
        """Write bytes to the agent's stdin (raise OSError once it is gone)."""

    def read_lines(self, reader: LineReader) -> None:
        """Start reading stdout into `reader`."""

    def is_alive(self) -> bool: ...

    def exit_code(self) -> int | None:
        """Return the exit code once known."""

    def stderr_tail(self) -> str:
        """Return the last lines the agent wrote to stderr (for error messages)."""

    def end_reason(self) -> str | None:
        """Return why the agent ended, in words, when the backend knows better than its exit
        code (the kernel killed it for want of memory); else None."""

    def terminate(self, timeout: float = 5.0) -> None:
        """End the program (closing stdin first, then killing) and free its resources."""


class LineTooLong(Exception):
    """The agent wrote a line (one ACP message) longer than Craft takes; it was skipped."""

    def __init__(self, size: int) -> None:
        super().__init__(f"a message of {size} bytes")
        self.size = size


# How a connection opened its ACP session: a reattach to the stored session (`resume`, or
# `load`, whose replay is not delivered), or a new one (`none`: the agent starts fresh).
RESTORED = ("resume", "load", "none")
# Updates that arrive outside a turn before anyone listens (some agents send their commands
# right after the session/new answer) are held for the idle sink, up to this many.
EARLY_UPDATES = 1_000


class _Waiting(NamedTuple):
    """A request sent to the agent, waiting for its answer."""

    method: str
    future: Future[Any]


@dataclass
class _Turn:
    sink: Sink
    prompt_id: int
    cancelled: bool = False
    finished: bool = False
    stderr_before: str = ""  # the kept stderr when the prompt was sent
    stderr_seen: str = ""  # the kept stderr when it was last read for a quiet turn's status
    stderr_said: str = ""  # ... and its last line worth reading, written during the turn


@dataclass
class _PendingPermission:
    jsonrpc_id: Any
    turn: _Turn
    # Each offered option id as Craft shows it (a string) -> the id exactly as the agent sent it.
    option_ids: dict[str, Any] = field(default_factory=dict)
    # "elicitation" for an elicitation/create request (answered with an action, not an option).
    kind: str = "permission"


class AgentConnection:
    """A live ACP conversation with one agent process, for one workspace.

    Create it with a started `AgentProcess`, call `start()` (initialize + session/new), then
    `prompt()` as often as needed: the same process serves every turn. `stop()` ends it.
    """

    def __init__(
        self,
        process: AgentProcess,
        *,
        cwd: str,
        max_message_bytes: int = 16 << 20,
        max_terminal_bytes: int = 1 << 20,
        credentials: Sequence[Credential] = (),
    ) -> None:
        self.process = process
        # The keys its catalog entry asks for (docs/agents.md): what its owner stores on the
        # Keys page and the agent gets in its environment; named when it wants a sign-in.
        self.credentials = tuple(credentials)
        self.max_message_bytes = max_message_bytes
        # Live command output (`_meta.terminal_output`) kept per tool call of a turn; past it,
        # output is dropped here, on the reader thread, before anyone holds or stores it.
        self.max_terminal_bytes = max_terminal_bytes
        self._terminal_bytes: dict[str, int] = {}  # tool call id -> bytes of output let through
        # The elicitationId of each URL elicitation asked on this connection (the last 100),
        # and whether the agent said it completed: `elicitation/complete` of others is ignored.
        self._url_elicitations: dict[str, bool] = {}
        self.cwd = cwd
        self.agent_session_id: str | None = None
        self.agent_info: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        # How the agent says one authenticates (`authMethods` of `initialize`), as
        # {"id", "name", "description"}: shown when it answers that authentication is required.
        self.auth_methods: list[dict[str, str]] = []
        # None when start() was not asked to reattach; else one of RESTORED.
        self.restored: str | None = None
        # The session's controls as the agent last described them (see `controls`).
        self.config_options: list[dict[str, Any]] | None = None
        self.modes: dict[str, Any] | None = None
        self.created_at = time.monotonic()
        self.last_used_at = self.created_at
        self._ids = itertools.count()
        self._pending: dict[int, _Waiting] = {}
        self._permissions: dict[str, _PendingPermission] = {}
        self._lock = threading.Lock()  # guards _pending, _permissions, _turn
        self._write_lock = threading.Lock()  # one line at a time on stdin
        self._turn: _Turn | None = None
        self._stopped = threading.Event()
        self._reader_done = threading.Event()
        # Updates that arrive outside a turn (some agents send them after the prompt response).
        self._idle_sink: Sink | None = None
        self._early: list[TurnItem] = []  # held until there is an idle sink
        # The id of the session/resume or session/load request while it runs: until its
        # answer, what the agent sends is a replay of what the client has already seen.
        self._restoring: int | None = None
        # Whether a turn of this connection was answered: from then on, until the next
        # prompt, updates of a turn (TURN_UPDATES) come after their turn's end.
        self._answered = False
        self.late_updates_dropped = 0  # all such updates of this connection, dropped
        self._dropped_since_answer = 0

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 30.0, *, reattach: str | None = None) -> None:
        """Initialize the agent and open its ACP session in `cwd`; raise AgentError on failure.

        With `reattach` (the agent's session id from an earlier process), the agent is asked
        to continue that session: `session/resume` if it advertises it, else `session/load`
        if it advertises that, else (or if the agent refuses) a new session. `restored`
        says which; nothing the agent sends before the resume or load answer is delivered
        (a load replays the conversation, which the client already has).
        """
        self.initialize(timeout)
        self.open_session(timeout, reattach=reattach)

    def initialize(self, timeout: float = 30.0) -> None:
        """Send `initialize` and keep what the agent says of itself; raise AgentError on
        failure (the agent is stopped). A warm agent is one initialized and waiting for
        `open_session`."""
        self.process.read_lines(
            LineReader(
                self.max_message_bytes, self._handle_line, self._report_too_long, self._output_ended
            )
        )
        try:
            init = self.request(
                "initialize",
                {
                    "protocolVersion": PROTOCOL_VERSION,
                    "clientCapabilities": CLIENT_CAPABILITIES,
                    "clientInfo": CLIENT_INFO,
                },
                timeout=timeout,
            )
            self.agent_info = dict(init.get("agentInfo") or {})
            self.capabilities = dict(init.get("agentCapabilities") or {})
            self.auth_methods = read_auth_methods(init.get("authMethods"))
        except Exception as exc:
            self._failed_start(exc)

    def open_session(
        self, timeout: float = 30.0, *, reattach: str | None = None, cwd: str | None = None
    ) -> None:
        """Open the ACP session of an initialized agent in `cwd` (default: the one it was
        made with), or continue the agent session `reattach` (see `start`); raise AgentError
        on failure (the agent is stopped)."""
        if cwd is not None:
            self.cwd = cwd
        try:
            opened = None
            if reattach:
                opened = self._reattach(reattach, timeout)
            if opened is None:
                opened = self.request(
                    "session/new", {"cwd": self.cwd, "mcpServers": []}, timeout=timeout
                )
                self.agent_session_id = opened["sessionId"]
                self.restored = "none" if reattach else None
            self._take_controls(opened)
        except Exception as exc:
            self._failed_start(exc)
        self.last_used_at = time.monotonic()

    def _failed_start(self, exc: Exception) -> NoReturn:
        # Whatever went wrong, no agent process outlives a start that failed.
        self.stop()
        details = self.stderr_details()
        if isinstance(exc, AuthRequired):
            details = {**details, "keys": self.keys()}
            raise AuthRequired(self.auth_message(exc), self.auth_methods, details) from exc
        raise AgentError(f"agent did not start: {exc}", details) from exc

    def auth_message(self, exc: AuthRequired) -> str:
        """Return what a person reads when the agent wants authentication: the ways it
        offers, and the keys of its owner it is given (its catalog entry's credentials),
        stored on the Keys page; Craft never calls `authenticate`."""
        said = f"The agent needs authentication first ({exc})."
        if self.auth_methods:
            ways = "; ".join(
                m["name"] + (f" ({m['description']})" if m["description"] else "")
                for m in self.auth_methods
            )
            said = f"{said} It offers: {ways}."
        else:
            said = f"{said} It names no way to authenticate."
        if not self.credentials:
            return (
                f"{said} It is given no key of yours: whoever runs Craft can have it ask for "
                "one (its catalog entry's credentials)."
            )
        keys = ", ".join(f"{c.label} ({c.name})" for c in self.credentials)
        return (
            f"{said} It signs in with the key you stored on the Keys page: {keys}. "
            "Check it there (it may be wrong or expired), then send your message again."
        )

    def keys(self) -> list[dict[str, str]]:
        """Return the keys the agent is given, as an `agent_error` names them."""
        return [{"name": c.name, "label": c.label} for c in self.credentials]

    def stderr_details(self, since: str | None = None) -> dict[str, Any]:
        """Return what the agent wrote to stderr, for an error's details: `stderr`, the whole
        of what Craft kept (cleaned, bounded: `stderr_text.kept`), and `stderr_line`, its line
        that says what went wrong (`stderr_text.said`). With `since` (the kept stderr when a
        turn began), only if the agent wrote to stderr during the turn, and the line is of
        what it wrote then. Empty when the agent wrote nothing (then)."""
        tail = self.process.stderr_tail()
        written = tail if since is None else stderr_text.written_after(since, tail)
        kept = stderr_text.kept(tail)
        if not kept or not written.strip():
            return {}
        said = stderr_text.said(written)
        return {"stderr": kept, "stderr_line": said} if said else {"stderr": kept}

    def stderr_said_lately(self) -> str:
        """Return the last line worth reading that the agent wrote to stderr during its running
        turn ("" when none, or no turn runs): what a quiet turn's status shows."""
        turn = self._turn
        if turn is None:
            return ""
        tail = self.process.stderr_tail()
        if tail != turn.stderr_seen:  # read again only what changed (a quiet turn asks often)
            written = stderr_text.written_after(turn.stderr_before, tail)
            turn.stderr_seen, turn.stderr_said = tail, stderr_text.last_said(written)
        return turn.stderr_said

    @property
    def can_resume(self) -> bool:
        sessions = self.capabilities.get("sessionCapabilities")
        return isinstance(sessions, dict) and isinstance(sessions.get("resume"), dict)

    @property
    def can_close(self) -> bool:
        sessions = self.capabilities.get("sessionCapabilities")
        return isinstance(sessions, dict) and isinstance(sessions.get("close"), dict)

    @property
    def can_load(self) -> bool:
        return self.capabilities.get("loadSession") is True

    @property
    def prompt_capabilities(self) -> dict[str, bool]:
        """Return which content beyond text and resource links the agent takes in prompts."""
        raw = self.capabilities.get("promptCapabilities")
        raw = raw if isinstance(raw, dict) else {}
        return {key: raw.get(key) is True for key in ("image", "audio", "embeddedContext")}

    def _reattach(self, session_id: str, timeout: float) -> dict[str, Any] | None:
        """Resume or load the agent's earlier session; return the answer, None if neither.

        Resume wins when the agent offers both: it restores the agent without a replay.
        """
        method = "session/resume" if self.can_resume else "session/load" if self.can_load else None
        if method is None:
            return None
        params = {"sessionId": session_id, "cwd": self.cwd, "mcpServers": []}
        with self._lock:
            request_id, future = self._expect(method)
            self._restoring = request_id
        try:
            self._write({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            result = future.result(timeout=timeout)
        except FutureTimeout:
            self._give_up(request_id)
            raise AgentError(f"{method}: no answer within {timeout} s") from None
        except MalformedAnswer:
            raise  # a broken agent, not one that forgot the session
        except AgentError as exc:
            if not self.is_running:
                raise
            # The agent forgot the session (its files are gone): start a new one.
            logger.info("agent %s refused %s: %s", self.process.ident, method, exc)
            return None
        finally:
            with self._lock:
                self._pending.pop(request_id, None)
                self._restoring = None
        self.agent_session_id = session_id
        self.restored = method.removeprefix("session/")
        return result if isinstance(result, dict) else {}

    def _take_controls(self, answer: Any) -> None:
        """Keep the config options and modes a session/new, resume or load answer carries."""
        if not isinstance(answer, dict):
            return
        options = answer.get("configOptions")
        if isinstance(options, list):
            self.config_options = [o for o in options if isinstance(o, dict)]
        modes = answer.get("modes")
        if isinstance(modes, dict):
            self.modes = dict(modes)

    @property
    def idle_sink(self) -> Sink | None:
        return self._idle_sink

    @idle_sink.setter
    def idle_sink(self, sink: Sink | None) -> None:
        """Set who hears updates outside turns; it first gets those that came before it."""
        while True:
            with self._lock:
                early, self._early = self._early, []
                if not early:
                    self._idle_sink = sink
                    return
            for item in early:
                if sink is not None:
                    sink(item)

    @property
    def writes_block(self) -> bool:
        """Whether sending to the agent may wait (see `AgentProcess.writes_block`): if not, a
        prompt, an answer or a cancel may be sent from an event loop."""
        return self.process.writes_block

    @property
    def is_running(self) -> bool:
        """Return False once the process, its reader or this connection is gone."""
        return (
            not self._stopped.is_set()
            and not self._reader_done.is_set()
            and self.process.is_alive()
        )

    @property
    def turn_active(self) -> bool:
        return self._turn is not None

    def stop(self) -> None:
        """End the agent process and release everyone waiting on it. Safe to call twice.

        An agent that advertises `sessionCapabilities.close` is first asked to close its
        session (`session/close`, at most CLOSE_SECONDS), so it can free what it holds.
        """
        if self._stopped.is_set():
            return
        if self.can_close and self.agent_session_id is not None and self.is_running:
            try:
                self.request(
                    "session/close", {"sessionId": self.agent_session_id}, timeout=CLOSE_SECONDS
                )
            except AgentError as exc:
                logger.info("agent %s: session/close: %s", self.process.ident, exc)
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            self.process.terminate()
        except Exception:
            logger.exception("stopping agent %s failed", self.process.ident)
        self._fail_everything("agent connection stopped")
        self._count_late_updates()

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """Wait until everything the agent wrote has been read and delivered; True if so."""
        return self._reader_done.wait(timeout)

    # --- requests ---------------------------------------------------------------------------

    def request(self, method: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        """Send a request and return its result, checked by `answer_of`; raise AgentError for
        an error answer, a malformed one (MalformedAnswer), a timeout or a failed write."""
        with self._lock:
            request_id, future = self._expect(method)
        try:
            self._write({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            return future.result(timeout=timeout)
        except FutureTimeout:
            self._give_up(request_id)
            raise AgentError(f"{method}: no answer within {timeout} s") from None
        finally:
            with self._lock:  # a late answer then goes to "unknown id"
                self._pending.pop(request_id, None)

    def _give_up(self, request_id: int) -> None:
        """Tell the agent that Craft no longer waits for the answer to a request of its own
        (`$/cancel_request`), so that it can stop the work; a late answer is then skipped."""
        try:
            self.notify("$/cancel_request", {"requestId": request_id})
        except AgentError:
            pass

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._write({"jsonrpc": "2.0", "method": method, "params": params})

    def prompt(self, text: str, sink: Sink, blocks: list[dict[str, Any]] | None = None) -> None:
        """Start a turn: send `session/prompt` and deliver its items to `sink` in wire order.

        The prompt is `text` as a text block, then `blocks` (resource links, images: ACP
        content blocks). The sink is called on the reader thread (it must not block) and
        receives `Update`s and `PermissionRequest`s, then exactly one `TurnEnd` or
        `TurnFailed`. Raises PromptNotSent, delivering nothing, when the prompt could not be
        written (the agent is gone and never got it).
        """
        stderr_before = self.process.stderr_tail()  # what it writes from now on is the turn's
        with self._lock:
            if self._turn is not None:
                raise TurnInProgress("a turn is already running on this connection")
            if not self.is_running:
                raise PromptNotSent("agent is not running")
            request_id, future = self._expect("session/prompt")
            turn = _Turn(sink=sink, prompt_id=request_id, stderr_before=stderr_before)
            self._turn = turn
            self._count_late_updates()
            self._terminal_bytes.clear()  # tool call ids may repeat in a later turn
        self.last_used_at = time.monotonic()
        try:
            self._write(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "method": "session/prompt",
                    "params": {
                        "sessionId": self.agent_session_id,
                        "prompt": [{"type": "text", "text": text}, *(blocks or [])],
                    },
                }
            )
        except Exception as exc:
            # Nothing was sent (or nothing whole): leave no turn and no request behind, or
            # every later prompt of this connection would be refused.
            with self._lock:
                self._pending.pop(request_id, None)
                turn.finished = True
                if self._turn is turn:
                    self._turn = None
            if isinstance(exc, AgentError):
                raise PromptNotSent(str(exc)) from exc
            raise
        future.add_done_callback(lambda f: self._finish_turn(turn, f))

    def set_config_option(self, config_id: str, value: str, timeout: float = 30.0) -> list[Any]:
        """Ask the agent to change a session config option; return every option as it is now."""
        result = self.request(
            "session/set_config_option",
            {"sessionId": self.agent_session_id, "configId": config_id, "value": value},
            timeout=timeout,
        )
        # answer_of made sure that configOptions is a list.
        self.config_options = [o for o in result["configOptions"] if isinstance(o, dict)]
        return self.config_options

    def set_mode(self, mode_id: str, timeout: float = 30.0) -> None:
        """Ask the agent to switch to one of its modes."""
        self.request(
            "session/set_mode",
            {"sessionId": self.agent_session_id, "modeId": mode_id},
            timeout=timeout,
        )
        if self.modes is not None:
            self.modes = {**self.modes, "currentModeId": mode_id}

    def cancel(self) -> None:
        """Cancel the running turn: notify the agent, answer its open permission requests.

        The turn still ends through the agent's prompt response; whatever the agent answers
        (some say `end_turn`, some an error), the turn's stop reason becomes `cancelled`.
        """
        with self._lock:
            turn = self._turn
            if turn is None:
                return
            turn.cancelled = True
            waiting = [(rid, p.kind) for rid, p in self._permissions.items() if p.turn is turn]
        if self.agent_session_id is not None:
            try:
                self.notify("session/cancel", {"sessionId": self.agent_session_id})
            except AgentError:
                pass
        for request_id, kind in waiting:
            if kind == "elicitation":
                self.answer_elicitation(request_id, "cancel")
            else:
                self.answer_permission(request_id, None)

    def answer_permission(self, request_id: str, option_id: str | None) -> bool:
        """Answer a permission request with an option id, or None for cancelled.

        Return False when the request is unknown or already answered.
        """
        with self._lock:
            pending = self._permissions.get(request_id)
            if pending is None or pending.kind != "permission":
                return False
            del self._permissions[request_id]
        if option_id is not None and option_id not in pending.option_ids:
            with self._lock:
                self._permissions[request_id] = pending
            raise ValueError(f"unknown option {option_id!r} for permission request")
        outcome: dict[str, Any] = (
            {"outcome": "cancelled"}
            if option_id is None
            else {"outcome": "selected", "optionId": pending.option_ids[option_id]}
        )
        try:
            self._write(
                {"jsonrpc": "2.0", "id": pending.jsonrpc_id, "result": {"outcome": outcome}}
            )
        except AgentError:
            return False
        return True

    def answer_elicitation(
        self, request_id: str, action: str, content: dict[str, Any] | None = None
    ) -> bool:
        """Answer an elicitation request: `accept` (with a form's checked content), `decline`
        or `cancel`. Return False when the request is unknown or already answered."""
        with self._lock:
            pending = self._permissions.get(request_id)
            if pending is None or pending.kind != "elicitation":
                return False
            del self._permissions[request_id]
        result: dict[str, Any] = {"action": action}
        if action == "accept" and content is not None:
            result["content"] = content
        try:
            self._write({"jsonrpc": "2.0", "id": pending.jsonrpc_id, "result": result})
        except AgentError:
            return False
        return True

    # --- internals --------------------------------------------------------------------------

    def _expect(self, method: str) -> tuple[int, Future[Any]]:
        """Return a new request id and the future its answer resolves (hold `_lock`)."""
        request_id = next(self._ids)
        future: Future[Any] = Future()
        self._pending[request_id] = _Waiting(method, future)
        return request_id, future

    def _write(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self._write_lock:
            try:
                self.process.write(line.encode("utf-8"))
            except (OSError, ValueError) as exc:
                raise AgentError(f"cannot write to agent: {exc}") from exc

    def _output_ended(self) -> None:
        self._reader_done.set()
        self._fail_everything(self._exit_message())

    def _report_too_long(self, size: int) -> None:
        """Tell the turn that a message was dropped, so that the log says so."""
        logger.warning("agent %s wrote a message of %d bytes; skipped", self.process.ident, size)
        update = {
            "sessionUpdate": "message_too_large",
            "bytes": size,
            "limit": self.max_message_bytes,
        }
        self._deliver(Update(kind="message_too_large", data=update))

    def _exit_message(self) -> str:
        if self._stopped.is_set():
            return "agent connection stopped"
        # Give the process a moment to be reaped so that its exit code is known.
        deadline = time.monotonic() + 1.0
        while self.process.exit_code() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        code = self.process.exit_code()
        if (reason := self.process.end_reason()) is not None:
            return reason
        message = "agent exited" + (f" with code {code}" if code is not None else "")
        # The line that says why, not the end of a stack trace (the whole tail goes with the
        # error as its details: `stderr_details`). Its stderr's last lines may still be on
        # their way from the pipe (the end of stdout can be heard first): a moment for them.
        tail, deadline = self.process.stderr_tail(), time.monotonic() + 0.2
        while time.monotonic() < deadline:
            time.sleep(0.02)
            tail, before = self.process.stderr_tail(), tail
            if tail == before:
                break
        said = stderr_text.said(tail)
        return f"{message}: {said}" if said else message

    def _handle_line(self, line: bytes) -> None:
        try:
            message = parse_line(line)
        except (ValueError, RecursionError):
            # Some agents (and npx wrappers) print banners on stdout: skip, never crash. JSON
            # nested too deep for the parser is skipped the same way.
            logger.warning("agent %s wrote a non-JSON line: %.200r", self.process.ident, line)
            return
        if not isinstance(message, dict):
            logger.warning("agent %s wrote a non-object line: %.200r", self.process.ident, line)
            return
        try:
            if "method" in message:
                if "id" in message:
                    self._handle_agent_request(message)
                else:
                    self._handle_notification(message)
            elif "id" in message:
                self._handle_response(message)
        except AgentError:
            pass  # an answer could not be written: the agent is gone, and EOF ends this loop
        except Exception:
            # A message of a shape nobody foresaw must cost that message, not the connection:
            # the reader thread is the only one that hears the agent.
            logger.exception("agent %s sent a message Craft cannot handle", self.process.ident)

    def _handle_response(self, message: dict[str, Any]) -> None:
        response_id = message["id"]
        waiting = None
        turn = None
        if type(response_id) is int:  # our ids are ints; a list or object would not even hash
            with self._lock:
                waiting = self._pending.pop(response_id, None)
                if self._turn is not None and self._turn.prompt_id == response_id:
                    turn = self._turn
                if response_id == self._restoring:
                    # Cleared here, on the reader thread, so that what comes after the answer
                    # (commands, say) is delivered and only the replay before it is not.
                    self._restoring = None
        if waiting is None:
            logger.warning("agent %s answered unknown id %.100r", self.process.ident, response_id)
            return
        # Out of _pending, the future is this thread's to resolve, whatever the answer holds.
        try:
            result = answer_of(waiting.method, message)
        except Exception as exc:
            if isinstance(exc, MalformedAnswer):
                logger.warning("agent %s: %s", self.process.ident, exc)
            waiting.future.set_exception(exc)
        else:
            waiting.future.set_result(result)
        if turn is not None:
            # The prompt's answer ends its turn here, on the reader thread, before anything
            # the agent wrote after it is read. (The future's done-callback, which `prompt`
            # adds only once the prompt is written, may run later on another thread: an
            # answer that came first would otherwise be delivered after the updates that
            # followed it on the wire.)
            self._finish_turn(turn, waiting.future)

    def _handle_notification(self, message: dict[str, Any]) -> None:
        if message.get("method") == "$/cancel_request":
            self._handle_cancel_request(message.get("params"))
            return
        if message.get("method") == "elicitation/complete":
            self._handle_elicitation_complete(message.get("params"))
            return
        if message.get("method") != "session/update":
            logger.debug("agent %s sent %.100r", self.process.ident, message.get("method"))
            return
        params = message.get("params")
        update = params.get("update") if isinstance(params, dict) else None
        if not isinstance(update, dict):
            logger.warning("agent %s sent a session/update without update", self.process.ident)
            return
        if self._restoring is not None:
            return  # a replay of what the client already has (session/load, some resumes)
        kind = str(update.get("sessionUpdate", "unknown"))
        if kind in ("tool_call", "tool_call_update") and "_meta" in update:
            limited = self._limit_terminal_output(update)
            if limited is None:
                return  # nothing left of it: live output past the limit
            update = limited
        self._follow_controls(kind, update)
        # Unknown kinds are delivered as they are: the event log keeps everything.
        self._deliver(Update(kind=kind, data=update))

    def _limit_terminal_output(self, update: dict[str, Any]) -> dict[str, Any] | None:
        """Return a tool call update whose live output (`_meta.terminal_output.data`) keeps
        the tool call within `max_terminal_bytes`, or None when nothing else is left of it.

        The first cut is told to the turn as a `terminal_output_limited` update (the tool
        call's id and the limit), so that the log says that output is missing.
        """
        meta = update.get("_meta")
        output = meta.get("terminal_output") if isinstance(meta, dict) else None
        if not isinstance(output, dict) or not isinstance(output.get("data"), str):
            return update
        assert isinstance(meta, dict)
        tool_call_id = str(update.get("toolCallId"))[:200]
        used = self._terminal_bytes.get(tool_call_id, 0)
        data = output["data"]
        size = len(data.encode("utf-8", "surrogatepass"))
        if used + size <= self.max_terminal_bytes:
            if tool_call_id in self._terminal_bytes or len(self._terminal_bytes) < 10_000:
                self._terminal_bytes[tool_call_id] = used + size
            return update
        room = max(self.max_terminal_bytes - used, 0)
        self._terminal_bytes[tool_call_id] = self.max_terminal_bytes + 1  # over: told once
        if used <= self.max_terminal_bytes:
            limited = {"sessionUpdate": "terminal_output_limited", "toolCallId": tool_call_id,
                       "limit": self.max_terminal_bytes}  # fmt: skip
            cut = data.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
            if cut:
                meta = {**meta, "terminal_output": {**output, "data": cut}}
                self._deliver(Update("tool_call_update", {**update, "_meta": meta}))
            self._deliver(Update("terminal_output_limited", limited))
        rest = {key: value for key, value in meta.items() if key != "terminal_output"}
        others = {k for k in update if k not in ("sessionUpdate", "toolCallId", "_meta")}
        if not rest and not others:
            return None
        return {**update, "_meta": rest}

    def _follow_controls(self, kind: str, update: dict[str, Any]) -> None:
        """Keep `config_options` and `modes` as the agent's own updates change them."""
        if kind == "config_option_update" and isinstance(update.get("configOptions"), list):
            self.config_options = [o for o in update["configOptions"] if isinstance(o, dict)]
        elif kind == "current_mode_update" and self.modes is not None:
            mode = update.get("currentModeId", update.get("modeId"))
            if isinstance(mode, str):
                self.modes = {**self.modes, "currentModeId": mode}

    def _handle_cancel_request(self, params: Any) -> None:
        """The agent withdraws a request of its own: answer it with error -32800 (ACP wants
        an answer either way) and tell the turn, whose card then closes."""
        if not isinstance(params, dict) or "requestId" not in params:
            logger.warning("agent %s sent $/cancel_request without requestId", self.process.ident)
            return
        wanted = params["requestId"]
        with self._lock:
            found = next(
                (
                    (rid, p)
                    for rid, p in self._permissions.items()
                    if type(p.jsonrpc_id) is type(wanted) and p.jsonrpc_id == wanted
                ),
                None,
            )
            if found is not None:
                del self._permissions[found[0]]
        if found is None:
            return  # answered already, or never asked: nothing to withdraw
        request_id, pending = found
        self._write(
            {
                "jsonrpc": "2.0",
                "id": pending.jsonrpc_id,
                "error": {"code": REQUEST_CANCELLED, "message": "request cancelled"},
            }
        )
        self._deliver(RequestWithdrawn(request_id=request_id, kind=pending.kind))

    def _handle_elicitation_complete(self, params: Any) -> None:
        """The agent says the out-of-band part of a URL elicitation is done: tell the turn (or
        the idle sink) once, as an `elicitation_complete` update; unknown or already completed
        ids are ignored, as ACP asks."""
        wanted = params.get("elicitationId") if isinstance(params, dict) else None
        with self._lock:
            if not isinstance(wanted, str) or self._url_elicitations.get(wanted) is not False:
                return
            self._url_elicitations[wanted] = True
        update = {"sessionUpdate": "elicitation_complete", "elicitationId": wanted}
        self._deliver(Update("elicitation_complete", update))

    def _handle_agent_request(self, message: dict[str, Any]) -> None:
        method = message["method"]
        if method == "session/request_permission":
            self._handle_permission_request(message)
            return
        if method == "elicitation/create":
            self._handle_elicitation(message)
            return
        self._write(
            {
                "jsonrpc": "2.0",
                "id": message["id"],
                "error": {"code": METHOD_NOT_FOUND, "message": f"{method!r:.100} is not supported"},
            }
        )

    def _handle_permission_request(self, message: dict[str, Any]) -> None:
        """Surface a permission request to the turn; whatever its shape, the agent hears back."""
        params = message.get("params")
        if not isinstance(params, dict):
            self._write(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "error": {"code": INVALID_PARAMS, "message": "params must be an object"},
                }
            )
            return
        options, option_ids = normalise_options(params.get("options"))
        tool_call = params.get("toolCall")
        request_id = uuid.uuid4().hex
        with self._lock:
            turn = self._turn
            answerable = turn is not None and not turn.cancelled and bool(options)
            if answerable:
                assert turn is not None
                self._permissions[request_id] = _PendingPermission(
                    jsonrpc_id=message["id"], turn=turn, option_ids=option_ids
                )
        if not answerable:
            # Nobody can answer outside a turn, a cancelled turn answers "cancelled", and a
            # request without one usable option cannot be answered otherwise.
            if not options:
                logger.warning("agent %s asked permission without options", self.process.ident)
            self._write(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"outcome": {"outcome": "cancelled"}},
                }
            )
            return
        self._deliver(
            PermissionRequest(
                request_id=request_id,
                tool_call=dict(tool_call) if isinstance(tool_call, dict) else {},
                options=options,
            )
        )

    def _handle_elicitation(self, message: dict[str, Any]) -> None:
        """Surface an elicitation to the turn; one Craft cannot show is refused (error -32602,
        saying why) and still shown, closed, so that the person sees what was asked."""
        params = message.get("params")
        if not isinstance(params, dict):
            self._answer_error(message["id"], INVALID_PARAMS, "params must be an object")
            return
        mode = params.get("mode")
        text = params.get("message")
        text = text[: elicitation.MAX_TEXT] if isinstance(text, str) else ""
        tool_call_id = params.get("toolCallId")
        request = ElicitationRequest(
            request_id=uuid.uuid4().hex,
            mode=mode if mode in ("form", "url") else str(mode)[:40],
            message=text,
            tool_call_id=tool_call_id[:200] if isinstance(tool_call_id, str) else "",
        )
        try:
            if mode == "form":
                fields = elicitation.read_form(params.get("requestedSchema"))
                request = _replace(request, fields=fields)
            elif mode == "url":
                url = elicitation.read_url(params.get("url"))
                elicitation_id = params.get("elicitationId")
                request = _replace(
                    request,
                    url=url,
                    elicitation_id=str(elicitation_id)[:200] if elicitation_id is not None else "",
                )
                if request.elicitation_id:
                    with self._lock:
                        self._url_elicitations[request.elicitation_id] = False
                        while len(self._url_elicitations) > 100:
                            del self._url_elicitations[next(iter(self._url_elicitations))]
            else:
                raise elicitation.BadRequest(f"Craft knows no elicitation mode {mode!r:.40}")
        except elicitation.BadRequest as bad:
            self._answer_error(message["id"], INVALID_PARAMS, str(bad))
            self._deliver(_replace(request, refused=str(bad)))
            return
        with self._lock:
            turn = self._turn
            answerable = turn is not None and not turn.cancelled
            if answerable:
                assert turn is not None
                self._permissions[request.request_id] = _PendingPermission(
                    jsonrpc_id=message["id"], turn=turn, kind="elicitation"
                )
        if not answerable:
            # Nobody can answer outside a turn; a cancelled turn's requests are cancelled.
            self._write({"jsonrpc": "2.0", "id": message["id"], "result": {"action": "cancel"}})
            return
        self._deliver(request)

    def _answer_error(self, jsonrpc_id: Any, code: int, text: str) -> None:
        self._write({"jsonrpc": "2.0", "id": jsonrpc_id, "error": {"code": code, "message": text}})

    def _deliver(self, item: TurnItem) -> None:
        turn = self._turn
        if (
            turn is None
            and self._answered
            and isinstance(item, Update)
            and item.kind in TURN_UPDATES
        ):
            self._drop_late(item)
            return
        sink = turn.sink if turn is not None else self._idle_sink
        if sink is None:
            with self._lock:
                if self._idle_sink is None:
                    if len(self._early) < EARLY_UPDATES:
                        self._early.append(item)  # handed over when the idle sink is set
                    else:
                        logger.info("agent %s: %s outside a turn, dropped",
                                    self.process.ident, item)  # fmt: skip
                    return
                sink = self._idle_sink
        try:
            sink(item)
        except Exception:
            logger.exception("turn sink failed on %r", item)

    def _drop_late(self, item: Update) -> None:
        """Drop an update of a turn that has ended (TURN_UPDATES); count it, say so once."""
        self.late_updates_dropped += 1
        self._dropped_since_answer += 1
        if self._dropped_since_answer == 1:
            logger.warning(
                "agent %s sent %s after answering its turn's prompt; dropped (ACP has a turn's "
                "updates come before its answer), and those after it are counted",
                self.process.ident, item.kind,
            )  # fmt: skip

    def _count_late_updates(self) -> None:
        """Log how many updates of the last ended turn were dropped (a new turn begins, or
        the connection stops)."""
        dropped, self._dropped_since_answer = self._dropped_since_answer, 0
        if dropped > 1:
            logger.warning(
                "agent %s: %d updates sent after its turn's answer were dropped",
                self.process.ident, dropped,
            )  # fmt: skip

    def _finish_turn(self, turn: _Turn, future: Future[Any]) -> None:
        """Deliver the turn's last item; runs on the reader thread (or on failure paths)."""
        with self._lock:
            if turn.finished:
                return
            turn.finished = True
            self._answered = True
            if self._turn is turn:
                self._turn = None
            for rid in [rid for rid, p in self._permissions.items() if p.turn is turn]:
                del self._permissions[rid]
        self.last_used_at = time.monotonic()
        # A done-callback that raised would be logged by the future and the turn never heard
        # of again: whatever goes wrong here, the sink gets the turn's one last item.
        try:
            item = self._last_item(turn, future)
        except Exception as exc:
            logger.exception("agent %s: reading the prompt's answer failed", self.process.ident)
            item = TurnFailed(f"Craft could not read the agent's answer: {exc}")
        try:
            turn.sink(item)
        except Exception:
            logger.exception("turn sink failed on %r", item)

    def _last_item(self, turn: _Turn, future: Future[Any]) -> TurnEnd | TurnFailed:
        """Return how the turn ended, from its prompt's answer (or failure)."""
        if turn.cancelled:
            # Whatever ended it (the agent's answer, an error, or stop() after the agent
            # ignored the cancel), the person asked for the turn to stop, and it stopped.
            return TurnEnd("cancelled")
        exc = future.exception()
        if exc is None:
            result = future.result() or {}  # a dict or None: answer_of checked it
            return TurnEnd(result.get("stopReason") or "end_turn")
        # What the agent wrote to stderr during the turn often says why better than its
        # answer does (Codex answers "Internal error" and logs the model provider's 401).
        details = self.stderr_details(since=turn.stderr_before)
        if isinstance(exc, AuthRequired):
            wanted = {"reason": "auth_required", "authMethods": self.auth_methods,
                      "keys": self.keys()}  # fmt: skip
            return TurnFailed(self.auth_message(exc), {**wanted, **details})
        return TurnFailed(str(exc), details)

    def _fail_everything(self, reason: str) -> None:
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
            self._permissions.clear()
        for waiting in pending:
            if not waiting.future.done():
                waiting.future.set_exception(AgentError(reason))


def lines_on_a_thread(readline: Callable[[int], bytes], reader: LineReader, name: str) -> None:
    """`AgentProcess.read_lines` for a process read by blocking `readline(limit)` calls
    (which raise `LineTooLong`): a thread of its own reads it."""

    def read() -> None:
        try:
            while chunk := _next_line(readline, reader.limit, reader.too_long):
                reader.line(chunk)
        except Exception:
            logger.exception("reading from agent %s failed", name)
        finally:
            reader.end()

    threading.Thread(target=read, name=f"acp-reader-{name}", daemon=True).start()


def _next_line(
    readline: Callable[[int], bytes], limit: int, too_long: Callable[[int], None]
) -> bytes:
    while True:
        try:
            return readline(limit)
        except LineTooLong as exc:
            too_long(exc.size)


def _replace(request: ElicitationRequest, **changes: Any) -> ElicitationRequest:
    return dataclasses.replace(request, **changes)
