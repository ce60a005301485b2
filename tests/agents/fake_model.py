"""A tiny OpenAI-compatible chat completions server on loopback, for real agents under test.

Real ACP agents (opencode, ...) need a model. This one answers from the conversation it is
sent, so that a test can tell whether an agent kept its context: to "remember <words>" it
says "I will remember <words>.", to "recall" it says which words the conversation asked it
to remember ("You asked me to remember: <words>."), or "I remember nothing." if none; to
anything else "Echo: <text>". It streams (server-sent events) when asked to, and counts the
requests it served. Standard library only; run it with `python fake_model.py` (prints its
port) or use `FakeModel` in a test.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def text_of(content: Any) -> str:
    """Return the text of a message's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def answer(messages: list[dict[str, Any]]) -> str:
    """Answer the last user message from the whole conversation."""
    users = [text_of(m.get("content")) for m in messages if m.get("role") == "user"]
    last = users[-1].strip() if users else ""
    remember = re.search(r"\bremember\s+(\S+)", last)
    if remember and "recall" not in last:
        return f"I will remember {remember.group(1)}."
    if re.search(r"\brecall\b", last):
        words = [
            match.group(1)
            for text in users[:-1]
            for match in [re.search(r"\bremember\s+(\S+)", text)]
            if match
        ]
        return f"You asked me to remember: {' '.join(words)}." if words else "I remember nothing."
    return f"Echo: {last}"


class Handler(BaseHTTPRequestHandler):
    server: FakeModelServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": "echo", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "bad json"}})
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no {self.path}"}})
            return
        messages = request.get("messages") or []
        self.server.requests.append(request)
        # A title request (agents name sessions with a second call) gets a short answer.
        reply = answer(messages)
        model = request.get("model", "echo")
        created = int(time.time())
        if not request.get("stream"):
            self._json(200, {
                "id": "fake-1", "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            })  # fmt: skip
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

        def event(delta: dict[str, Any], finish: str | None = None, usage: bool = False) -> None:
            chunk: dict[str, Any] = {
                "id": "fake-1", "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [{"index": 0, "delta": delta,
                                             "finish_reason": finish}],
            }  # fmt: skip
            if usage:
                chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        event({"role": "assistant", "content": ""})
        for word in re.findall(r"\S+\s*", reply):
            event({"content": word})
        event({}, "stop", usage=True)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class FakeModelServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict[str, Any]] = []


class FakeModel:
    """Serve the fake model on a free loopback port while in a `with` block."""

    def __enter__(self) -> FakeModel:
        self.server = FakeModelServer()
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    with FakeModel() as fake:
        print(fake.port, flush=True)
        threading.Event().wait()
