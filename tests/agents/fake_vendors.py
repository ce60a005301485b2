"""Fake Anthropic, OpenAI (Responses, Chat Completions) and Gemini model servers on loopback,
for real agents.

Claude Code, Codex and Gemini CLI each speak only their vendor's API; opencode and fast-agent
speak OpenAI's Chat Completions (`<url>/v1`). These servers speak
those APIs the way the real ones do, streaming included, and decide like a tiny model, from
the conversation they are sent and the tools the agent offers in its request:

* `run: <command>`: a call to the agent's shell tool with that command; once the result is
  back, "The tool said: <result>".
* `write <file> <text>`: a call to the agent's file writing tool (Claude Code's `Write`,
  Gemini CLI's `write_file`, Codex's `apply_patch`) that creates `<file>` in the agent's
  working directory with `<text>`; then "The tool said: <result>".
* `slow`: a long answer, one word every quarter second (a turn to cancel).
* anything else as fake_model.py answers it: "remember <word>", "recall", an echo.

Nothing here is a test mode of the agent: the agents run as shipped, pointed at this server
by their base URL settings. Standard library only; `python fake_vendors.py` serves all three
on one port (printed) until interrupted; `FakeVendors` does so in a test. Every request is
kept in `requests` (path and body), and a folder named by `FAKE_VENDORS_LOG` gets a copy of
each, for reading what an agent sends. A key put in `refused_keys` is refused as the real
Anthropic and OpenAI APIs refuse a wrong one (401), every time it is sent.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

try:
    from .fake_model import (
        TRANSCRIPT_OPENING,
        TRANSCRIPT_URI,
        JsonHandler,
        Loopback,
        LoopbackServer,
        answer,
        text_of,
        with_transcripts,
    )
except ImportError:  # run as a script
    from fake_model import (  # type: ignore[no-redef]
        TRANSCRIPT_OPENING,
        TRANSCRIPT_URI,
        JsonHandler,
        Loopback,
        LoopbackServer,
        answer,
        text_of,
        with_transcripts,
    )

SLOW_WORDS = 80
SLOW_DELAY = 0.25

SHELL_TOOLS = (
    "Bash", "run_shell_command", "shell_command", "shell", "exec_command", "bash", "execute",
)  # fmt: skip
WRITE_TOOLS = ("Write", "write_file", "apply_patch", "write")


@dataclass
class Move:
    """What the model does next: say `text` (slowly, perhaps), or call `tool` with `args`."""

    text: str = ""
    slow: bool = False
    tool: str = ""
    args: dict[str, Any] = field(default_factory=dict)


def decide(users: list[str], result: str | None, tools: list[str], cwd: str) -> Move:
    """Decide the next move from the person's messages, a tool's result that just came back
    (None if the last message is the person's), the names of the tools the agent offers, and
    the agent's working directory (as its prompt says it)."""
    if result is not None:
        return Move(text=f"The tool said: {result.strip()}")
    last = users[-1].strip() if users else ""
    # An MCP server's command tool first (named `<server>...run_command` by the agent), else
    # the agent's own shell.
    mcp = next((name for name in tools if name.endswith("run_command")), "")
    shell = mcp or next((name for name in SHELL_TOOLS if name in tools), "")
    write = next((name for name in WRITE_TOOLS if name in tools), "")
    if (run := re.search(r"^run: (.+)$", last, re.M)) and shell:
        command = run.group(1).strip()
        return Move(tool=shell, args=shell_arguments(shell, command, cwd))
    if (wanted := re.search(r"^write (\S+) (.+)$", last, re.M)) and write:
        path, text = wanted.group(1), wanted.group(2)
        return Move(tool=write, args=write_arguments(write, path, text + "\n", cwd))
    if re.fullmatch(r"slow", last):
        words = " ".join(f"word{n}" for n in range(1, SLOW_WORDS + 1))
        return Move(text=f"Slowly: {words}.", slow=True)
    return Move(text=answer([{"role": "user", "content": text} for text in users]))


def shell_arguments(tool: str, command: str, cwd: str) -> dict[str, Any]:
    if tool == "shell":  # Codex's older shell tool takes an argv
        return {"command": ["bash", "-lc", command], "workdir": cwd}
    if tool in ("shell_command", "exec_command"):
        return {"command" if tool == "shell_command" else "cmd": command, "workdir": cwd}
    return {"command": command, "description": f"Run {command}"}


def write_arguments(tool: str, path: str, text: str, cwd: str) -> dict[str, Any]:
    if tool == "apply_patch":
        lines = "".join(f"+{line}\n" for line in text.splitlines())
        return {"input": f"*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch\n"}
    absolute = path if path.startswith("/") or not cwd else f"{cwd.rstrip('/')}/{path}"
    if tool == "write":  # opencode's
        return {"filePath": absolute, "content": text}
    return {"file_path": absolute, "content": text}


def working_directory(request: Any) -> str:
    """Return the working directory the agent's prompt names, or ""."""
    blob = json.dumps(request)
    for pattern in (
        r"[Ww]orking directory: ([^\s\\\"]+)",  # Claude Code's system prompt
        r"<cwd>([^<]+)</cwd>",  # Codex's environment context
        r"working in the directory: ([^\s\\\"]+)",  # Gemini CLI's first message
    ):
        if found := re.search(pattern, blob):
            return found.group(1).rstrip(".")
    return ""


def sees_the_person(text: str) -> bool:
    """Return whether a user text block is the person's, not an agent's reminder or context."""
    stripped = text.lstrip()
    return bool(stripped) and not stripped.startswith("<")


def without_interruptions(text: str) -> str:
    """Return a user text without the notes Claude Code adds after a cancelled turn."""
    return re.sub(r"^\[Request interrupted by user[^\]]*\]\n?", "", text, flags=re.M).strip()


# --- OpenAI Chat Completions -----------------------------------------------------------------


def chat_move(request: dict[str, Any]) -> Move:
    messages = request.get("messages") or []
    users = [
        text
        for m in messages
        if m.get("role") == "user" and sees_the_person(text := text_of(m.get("content"), "\n"))
    ]
    last = messages[-1] if messages else {}
    result = text_of(last.get("content"), "\n") if last.get("role") == "tool" else None
    tools = [
        (t.get("function") or {}).get("name", "")
        for t in request.get("tools") or []
        if isinstance(t, dict)
    ]
    return decide(users, result, tools, working_directory(request))


# --- Anthropic Messages ----------------------------------------------------------------------


def anthropic_move(request: dict[str, Any]) -> Move:
    users: list[str] = []
    result: str | None = None
    for message in request.get("messages") or []:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        if message.get("role") != "user":
            result = None
            continue
        # After a cancelled turn Claude Code sends what the person said then with a note of
        # the interruption, in one message: the last block, note removed, is what they said.
        texts = [
            without_interruptions(b.get("text", "")) for b in blocks if b.get("type") == "text"
        ]
        # A transcript Craft gives a new session (an embedded resource: Claude Code sends a
        # link to it in the message and its text as a <context> block after): what the
        # person said in it came before this message.
        earlier = [t for t in texts if TRANSCRIPT_OPENING in t]
        users += [u for u in with_transcripts(earlier) if sees_the_person(u)]
        users += [t for t in texts if sees_the_person(t) and t not in earlier
                  and t.strip() != TRANSCRIPT_URI]  # fmt: skip
        results = [
            text_of(b.get("content"), "\n") for b in blocks if b.get("type") == "tool_result"
        ]
        result = "\n".join(results) if results else None
    tools = [t.get("name", "") for t in request.get("tools") or []]
    return decide(users, result, tools, working_directory(request.get("system")))


# --- OpenAI Responses ------------------------------------------------------------------------


def responses_move(request: dict[str, Any]) -> Move:
    users: list[str] = []
    result: str | None = None
    for item in request.get("input") or []:
        kind = item.get("type", "message")
        if kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            result = output if isinstance(output, str) else json.dumps(output)
        elif kind == "message" and item.get("role") == "user":
            parts = item.get("content")
            texts = [parts] if isinstance(parts, str) else [p.get("text", "") for p in parts or []]
            person = " ".join(t for t in texts if sees_the_person(t))
            if person:
                users.append(person)
                result = None
        elif kind == "message" and item.get("role") == "assistant":
            result = None
    tools = [t.get("name") or t.get("type", "") for t in request.get("tools") or []]
    return decide(users, result, tools, working_directory(request.get("input")))


# --- Gemini ----------------------------------------------------------------------------------


def gemini_move(request: dict[str, Any]) -> Move:
    users: list[str] = []
    result: str | None = None
    for content in request.get("contents") or []:
        parts = content.get("parts") or []
        if content.get("role") != "user":
            result = None
            continue
        responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
        if responses:
            result = "\n".join(json.dumps(r.get("response")) for r in responses)
            continue
        person = " ".join(p.get("text", "") for p in parts if sees_the_person(p.get("text", "")))
        if person:
            users.append(person)
            result = None
    tools = [
        declaration.get("name", "")
        for tool in request.get("tools") or []
        for declaration in tool.get("functionDeclarations") or []
    ]
    return decide(users, result, tools, working_directory(request.get("contents")))


# --- the server ------------------------------------------------------------------------------


class Handler(JsonHandler):
    server: FakeVendorsServer
    protocol_version = "HTTP/1.1"

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _sse(self, data: Any, event: str | None = None) -> None:
        head = f"event: {event}\n" if event else ""
        self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def do_GET(self) -> None:
        self.server.keep(self.path, None)
        super().do_GET()

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        request = self._request()
        if request is None:
            return
        self.server.keep(self.path, request)
        path = self.path.split("?")[0]
        try:
            if self.refused_key():
                self.refuse_key(path)
            elif path.endswith("/messages/count_tokens"):
                self._json(200, {"input_tokens": 10})
            elif path.endswith("/messages"):
                self.anthropic(request)
            elif path.endswith("/responses"):
                self.openai_responses(request)
            elif path.endswith("/chat/completions"):
                self.chat_completions(request)
            elif ":countTokens" in path:
                self._json(200, {"totalTokens": 10})
            elif ":generateContent" in path or ":streamGenerateContent" in path:
                self.gemini(request, stream=":streamGenerateContent" in path)
            else:
                self._json(404, {"error": {"message": f"no {self.path}"}})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent hung up (a cancelled turn)

    def words(self, move: Move) -> list[str]:
        return re.findall(r"\S+\s*", move.text)

    def pause(self, move: Move) -> None:
        if move.slow:
            time.sleep(SLOW_DELAY)

    def refused_key(self) -> bool:
        """Whether the request carries a key of `refused_keys` (Anthropic's header, or
        OpenAI's bearer token)."""
        bearer = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        return bool({self.headers.get("x-api-key"), bearer} & self.server.refused_keys)

    def refuse_key(self, path: str) -> None:
        """Answer as the vendor's API answers a wrong key (Anthropic:
        https://docs.anthropic.com/en/api/errors; OpenAI: `invalid_api_key`)."""
        if path.endswith("/responses"):
            error = {"message": "Incorrect API key provided", "type": "invalid_request_error",
                     "param": None, "code": "invalid_api_key"}  # fmt: skip
            self._json(401, {"error": error})
            return
        error = {"type": "authentication_error", "message": "invalid x-api-key"}
        self._json(401, {"type": "error", "error": error, "request_id": "req_fake"})

    # Anthropic Messages: https://docs.anthropic.com/en/api/messages-streaming
    def anthropic(self, request: dict[str, Any]) -> None:
        move = anthropic_move(request)
        number = self.server.next_number()
        model = request.get("model", "claude-fake")
        usage = {"input_tokens": 10, "output_tokens": 5}
        if move.tool:
            block: dict[str, Any] = {
                "type": "tool_use", "id": f"toolu_fake{number}", "name": move.tool,
                "input": move.args,
            }  # fmt: skip
            stop = "tool_use"
        else:
            block = {"type": "text", "text": move.text}
            stop = "end_turn"
        message = {
            "id": f"msg_fake{number}", "type": "message", "role": "assistant", "model": model,
            "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage,
        }  # fmt: skip
        if not request.get("stream"):
            self._json(200, message)
            return
        self._start_stream()
        self._sse({"type": "message_start", "message": {
            **message, "content": [], "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        }}, "message_start")  # fmt: skip
        if move.tool:
            start = {**block, "input": {}}
            self._sse({"type": "content_block_start", "index": 0, "content_block": start},
                      "content_block_start")  # fmt: skip
            delta = {"type": "input_json_delta", "partial_json": json.dumps(move.args)}
            self._sse({"type": "content_block_delta", "index": 0, "delta": delta},
                      "content_block_delta")  # fmt: skip
        else:
            start = {"type": "text", "text": ""}
            self._sse({"type": "content_block_start", "index": 0, "content_block": start},
                      "content_block_start")  # fmt: skip
            for word in self.words(move):
                self.pause(move)
                delta = {"type": "text_delta", "text": word}
                self._sse({"type": "content_block_delta", "index": 0, "delta": delta},
                          "content_block_delta")  # fmt: skip
        self._sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        self._sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                   "usage": {"output_tokens": 5}}, "message_delta")  # fmt: skip
        self._sse({"type": "message_stop"}, "message_stop")

    # OpenAI Responses: https://platform.openai.com/docs/api-reference/responses-streaming
    def openai_responses(self, request: dict[str, Any]) -> None:
        move = responses_move(request)
        number = self.server.next_number()
        response_id = f"resp_fake{number}"
        model = request.get("model", "echo")
        base = {"id": response_id, "object": "response", "model": model, "created_at": 0}
        if move.tool == "apply_patch" and self.server.custom_apply_patch(request):
            item: dict[str, Any] = {
                "type": "custom_tool_call", "id": f"ctc_fake{number}", "status": "completed",
                "call_id": f"call_fake{number}", "name": "apply_patch",
                "input": move.args["input"],
            }  # fmt: skip
        elif move.tool:
            item = {
                "type": "function_call", "id": f"fc_fake{number}", "status": "completed",
                "call_id": f"call_fake{number}", "name": move.tool,
                "arguments": json.dumps(move.args),
            }  # fmt: skip
        else:
            item = {
                "type": "message", "id": f"msg_fake{number}", "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": move.text, "annotations": []}],
            }  # fmt: skip
        usage = {
            "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        }  # fmt: skip
        if not request.get("stream"):
            self._json(200, {**base, "status": "completed", "output": [item], "usage": usage})
            return
        self._start_stream()
        sequence = itertools.count()

        def send(kind: str, **fields: Any) -> None:
            self._sse({"type": kind, "sequence_number": next(sequence), **fields}, kind)

        send("response.created", response={**base, "status": "in_progress", "output": []})
        if item["type"] == "message":
            started = {**item, "status": "in_progress", "content": []}
            send("response.output_item.added", output_index=0, item=started)
            for word in self.words(move):
                self.pause(move)
                send("response.output_text.delta", item_id=item["id"], output_index=0,
                     content_index=0, delta=word)  # fmt: skip
        else:
            send("response.output_item.added", output_index=0, item=item)
        send("response.output_item.done", output_index=0, item=item)
        send("response.completed", response={
            **base, "status": "completed", "output": [item], "usage": usage,
        })  # fmt: skip

    # OpenAI Chat Completions: https://platform.openai.com/docs/api-reference/chat-streaming
    def chat_completions(self, request: dict[str, Any]) -> None:
        move = chat_move(request)
        number = self.server.next_number()
        model = request.get("model", "echo")
        base = {"id": f"chatcmpl-fake{number}", "created": 0, "model": model}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        call = {
            "id": f"call_fake{number}", "type": "function",
            "function": {"name": move.tool, "arguments": json.dumps(move.args)},
        }  # fmt: skip
        finish = "tool_calls" if move.tool else "stop"
        if not request.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": move.text or None}
            if move.tool:
                message["tool_calls"] = [call]
            choice = {"index": 0, "message": message, "finish_reason": finish}
            self._json(200, {**base, "object": "chat.completion", "choices": [choice],
                             "usage": usage})  # fmt: skip
            return
        self._start_stream()

        def send(delta: dict[str, Any], done: str | None = None) -> None:
            choice = {"index": 0, "delta": delta, "finish_reason": done}
            self._sse({**base, "object": "chat.completion.chunk", "choices": [choice]})

        send({"role": "assistant", "content": ""})
        if move.tool:
            send({"tool_calls": [{"index": 0, **call}]})
        for word in self.words(move):
            self.pause(move)
            send({"content": word})
        send({}, finish)
        self._sse({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    # Gemini: https://ai.google.dev/api/generate-content
    def gemini(self, request: dict[str, Any], stream: bool) -> None:
        config = request.get("generationConfig") or {}
        if config.get("responseMimeType") == "application/json":
            # Gemini CLI's own side questions (who speaks next, which model to route to).
            reply = json.dumps(json_answer(config))
            move = Move(text=reply)
        else:
            move = gemini_move(request)
        usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}

        def chunk(parts: list[dict[str, Any]], finish: str | None) -> dict[str, Any]:
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            if finish:
                candidate["finishReason"] = finish
            return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "echo"}

        if move.tool:
            parts = [{"functionCall": {"name": move.tool, "args": move.args}}]
        else:
            parts = [{"text": move.text}]
        if not stream:
            self._json(200, chunk(parts, "STOP"))
            return
        self._start_stream()
        if move.tool:
            self._sse(chunk(parts, "STOP"))
            return
        words = self.words(move)
        for index, word in enumerate(words):
            self.pause(move)
            self._sse(chunk([{"text": word}], "STOP" if index == len(words) - 1 else None))


def json_answer(config: dict[str, Any]) -> dict[str, Any]:
    """Answer a request for JSON with the least the schema asks: the person speaks next."""
    schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
    properties = schema.get("properties") or {}
    reply: dict[str, Any] = {}
    for name, spec in properties.items():
        choices = spec.get("enum")
        if name == "next_speaker":
            reply[name] = "user"
        elif choices:
            reply[name] = choices[0]
        elif (spec.get("type") or "").lower() in ("boolean",):
            reply[name] = False
        elif (spec.get("type") or "").lower() in ("number", "integer"):
            reply[name] = spec.get("minimum", 1)
        else:
            reply[name] = "fake"
    return reply


class FakeVendorsServer(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(Handler)
        self.requests: list[tuple[str, Any]] = []
        self.refused_keys: set[str] = set()  # API keys answered 401
        self.numbers = itertools.count(1)
        self.lock = threading.Lock()
        self.log = os.environ.get("FAKE_VENDORS_LOG")

    def next_number(self) -> int:
        with self.lock:
            return next(self.numbers)

    def keep(self, path: str, body: Any) -> None:
        with self.lock:
            self.requests.append((path, body))
            if self.log:
                os.makedirs(self.log, exist_ok=True)
                name = f"{len(self.requests):03d}.json"
                with open(os.path.join(self.log, name), "w") as out:
                    json.dump({"path": path, "body": body}, out, indent=1)

    def custom_apply_patch(self, request: dict[str, Any]) -> bool:
        """Return whether the agent offers apply_patch as a freeform (custom) tool."""
        return any(
            t.get("name") == "apply_patch" and t.get("type") == "custom"
            for t in request.get("tools") or []
        )


class FakeVendors(Loopback):
    """Serve the three fake APIs on a free loopback port while in a `with` block."""

    server_class = FakeVendorsServer
    server: FakeVendorsServer

    @property
    def requests(self) -> list[tuple[str, Any]]:
        return self.server.requests


if __name__ == "__main__":
    FakeVendors.main()
