"""An ACP agent that sends updates after its prompt response, as some real agents do.

Standard library only. Each prompt gets one chunk ("on time") and its answer, `end_turn`;
the prompt `wait` gets its chunk, then its answer only once a `session/cancel` came,
`cancelled` (as a cancelled Claude Code turn did). After every answer come, late, the chunk
"late 1", a tool call, a plan, the chunk "late 2" (updates of the turn that just ended) and
last a `usage_update` (an update of the session, which may come any time).
"""

import json
import sys

SESSION = "late"


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def update(fields: dict) -> None:
    send({"jsonrpc": "2.0", "method": "session/update",
          "params": {"sessionId": SESSION, "update": fields}})  # fmt: skip


def chunk(text: str) -> None:
    update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})


def answer(request_id: int, stop_reason: str) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": stop_reason}})
    chunk("late 1")
    update(
        {"sessionUpdate": "tool_call", "toolCallId": "late", "title": "Late", "status": "pending"}
    )
    update({"sessionUpdate": "plan", "entries": [{"content": "late", "status": "pending"}]})
    chunk("late 2")
    update({"sessionUpdate": "usage_update", "used": 10, "size": 1000})


waiting = None  # the id of a `wait` prompt not answered yet
for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"protocolVersion": 1}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": SESSION}})
    elif method == "session/prompt":
        chunk("on time")
        if message["params"]["prompt"][0]["text"] == "wait":
            waiting = request_id
        else:
            answer(request_id, "end_turn")
    elif method == "session/cancel" and waiting is not None:
        answer(waiting, "cancelled")
        waiting = None
