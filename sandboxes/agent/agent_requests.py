"""What an agent asks of Craft during a turn, and Craft's answers.

An agent's request (a message with `method` and `id`) is answered whatever its shape:

* `session/request_permission` is surfaced to the running turn as a `PermissionRequest` (its
  options normalised, see `normalise_options`) and answered through `answer_permission()`;
* `elicitation/create` as an `ElicitationRequest` (its form checked, see
  `sandboxes.elicitation`) answered through `answer_elicitation()`; one Craft cannot show is
  refused (error -32602) and still shown, closed;
* everything else (`fs/*`, `terminal/*`, ...) gets "method not found", because Craft
  advertises no such capability.

Nobody can answer outside a turn, and a cancelled turn's requests are cancelled: those are
answered at once. `$/cancel_request` from the agent withdraws an open request (answered with
error -32800, and the turn hears a `RequestWithdrawn`); `elicitation/complete` for a URL
elicitation it asked becomes an `elicitation_complete` update.

The connection's lock guards the open requests and the turn slot together, so that a request
and a cancel of its turn never cross; a method that says "hold the lock" is called with it
held.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandboxes import elicitation
from sandboxes.agent.delivery import Delivery, RunningTurn
from sandboxes.agent.protocol import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    AgentError,
    ElicitationRequest,
    PermissionRequest,
    RequestWithdrawn,
    Update,
    normalise_options,
)

logger = logging.getLogger(__name__)

# URL elicitations whose completion is followed, per connection (the last ones asked).
URL_ELICITATIONS = 100


@dataclass
class _Open:
    """An agent's request surfaced to a turn, waiting for a person's answer."""

    jsonrpc_id: Any
    turn: RunningTurn
    # Each offered option id as Craft shows it (a string) -> the id exactly as the agent sent it.
    option_ids: dict[str, Any] = field(default_factory=dict)
    # "elicitation" for an elicitation/create request (answered with an action, not an option).
    kind: str = "permission"


class AgentRequests:
    """The open requests of one connection's agent (see the module's docstring)."""

    def __init__(
        self,
        lock: threading.Lock,
        ident: str,
        write: Callable[[dict[str, Any]], None],
        delivery: Delivery,
    ) -> None:
        self._lock = lock
        self._ident = ident  # the agent process's, for logs
        self._write = write  # one JSON-RPC message to the agent; raises AgentError
        self._delivery = delivery
        self._open: dict[str, _Open] = {}  # Craft's request id -> the agent's request
        # The elicitationId of each URL elicitation asked (the last URL_ELICITATIONS), and
        # whether the agent said it completed: `elicitation/complete` of others is ignored.
        self._url_elicitations: dict[str, bool] = {}

    # --- the agent asks ---------------------------------------------------------------------

    def handle(self, message: dict[str, Any]) -> None:
        """Take a request of the agent (reader thread)."""
        method = message["method"]
        if method == "session/request_permission":
            self._take_permission_request(message)
        elif method == "elicitation/create":
            self._take_elicitation(message)
        else:
            self._answer_error(message["id"], METHOD_NOT_FOUND, f"{method!r:.100} is not supported")

    def withdraw(self, params: Any) -> None:
        """The agent withdraws a request of its own (`$/cancel_request`): answer it with error
        -32800 (ACP wants an answer either way) and tell the turn, whose card then closes."""
        if not isinstance(params, dict) or "requestId" not in params:
            logger.warning("agent %s sent $/cancel_request without requestId", self._ident)
            return
        wanted = params["requestId"]
        with self._lock:
            found = next(
                (
                    (rid, p)
                    for rid, p in self._open.items()
                    if type(p.jsonrpc_id) is type(wanted) and p.jsonrpc_id == wanted
                ),
                None,
            )
            if found is not None:
                del self._open[found[0]]
        if found is None:
            return  # answered already, or never asked: nothing to withdraw
        request_id, pending = found
        self._answer_error(pending.jsonrpc_id, REQUEST_CANCELLED, "request cancelled")
        self._delivery.deliver(RequestWithdrawn(request_id=request_id, kind=pending.kind))

    def complete(self, params: Any) -> None:
        """The agent says the out-of-band part of a URL elicitation is done
        (`elicitation/complete`): tell the turn (or the idle sink) once, as an
        `elicitation_complete` update; unknown or already completed ids are ignored, as ACP
        asks."""
        wanted = params.get("elicitationId") if isinstance(params, dict) else None
        with self._lock:
            if not isinstance(wanted, str) or self._url_elicitations.get(wanted) is not False:
                return
            self._url_elicitations[wanted] = True
        update = {"sessionUpdate": "elicitation_complete", "elicitationId": wanted}
        self._delivery.deliver(Update("elicitation_complete", update))

    # --- a person answers -------------------------------------------------------------------

    def answer_permission(self, request_id: str, option_id: str | None) -> bool:
        """Answer a permission request with an option id, or None for cancelled.

        Return False when the request is unknown or already answered.
        """
        with self._lock:
            pending = self._open.get(request_id)
            if pending is None or pending.kind != "permission":
                return False
            del self._open[request_id]
        if option_id is not None and option_id not in pending.option_ids:
            with self._lock:
                self._open[request_id] = pending
            raise ValueError(f"unknown option {option_id!r} for permission request")
        outcome: dict[str, Any] = (
            {"outcome": "cancelled"}
            if option_id is None
            else {"outcome": "selected", "optionId": pending.option_ids[option_id]}
        )
        return self._answered(pending.jsonrpc_id, {"outcome": outcome})

    def answer_elicitation(
        self, request_id: str, action: str, content: dict[str, Any] | None = None
    ) -> bool:
        """Answer an elicitation request: `accept` (with a form's checked content), `decline`
        or `cancel`. Return False when the request is unknown or already answered."""
        with self._lock:
            pending = self._open.get(request_id)
            if pending is None or pending.kind != "elicitation":
                return False
            del self._open[request_id]
        result: dict[str, Any] = {"action": action}
        if action == "accept" and content is not None:
            result["content"] = content
        return self._answered(pending.jsonrpc_id, result)

    def cancel_turn(self, turn: RunningTurn) -> None:
        """Answer every open request of a turn being cancelled: "cancelled" (its turn is
        already marked cancelled, so no new one opens)."""
        with self._lock:
            waiting = [(rid, p.kind) for rid, p in self._open.items() if p.turn is turn]
        for request_id, kind in waiting:
            if kind == "elicitation":
                self.answer_elicitation(request_id, "cancel")
            else:
                self.answer_permission(request_id, None)

    def forget_turn(self, turn: RunningTurn) -> None:
        """Drop the open requests of a turn that has ended (hold the lock)."""
        for rid in [rid for rid, p in self._open.items() if p.turn is turn]:
            del self._open[rid]

    def forget_all(self) -> None:
        """Drop every open request: the agent is gone (hold the lock)."""
        self._open.clear()

    # --- internals --------------------------------------------------------------------------

    def _take_permission_request(self, message: dict[str, Any]) -> None:
        """Surface a permission request to the turn; whatever its shape, the agent hears back."""
        params = message.get("params")
        if not isinstance(params, dict):
            self._answer_error(message["id"], INVALID_PARAMS, "params must be an object")
            return
        options, option_ids = normalise_options(params.get("options"))
        tool_call = params.get("toolCall")
        request_id = uuid.uuid4().hex
        if not options:
            logger.warning("agent %s asked permission without options", self._ident)
        opened = bool(options) and self._open_for_turn(
            request_id,
            lambda turn: _Open(jsonrpc_id=message["id"], turn=turn, option_ids=option_ids),
        )
        if not opened:
            # Nobody can answer outside a turn, a cancelled turn answers "cancelled", and a
            # request without one usable option cannot be answered otherwise.
            self._answer(message["id"], {"outcome": {"outcome": "cancelled"}})
            return
        self._delivery.deliver(
            PermissionRequest(
                request_id=request_id,
                tool_call=dict(tool_call) if isinstance(tool_call, dict) else {},
                options=options,
            )
        )

    def _take_elicitation(self, message: dict[str, Any]) -> None:
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
                request = dataclasses.replace(request, fields=fields)
            elif mode == "url":
                url = elicitation.read_url(params.get("url"))
                elicitation_id = params.get("elicitationId")
                request = dataclasses.replace(
                    request,
                    url=url,
                    elicitation_id=str(elicitation_id)[:200] if elicitation_id is not None else "",
                )
                if request.elicitation_id:
                    self._follow_url_elicitation(request.elicitation_id)
            else:
                raise elicitation.BadRequest(f"Craft knows no elicitation mode {mode!r:.40}")
        except elicitation.BadRequest as bad:
            self._answer_error(message["id"], INVALID_PARAMS, str(bad))
            self._delivery.deliver(dataclasses.replace(request, refused=str(bad)))
            return
        opened = self._open_for_turn(
            request.request_id,
            lambda turn: _Open(jsonrpc_id=message["id"], turn=turn, kind="elicitation"),
        )
        if not opened:
            # Nobody can answer outside a turn; a cancelled turn's requests are cancelled.
            self._answer(message["id"], {"action": "cancel"})
            return
        self._delivery.deliver(request)

    def _open_for_turn(self, request_id: str, make: Callable[[RunningTurn], _Open]) -> bool:
        """Keep a request open for the running turn, if one runs and is not cancelled;
        return whether it was."""
        with self._lock:
            turn = self._delivery.turn
            if turn is None or turn.cancelled:
                return False
            self._open[request_id] = make(turn)
            return True

    def _follow_url_elicitation(self, elicitation_id: str) -> None:
        with self._lock:
            self._url_elicitations[elicitation_id] = False
            while len(self._url_elicitations) > URL_ELICITATIONS:
                del self._url_elicitations[next(iter(self._url_elicitations))]

    def _answered(self, jsonrpc_id: Any, result: dict[str, Any]) -> bool:
        """Send a person's answer to an agent's request; False if the agent is gone."""
        try:
            self._answer(jsonrpc_id, result)
        except AgentError:
            return False
        return True

    def _answer(self, jsonrpc_id: Any, result: dict[str, Any]) -> None:
        self._write({"jsonrpc": "2.0", "id": jsonrpc_id, "result": result})

    def _answer_error(self, jsonrpc_id: Any, code: int, text: str) -> None:
        self._write({"jsonrpc": "2.0", "id": jsonrpc_id, "error": {"code": code, "message": text}})
