"""The ACP client: one `AgentConnection` talks JSON-RPC 2.0 to one agent process.

What the messages are, how a line is parsed and an answer checked, and the items a turn
yields are `sandboxes.agent.protocol`; this module holds the conversation: its start,
requests, routing and turns. Who hears what the agent sends is `sandboxes.agent.delivery`;
the agent's own requests and their answers `sandboxes.agent.agent_requests`; the cut of live
command output `sandboxes.agent.terminal_output`; the process it talks to
`sandboxes.agent.process`.

ACP (Agent Client Protocol) frames one JSON object per line on the agent's stdin/stdout. The
process hands the connection its stdout's lines, of any length (multi-megabyte tool outputs are
normal), in order and from one thread at a time (`AgentProcess.read_lines`): the reader thread,
which for a local agent is the one thread that serves every agent's pipes (`sandboxes.pipes`)
and for a pod exec a thread of its own. The connection parses them in wire order and routes
them:

* a response (`id`, no `method`) resolves the request that is waiting for it;
* `session/update` notifications go to the running turn's sink, in the order they arrived;
* the agent's own requests (`session/request_permission`, `elicitation/create`, anything
  else), its `$/cancel_request` and its `elicitation/complete` go to `AgentRequests`, which
  surfaces them to the turn and answers every one; Craft sends `$/cancel_request` itself for a
  request of its own whose answer it stopped waiting for;
* tool call updates carrying live command output (`_meta.terminal_output`) are cut to
  `max_terminal_bytes` per tool call (`TerminalOutputLimit`), before anything holds them.

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

import itertools
import json
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NamedTuple, NoReturn

from sandboxes import stderr_text
from sandboxes.agent.agent_requests import AgentRequests
from sandboxes.agent.delivery import Delivery, RunningTurn
from sandboxes.agent.process import AgentProcess, LineReader
from sandboxes.agent.protocol import (
    CLIENT_CAPABILITIES,
    CLIENT_INFO,
    PROTOCOL_VERSION,
    AgentError,
    AuthRequired,
    MalformedAnswer,
    PromptNotSent,
    Sink,
    TurnEnd,
    TurnFailed,
    TurnInProgress,
    Update,
    answer_of,
    parse_line,
    read_auth_methods,
)
from sandboxes.agent.terminal_output import TerminalOutputLimit
from sandboxes.catalog import Credential

logger = logging.getLogger(__name__)

# How long `stop()` waits for the agent's answer to `session/close` before ending it anyway.
CLOSE_SECONDS = 2.0


# How a connection opened its ACP session: a reattach to the stored session (`resume`, or
# `load`, whose replay is not delivered), or a new one (`none`: the agent starts fresh).
RESTORED = ("resume", "load", "none")


class _Waiting(NamedTuple):
    """A request sent to the agent, waiting for its answer."""

    method: str
    future: Future[Any]


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
        self._terminal_output = TerminalOutputLimit(max_terminal_bytes)
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
        # Guards _pending, the turn slot and the agent's open requests: one lock, so that a
        # prompt, its cancel and the agent's requests of its turn never cross.
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one line at a time on stdin
        self._stopped = threading.Event()
        self._reader_done = threading.Event()
        self._delivery = Delivery(self._lock, process.ident)
        self._requests = AgentRequests(self._lock, process.ident, self._write, self._delivery)
        # The id of the session/resume or session/load request while it runs: until its
        # answer, what the agent sends is a replay of what the client has already seen.
        self._restoring: int | None = None

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
        turn = self._delivery.turn
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
        """Who hears updates outside turns; set, it first gets those that came before it."""
        return self._delivery.idle_sink

    @idle_sink.setter
    def idle_sink(self, sink: Sink | None) -> None:
        self._delivery.idle_sink = sink

    @property
    def late_updates_dropped(self) -> int:
        """Return how many updates of an ended turn this connection dropped (see
        `Delivery`)."""
        return self._delivery.late_updates_dropped

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
        return self._delivery.turn is not None

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
        self._delivery.count_late_updates()

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
            if self._delivery.turn is not None:
                raise TurnInProgress("a turn is already running on this connection")
            if not self.is_running:
                raise PromptNotSent("agent is not running")
            request_id, future = self._expect("session/prompt")
            turn = RunningTurn(sink=sink, prompt_id=request_id, stderr_before=stderr_before)
            self._delivery.begin(turn)
            self._terminal_output.reset()
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
                self._delivery.withdraw(turn)
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
            turn = self._delivery.turn
            if turn is None:
                return
            turn.cancelled = True
        if self.agent_session_id is not None:
            try:
                self.notify("session/cancel", {"sessionId": self.agent_session_id})
            except AgentError:
                pass
        self._requests.cancel_turn(turn)

    def answer_permission(self, request_id: str, option_id: str | None) -> bool:
        """Answer the agent's permission request with an option id, or None for cancelled.

        Return False when the request is unknown or already answered.
        """
        return self._requests.answer_permission(request_id, option_id)

    def answer_elicitation(
        self, request_id: str, action: str, content: dict[str, Any] | None = None
    ) -> bool:
        """Answer the agent's elicitation request: `accept` (with a form's checked content),
        `decline` or `cancel`. Return False when the request is unknown or already answered."""
        return self._requests.answer_elicitation(request_id, action, content)

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
        self._delivery.deliver(Update(kind="message_too_large", data=update))

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
                    self._requests.handle(message)
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
                running = self._delivery.turn
                if running is not None and running.prompt_id == response_id:
                    turn = running
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
            self._requests.withdraw(message.get("params"))
            return
        if message.get("method") == "elicitation/complete":
            self._requests.complete(message.get("params"))
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
            limited = self._terminal_output.cut(update, self._delivery.deliver)
            if limited is None:
                return  # nothing left of it: live output past the limit
            update = limited
        self._follow_controls(kind, update)
        # Unknown kinds are delivered as they are: the event log keeps everything.
        self._delivery.deliver(Update(kind=kind, data=update))

    def _follow_controls(self, kind: str, update: dict[str, Any]) -> None:
        """Keep `config_options` and `modes` as the agent's own updates change them."""
        if kind == "config_option_update" and isinstance(update.get("configOptions"), list):
            self.config_options = [o for o in update["configOptions"] if isinstance(o, dict)]
        elif kind == "current_mode_update" and self.modes is not None:
            mode = update.get("currentModeId", update.get("modeId"))
            if isinstance(mode, str):
                self.modes = {**self.modes, "currentModeId": mode}

    def _finish_turn(self, turn: RunningTurn, future: Future[Any]) -> None:
        """Deliver the turn's last item; runs on the reader thread (or on failure paths)."""
        with self._lock:
            if not self._delivery.end(turn):
                return
            self._requests.forget_turn(turn)
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

    def _last_item(self, turn: RunningTurn, future: Future[Any]) -> TurnEnd | TurnFailed:
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
            self._requests.forget_all()
        for waiting in pending:
            if not waiting.future.done():
                waiting.future.set_exception(AgentError(reason))
