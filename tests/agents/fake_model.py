"""A tiny OpenAI-compatible chat completions server on loopback, for real agents under test.

Real ACP agents (opencode, ...) need a model. This one answers from the conversation it is
sent, so that a test can tell whether an agent kept its context: to "remember <words>" it
says "I will remember <words>.", to "recall" it says which words the conversation asked it
to remember ("You asked me to remember: <words>."), or "I remember nothing." if none; to
anything else "Echo: <text>". It streams (server-sent events) when asked to, and counts the
requests it served. Standard library only; run it with `python fake_model.py` (prints its
port) or use `FakeModel` in a test. Its handler and server bases serve fake_vendors.py too.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


def text_of(content: Any, joiner: str = " ") -> str:
    """Return the text of a message's content (a string or a list of parts, joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return joiner.join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


# A transcript of an earlier conversation that a client gives a new session (Craft, after a
# fork or a rewind: craft/turns/going_back.py): the user's messages in <user>, the agent's in
# <agent>, after this opening.
TRANSCRIPT_OPENING = "This conversation continues an earlier one"
TRANSCRIPT_URI = "craft:transcript"
SAID = re.compile(r"<(user|agent)>\n(.*?)\n</\1>", re.DOTALL)


def with_transcripts(users: list[str]) -> list[str]:
    """Return the user's messages, each transcript in one taken as the earlier messages it
    holds, and the rest of that message after them."""
    out: list[str] = []
    for text in users:
        start = text.find(TRANSCRIPT_OPENING)
        if start < 0:
            out.append(text)
            continue
        said = list(SAID.finditer(text, start))
        end = said[-1].end() if said else len(text)
        out += [match.group(2) for match in said if match.group(1) == "user"]
        out.append(text[:start] + text[end:])
    return out


def answer(messages: list[dict[str, Any]]) -> str:
    """Answer the last user message from the whole conversation."""
    users = [text_of(m.get("content")) for m in messages if m.get("role") == "user"]
    users = with_transcripts(users)
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


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler of JSON requests that lists one model, "echo", on GET .../models."""

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _request(self) -> Any:
        """Return the request's JSON body ({} if empty), or None once a 400 answered it."""
        length = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "bad json"}})
            return None

    def do_GET(self) -> None:
        if self.path.split("?")[0].rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": "echo", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no {self.path}"}})


class Handler(JsonHandler):
    server: FakeModelServer

    def do_POST(self) -> None:
        request = self._request()
        if request is None:
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


class LoopbackServer(ThreadingHTTPServer):
    """A server on a free loopback port, a thread a request."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)


class FakeModelServer(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(Handler)
        self.requests: list[dict[str, Any]] = []


class Loopback:
    """Serve a `server_class()` on a thread of its own while in a `with` block; `url` is
    its address with `path` (the API's root) after it."""

    server_class: Callable[[], LoopbackServer]
    path = ""

    def __enter__(self) -> Self:
        self.server = self.server_class()
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{self.path}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @classmethod
    def main(cls) -> None:
        """Serve until interrupted, printing the port (the modules' `python <file>`)."""
        with cls() as fake:
            print(fake.port, flush=True)
            threading.Event().wait()


class FakeModel(Loopback):
    """Serve the fake model on a free loopback port while in a `with` block."""

    server_class = FakeModelServer
    path = "/v1"


def opencode_config(model_url: str) -> dict[str, Any]:
    """opencode's configuration that points it at the fake model served at `model_url`."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": model_url, "apiKey": "none"},
                "models": {"echo": {"name": "Echo"}},
            }
        },
        "model": "fake/echo",
        "autoupdate": False,
        "share": "disabled",
    }


if __name__ == "__main__":
    FakeModel.main()
