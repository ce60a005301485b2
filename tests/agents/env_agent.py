"""An ACP agent that tells what it was started with: a prompt `env` is answered with its
whole environment as JSON, `pid` with its process id, `leak` by writing its environment to
stderr (as a careless agent might); anything else is echoed.

Standard library only. The credential tests use it to see what reached a real agent process.
"""

import json
import os
import sys

SESSION = "env"


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def say(text: str) -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    send({"jsonrpc": "2.0", "method": "session/update",
          "params": {"sessionId": SESSION, "update": update}})  # fmt: skip


for raw in sys.stdin:
    message = json.loads(raw)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"protocolVersion": 1}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": SESSION}})
    elif method == "session/prompt":
        text = "".join(block.get("text", "") for block in message["params"]["prompt"]).strip()
        if text == "env":
            say(json.dumps(dict(os.environ)))
        elif text == "pid":
            say(str(os.getpid()))
        elif text == "leak":
            for name, value in sorted(os.environ.items()):
                sys.stderr.write(f"debug: {name}={value}\n")
            sys.stderr.flush()
            say("written to stderr")
        else:
            say(text)
        send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})
    elif request_id is not None and method:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": method}})
