"""An ACP agent that ignores `session/cancel`: it streams until it is killed.

Standard library only; used to prove that cancelling a turn works even against such an agent.
"""

import json
import os
import sys
import threading
import time

lock = threading.Lock()


def send(message: dict) -> None:
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def stream_forever(session_id: str) -> None:
    i = 0
    while True:
        i += 1
        update = {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": f"pid {os.getpid()} chunk {i}\n"},
        }
        send({"jsonrpc": "2.0", "method": "session/update",
              "params": {"sessionId": session_id, "update": update}})  # fmt: skip
        time.sleep(0.05)


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"protocolVersion": 1}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": "stubborn"}})
    elif method == "session/prompt":
        threading.Thread(target=stream_forever, args=("stubborn",), daemon=True).start()
    # session/cancel and everything else: ignored, on purpose.
