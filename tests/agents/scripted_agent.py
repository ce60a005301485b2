"""An ACP agent that says exactly what it is told to: each prompt's text is a JSON list of
lines, which it writes to stdout verbatim (one per line), then it answers `end_turn`.

Standard library only. The property tests use it to feed Craft arbitrary agent output.
"""

import json
import sys

SESSION = "scripted"


def send_line(line: str) -> None:
    sys.stdout.buffer.write(line.encode("utf-8", "surrogatepass") + b"\n")
    sys.stdout.flush()


def send(message: dict) -> None:
    send_line(json.dumps(message))


for raw in sys.stdin:
    message = json.loads(raw)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"protocolVersion": 1}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": SESSION}})
    elif method == "session/prompt":
        text = "".join(block.get("text", "") for block in message["params"]["prompt"])
        for line in json.loads(text):
            send_line(line.replace("\n", " "))
        send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})
