"""An ACP agent that will not stop by itself: it ignores session/cancel, the end of its input
and SIGTERM, and keeps a child process of its own. Only killing its process group ends it.

Standard library only. At start it writes "<its pid> <its child's pid>" to `agent-pids` in its
working directory, so a test can check that both are gone.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
with open("agent-pids", "w") as pids:
    pids.write(f"{os.getpid()} {child.pid}\n")

lock = threading.Lock()


def send(message: dict) -> None:
    with lock:
        try:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass  # nobody reads any more; keep running anyway


def stream_forever(session_id: str) -> None:
    i = 0
    while True:
        i += 1
        update = {"sessionUpdate": "agent_message_chunk",
                  "content": {"type": "text", "text": f"deaf {i}\n"}}  # fmt: skip
        send({"jsonrpc": "2.0", "method": "session/update",
              "params": {"sessionId": session_id, "update": update}})  # fmt: skip
        time.sleep(0.05)


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"protocolVersion": 1}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": "deaf"}})
    elif method == "session/prompt":
        threading.Thread(target=stream_forever, args=("deaf",), daemon=True).start()

while True:  # the end of input changes nothing
    time.sleep(1)
