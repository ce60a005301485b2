"""An ACP agent in trouble that says so only on stderr, as real agents do.

Standard library only. Started with `--broken`, it dies at start of an import that fails (a
real Python traceback on stderr, exit code 1). Otherwise the prompt's first word picks:

  crash      writes a log line to stderr, then dies of an uncaught exception mid-turn (a real
             traceback, exit code 1); the turn's prompt is never answered. `crash deep`
             logs 100 lines first: more than the tail Craft keeps
  error      logs the model provider's 401 to stderr, then answers the prompt with JSON-RPC
             error -32603 "Internal error", as Codex does with a wrong key
  quiet      writes "retrying the model call (attempt 1/5): 503 Service Unavailable" to stderr
             and sends nothing until a file `next` appears in its working folder; then
             "(attempt 2/5)" and nothing until a file `go` appears; then the chunk
             "answered at last" and `end_turn`. `cancel` ends it early, `cancelled`.
  anything else  the chunk "fine" and `end_turn`

Each stderr line is flushed at once; the files let a test move the agent on without waiting
for a time to pass.
"""

import json
import os
import sys
import threading
import time

SESSION = "troubled"
lock = threading.Lock()
cancelled = threading.Event()


def send(message: dict) -> None:
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def log(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def chunk(text: str) -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    send({"jsonrpc": "2.0", "method": "session/update",
          "params": {"sessionId": SESSION, "update": update}})  # fmt: skip


def wait_for(name: str) -> bool:
    """Wait until a file `name` appears in the working folder (False if cancelled first)."""
    while not os.path.exists(name):
        if cancelled.is_set():
            return False
        time.sleep(0.02)
    return True


def quiet(request_id: int) -> None:
    log("retrying the model call (attempt 1/5): 503 Service Unavailable")
    if wait_for("next"):
        log("retrying the model call (attempt 2/5): 503 Service Unavailable")
        if wait_for("go"):
            chunk("answered at last")
            send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})
            return
    send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "cancelled"}})


def crash(chatter: int = 0) -> None:
    for n in range(chatter):
        log(f"step {n + 1} of {chatter}: fetched the context (12 files, 4,096 tokens)")
    log("calling the model")
    raise RuntimeError("the model provider closed the connection")


def main() -> None:
    if "--broken" in sys.argv:
        import acp_runtime_that_is_not_installed  # noqa: F401  (an install missing a part)
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"protocolVersion": 1}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": SESSION}})
        elif method == "session/cancel":
            cancelled.set()
        elif method == "session/prompt":
            cancelled.clear()
            word = (message["params"]["prompt"][0].get("text") or "").split()[:1]
            if word == ["crash"]:
                deep = "deep" in (message["params"]["prompt"][0].get("text") or "")
                crash(100 if deep else 0)
            elif word == ["error"]:
                log('ERROR model: unexpected status 401 Unauthorized: {"error": "invalid api key"}')
                error = {"code": -32603, "message": "Internal error"}
                send({"jsonrpc": "2.0", "id": request_id, "error": error})
            elif word == ["quiet"]:
                threading.Thread(target=quiet, args=(request_id,), daemon=True).start()
            else:
                chunk("fine")
                send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})


main()
