"""An ACP agent that sends updates after its prompt response, as some real agents do.

Standard library only; each prompt gets one chunk, the `end_turn` response, then two more
chunks ("late 1", "late 2").
"""

import json
import sys


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def chunk(text: str) -> dict:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    return {"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": "late", "update": update}}  # fmt: skip


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"protocolVersion": 1}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": "late"}})
    elif method == "session/prompt":
        send(chunk("on time"))
        send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})
        send(chunk("late 1"))
        send(chunk("late 2"))
