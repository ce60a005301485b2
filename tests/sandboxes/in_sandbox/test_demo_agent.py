"""Drive the bundled demo ACP agent as a real subprocess over raw JSON lines.

The driver here is deliberately tiny and independent of the rest of the project: it
writes JSON-RPC lines to the agent's stdin and reads lines from its stdout through a
background thread, with a timeout on every read so a bug cannot hang the suite.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
TIMEOUT = 5.0


class AgentProcess:
    """A running demo agent with line-based helpers for the ACP conversation."""

    def __init__(self, cwd: Path, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.cwd = cwd
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandboxes.in_sandbox.demo_agent", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.stderr = bytearray()
        self._next_id = 100
        self._readers = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # EOF marker

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.extend(line)

    # -- writing --

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.send_raw(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    def request(self, method: str, params: Any) -> int:
        self._next_id += 1
        self.send({"id": self._next_id, "method": method, "params": params})
        return self._next_id

    def notify(self, method: str, params: Any) -> None:
        self.send({"method": method, "params": params})

    def reply(self, request_id: Any, result: Any = None, error: Any = None) -> None:
        if error is not None:
            self.send({"id": request_id, "error": error})
        else:
            self.send({"id": request_id, "result": result})

    # -- reading --

    def read_line(self, timeout: float = TIMEOUT) -> bytes | None:
        """Return the next stdout line, or None at EOF; fail after timeout."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no output from agent within {timeout}s; stderr: {self.stderr!r}")

    def read(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        line = self.read_line(timeout)
        assert line is not None, f"agent closed stdout; stderr: {self.stderr!r}"
        return json.loads(line)

    def call(self, method: str, params: Any) -> dict[str, Any]:
        """Send a request and return its response (nothing else may come first)."""
        request_id = self.request(method, params)
        message = self.read()
        assert message.get("id") == request_id and "method" not in message, message
        return message

    def collect(self, request_id: int, timeout: float = TIMEOUT) -> tuple[list, dict]:
        """Read messages until the response to request_id; return (others, response)."""
        deadline = time.monotonic() + timeout
        others: list[dict[str, Any]] = []
        while True:
            message = self.read(max(deadline - time.monotonic(), 0.01))
            if message.get("id") == request_id and "method" not in message:
                return others, message
            others.append(message)

    def close(self) -> int:
        """Close stdin and return the exit status (killing the agent if it lingers)."""
        if self.proc.stdin and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail("agent did not exit after stdin closed")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path)
    try:
        yield process
    finally:
        if process.proc.poll() is None:
            process.proc.kill()
        process.proc.wait(timeout=TIMEOUT)
        for stream in (process.proc.stdin, process.proc.stdout, process.proc.stderr):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()


def start_session(agent: AgentProcess) -> str:
    response = agent.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert response["result"]["protocolVersion"] == 1
    response = agent.call("session/new", {"cwd": str(agent.cwd), "mcpServers": []})
    # The slash commands follow the answer.
    assert updates([agent.read()])[0]["sessionUpdate"] == "available_commands_update"
    return response["result"]["sessionId"]


def prompt(agent: AgentProcess, session_id: str, text: str) -> int:
    return agent.request(
        "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
    )


def run_prompt(agent: AgentProcess, text: str, timeout: float = TIMEOUT) -> tuple[list, dict]:
    session_id = start_session(agent)
    return agent.collect(prompt(agent, session_id, text), timeout)


def updates(messages: list[dict[str, Any]], usage: bool = False) -> list[dict[str, Any]]:
    """Return the updates among `messages`; the usage_update that ends every turn only if
    asked (the usage tests look at it)."""
    return [
        m["params"]["update"]
        for m in messages
        if m.get("method") == "session/update"
        and (usage or m["params"]["update"].get("sessionUpdate") != "usage_update")
    ]


def texts(messages: list[dict[str, Any]], kind: str = "agent_message_chunk") -> list[str]:
    return [u["content"]["text"] for u in updates(messages) if u["sessionUpdate"] == kind]


def answer_permission(agent: AgentProcess, option: str | None) -> tuple[list, dict]:
    """Read up to the permission request, answer it, return (messages before, request)."""
    before: list[dict[str, Any]] = []
    while True:
        message = agent.read()
        if message.get("method") == "session/request_permission":
            break
        before.append(message)
    if option is None:
        outcome = {"outcome": "cancelled"}
    else:
        outcome = {"outcome": "selected", "optionId": option}
    agent.reply(message["id"], {"outcome": outcome})
    return before, message


# -- protocol basics --------------------------------------------------------------------


def test_initialize_and_authenticate(agent: AgentProcess) -> None:
    response = agent.call(
        "initialize",
        {"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": {"name": "t"}},
    )
    assert response["result"] == {
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": True,
            "sessionCapabilities": {"resume": {}},
            "promptCapabilities": {"image": True, "audio": False, "embeddedContext": True},
        },
        "authMethods": [],
        "agentInfo": {"name": "craft-demo-agent", "title": "Craft demo agent", "version": "1.2.0"},
    }
    assert agent.call("authenticate", {"methodId": "none"})["result"] == {}
    assert agent.close() == 0


def test_session_new_rejects_bad_cwd(agent: AgentProcess, tmp_path: Path) -> None:
    missing = agent.call("session/new", {"cwd": str(tmp_path / "nope"), "mcpServers": []})
    assert missing["error"]["code"] == -32602
    assert "not a directory" in missing["error"]["message"]
    relative = agent.call("session/new", {"cwd": "relative/dir", "mcpServers": []})
    assert relative["error"]["code"] == -32602
    assert "absolute" in relative["error"]["message"]


def test_unknown_method_session_and_notification(agent: AgentProcess) -> None:
    session_id = start_session(agent)
    assert agent.call("session/fork", {"sessionId": session_id})["error"]["code"] == -32601
    unknown = agent.call("session/prompt", {"sessionId": "nope", "prompt": []})
    assert unknown["error"]["code"] == -32602
    agent.notify("craft/whatever", {"x": 1})  # ignored: nothing is written back
    assert agent.call("authenticate", {})["result"] == {}


def test_malformed_json_gets_parse_error_and_agent_keeps_working(agent: AgentProcess) -> None:
    agent.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": \n')
    error = agent.read()
    assert error["id"] is None and error["error"]["code"] == -32700
    agent.send_raw(b"\xff\xfe not utf-8\n")
    assert agent.read()["error"]["code"] == -32700
    _, response = run_prompt(agent, "still alive")
    assert response["result"] == {"stopReason": "end_turn"}
    assert b"malformed" in agent.stderr


def test_odd_messages_do_not_break_the_agent(agent: AgentProcess) -> None:
    agent.send_raw(b"[1, 2]\n")
    assert agent.read()["error"]["code"] == -32600
    agent.notify("session/cancel", {"sessionId": ["not", "hashable"]})
    unknown = agent.call("session/prompt", {"sessionId": {"a": 1}, "prompt": []})
    assert unknown["error"]["code"] == -32602
    agent.reply(12345, {"outcome": {"outcome": "cancelled"}})  # nobody asked: ignored
    assert agent.call("authenticate", {})["result"] == {}


def test_reads_a_multi_megabyte_input_line(agent: AgentProcess) -> None:
    word = "é" * 3_000_000
    messages, response = run_prompt(agent, word)
    assert texts(messages) == ["Echo: ", word]
    assert response["result"]["stopReason"] == "end_turn"


def test_eof_exits_zero(agent: AgentProcess) -> None:
    start_session(agent)
    assert agent.close() == 0
    assert agent.read_line() is None


def test_help_and_version() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "sandboxes.in_sandbox.demo_agent"]
    help_text = subprocess.run(
        [*command, "--help"], env=env, capture_output=True, text=True, timeout=TIMEOUT
    ).stdout
    for word in ("think", "write", "slow", "big", "crash", "fs", "Echo"):
        assert word in help_text
    version = subprocess.run(
        [*command, "--version"], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert version.stdout.strip() == "craft-demo-agent 1.2.0"


def test_without_arguments_the_agent_offers_what_its_flags_default_to() -> None:
    """Craft starts it without arguments, and then it skips parsing them (and importing
    argparse): its options must be the command line's defaults."""
    from sandboxes.in_sandbox.demo_agent import Options, parse_options

    assert parse_options(["--images", "--restore", "both"]) == Options()
    assert parse_options(["--no-images", "--auth"]) == Options(images=False, auth=True)


# -- scenarios --------------------------------------------------------------------------


def test_default_echo_streams_word_chunks(agent: AgentProcess) -> None:
    messages, response = run_prompt(agent, "hello big world")
    assert texts(messages) == ["Echo: ", "hello ", "big ", "world"]
    assert response["result"] == {"stopReason": "end_turn"}


def test_prompt_concatenates_text_blocks(agent: AgentProcess) -> None:
    session_id = start_session(agent)
    blocks = [
        {"type": "text", "text": "two "},
        {"type": "resource_link", "name": "x", "uri": "file:///x"},
        {"type": "text", "text": "blocks"},
    ]
    request_id = agent.request("session/prompt", {"sessionId": session_id, "prompt": blocks})
    messages, _ = agent.collect(request_id)
    assert "".join(texts(messages)) == (
        "I received 1 attachment(s): link to x (file:///x).\nEcho: two blocks"
    )


def test_think_streams_thought_then_text(agent: AgentProcess) -> None:
    messages, response = run_prompt(agent, "Think about cats")
    kinds = [u["sessionUpdate"] for u in updates(messages)]
    assert kinds[-1] == "agent_message_chunk"
    assert set(kinds[:-1]) == {"agent_thought_chunk"}
    assert "".join(texts(messages, "agent_thought_chunk")) == "Thinking about: about cats"
    assert response["result"]["stopReason"] == "end_turn"


def test_plan_is_sent_four_times_in_full(agent: AgentProcess) -> None:
    messages, response = run_prompt(agent, "plan")
    plans = [u["entries"] for u in updates(messages) if u["sessionUpdate"] == "plan"]
    assert [[entry["status"] for entry in plan] for plan in plans] == [
        ["pending", "pending", "pending"],
        ["in_progress", "pending", "pending"],
        ["completed", "in_progress", "pending"],
        ["completed", "completed", "completed"],
    ]
    assert [entry["priority"] for entry in plans[0]] == ["high", "medium", "low"]
    assert len(texts(messages)) == 3
    assert response["result"]["stopReason"] == "end_turn"


def test_write_allowed_creates_file_with_diff(agent: AgentProcess, tmp_path: Path) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "write sub/notes.txt hello  there")
    before, permission = answer_permission(agent, "allow")
    target = str(tmp_path / "sub" / "notes.txt")
    (tool_call,) = updates(before)
    assert tool_call["sessionUpdate"] == "tool_call"
    assert tool_call["kind"] == "edit" and tool_call["status"] == "pending"
    assert tool_call["title"] == "Write sub/notes.txt"
    assert tool_call["locations"] == [{"path": target}]
    params = permission["params"]
    assert permission["id"] == 0
    assert params["sessionId"] == session_id
    assert params["toolCall"]["toolCallId"] == tool_call["toolCallId"]
    assert [o["optionId"] for o in params["options"]] == ["allow", "reject"]
    messages, response = agent.collect(request_id)
    last_update = updates(messages)[-2]
    assert last_update["status"] == "completed"
    assert last_update["content"] == [
        {"type": "diff", "path": target, "oldText": None, "newText": "hello  there"}
    ]
    assert texts(messages) == ["Wrote sub/notes.txt."]
    assert response["result"]["stopReason"] == "end_turn"
    assert Path(target).read_text() == "hello  there"


def test_write_overwrite_reports_old_text(agent: AgentProcess, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old\n")
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "write a.txt new")
    answer_permission(agent, "allow")
    messages, _ = agent.collect(request_id)
    diff = updates(messages)[-2]["content"][0]
    assert (diff["oldText"], diff["newText"]) == ("old\n", "new")
    assert (tmp_path / "a.txt").read_text() == "new"


def test_write_rejected_leaves_no_file(agent: AgentProcess, tmp_path: Path) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "write nope.txt content")
    answer_permission(agent, "reject")
    messages, response = agent.collect(request_id)
    failed = updates(messages)[0]
    assert failed["sessionUpdate"] == "tool_call_update" and failed["status"] == "failed"
    assert failed["content"][0]["content"]["text"] == "Permission denied"
    assert texts(messages) == ["Did not write nope.txt."]
    assert response["result"]["stopReason"] == "end_turn"
    assert not (tmp_path / "nope.txt").exists()


def test_write_permission_error_counts_as_reject(agent: AgentProcess, tmp_path: Path) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "write nope.txt content")
    while (message := agent.read()).get("method") != "session/request_permission":
        pass
    agent.reply(message["id"], error={"code": -32603, "message": "boom"})
    messages, response = agent.collect(request_id)
    assert response["result"]["stopReason"] == "end_turn"
    assert texts(messages) == ["Did not write nope.txt."]
    assert not (tmp_path / "nope.txt").exists()


def test_write_cancelled_outcome_gives_cancelled(agent: AgentProcess, tmp_path: Path) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "write nope.txt content")
    answer_permission(agent, None)
    messages, response = agent.collect(request_id)
    assert updates(messages)[-1]["status"] == "failed"
    assert response["result"] == {"stopReason": "cancelled"}
    assert not (tmp_path / "nope.txt").exists()


def test_cancel_while_waiting_for_permission(agent: AgentProcess, tmp_path: Path) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "write nope.txt content")
    while (permission := agent.read()).get("method") != "session/request_permission":
        pass
    agent.notify("session/cancel", {"sessionId": session_id})
    messages, response = agent.collect(request_id)
    assert response["result"] == {"stopReason": "cancelled"}
    assert updates(messages)[-1]["status"] == "failed"
    # The client answers the permission request late, as ACP requires; it is ignored.
    agent.reply(permission["id"], {"outcome": {"outcome": "cancelled"}})
    _, response = agent.collect(prompt(agent, session_id, "again"))
    assert response["result"] == {"stopReason": "end_turn"}
    assert not (tmp_path / "nope.txt").exists()


@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt", "/tmp/escape.txt"])
def test_write_outside_cwd_is_refused_without_asking(agent: AgentProcess, path: str) -> None:
    messages, response = run_prompt(agent, f"write {path} x")
    assert all(m.get("method") == "session/update" for m in messages)
    tool_call, failed = updates(messages)[:2]
    assert tool_call["sessionUpdate"] == "tool_call"
    assert failed["status"] == "failed"
    assert failed["content"][0]["content"]["text"].startswith("Refused:")
    assert response["result"]["stopReason"] == "end_turn"
    assert not (agent.cwd.parent / "escape.txt").exists()


def test_delete_and_rename_ask_first_and_change_only_the_workspace(
    agent: AgentProcess, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "rename a.txt sub/b.txt")
    before, request = answer_permission(agent, "allow")
    assert updates(before)[0]["kind"] == "move"
    assert request["params"]["toolCall"]["title"] == "Rename a.txt to sub/b.txt"
    messages, _ = agent.collect(request_id)
    assert texts(messages) == ["Renamed a.txt to sub/b.txt."]
    assert (tmp_path / "sub" / "b.txt").read_text() == "a\n" and not (tmp_path / "a.txt").exists()
    request_id = prompt(agent, session_id, "delete sub/b.txt")
    answer_permission(agent, "reject")
    messages, _ = agent.collect(request_id)
    assert texts(messages) == ["Did not delete sub/b.txt."]
    assert (tmp_path / "sub" / "b.txt").exists()
    request_id = prompt(agent, session_id, "delete sub/b.txt")
    answer_permission(agent, "allow")
    messages, _ = agent.collect(request_id)
    assert texts(messages) == ["Deleted sub/b.txt."]
    assert not (tmp_path / "sub" / "b.txt").exists()


def test_delete_and_rename_never_go_through_a_link(agent: AgentProcess, tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("keep\n")
    (tmp_path / "out").symlink_to(outside)
    (tmp_path / "link.txt").symlink_to(outside / "victim.txt")
    session_id = start_session(agent)
    for text in ("delete out/victim.txt", "rename out/victim.txt mine.txt", "delete link.txt"):
        request_id = prompt(agent, session_id, text)
        answer_permission(agent, "allow")
        agent.collect(request_id)
    assert (outside / "victim.txt").read_text() == "keep\n"
    assert not (tmp_path / "mine.txt").exists()
    assert not (tmp_path / "link.txt").is_symlink()  # the link itself was deleted


def test_read_existing_and_missing(agent: AgentProcess, tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("contents é✓\n", encoding="utf-8")
    session_id = start_session(agent)
    messages, _ = agent.collect(prompt(agent, session_id, "read r.txt"))
    tool_call, done = updates(messages)[:2]
    assert (tool_call["kind"], tool_call["status"]) == ("read", "in_progress")
    assert tool_call["locations"] == [{"path": str(tmp_path / "r.txt")}]
    assert done["status"] == "completed"
    assert done["content"] == [
        {"type": "content", "content": {"type": "text", "text": "contents é✓\n"}}
    ]
    messages, response = agent.collect(prompt(agent, session_id, "read gone.txt"))
    failed = updates(messages)[1]
    assert failed["status"] == "failed"
    assert failed["content"][0]["content"]["text"] == "No such file: gone.txt"
    assert response["result"]["stopReason"] == "end_turn"


@pytest.mark.parametrize("option", ["allow", "reject"])
def test_demo_tour(agent: AgentProcess, tmp_path: Path, option: str) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "demo 0")
    before, _ = answer_permission(agent, option)
    messages, response = agent.collect(request_id)
    everything = updates(before + messages)
    kinds = [u["sessionUpdate"] for u in everything]
    assert kinds[0] == "agent_thought_chunk"
    assert "plan" in kinds and "tool_call" in kinds
    final_plan = [u for u in everything if u["sessionUpdate"] == "plan"][-1]
    assert {entry["status"] for entry in final_plan["entries"]} == {"completed"}
    closing = "".join(texts(messages))
    assert "That was the tour" in closing
    assert response["result"]["stopReason"] == "end_turn"
    hello = tmp_path / "hello.txt"
    if option == "allow":
        assert hello.read_text() == "Hello from the Craft demo agent\n"
        assert kinds.count("tool_call") == 2  # the write and the read
    else:
        assert not hello.exists()
        assert kinds.count("tool_call") == 1


def test_slow_cancel_is_prompt(agent: AgentProcess) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "slow 50 0.1")
    first = agent.read()
    assert first["params"]["update"]["content"]["text"] == "chunk 1 "
    agent.notify("session/cancel", {"sessionId": session_id})
    messages, response = agent.collect(request_id)
    assert response["result"] == {"stopReason": "cancelled"}
    assert len(messages) < 5  # not the 49 chunks left: the stream stopped at the cancel


def test_slow_runs_to_the_end(agent: AgentProcess) -> None:
    messages, response = run_prompt(agent, "slow 3 0")
    assert texts(messages) == ["chunk 1 ", "chunk 2 ", "chunk 3 "]
    assert response["result"]["stopReason"] == "end_turn"


def test_count_keeps_wire_order(agent: AgentProcess) -> None:
    messages, response = run_prompt(agent, "count 500")
    assert texts(messages) == [f"{i}\n" for i in range(1, 501)]
    assert response["result"]["stopReason"] == "end_turn"


def test_big_is_one_long_utf8_line(agent: AgentProcess) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "big")
    line = agent.read_line(timeout=10)
    assert line is not None and len(line) > 5_000_000
    text = json.loads(line)["params"]["update"]["content"]["text"]
    assert len(text.encode("utf-8")) == 5 * 1024 * 1024
    assert len(text) == 4_997_120
    assert "é✓" in text and "é✓".encode() in line
    _, response = agent.collect(request_id)
    assert response["result"]["stopReason"] == "end_turn"


def test_crash_exits_3_without_response(agent: AgentProcess) -> None:
    session_id = start_session(agent)
    prompt(agent, session_id, "crash")
    chunk = agent.read()
    assert chunk["params"]["update"]["content"]["text"] == "About to crash"
    assert agent.read_line() is None
    assert agent.proc.wait(timeout=TIMEOUT) == 3


def test_noise_line_then_protocol_continues(agent: AgentProcess) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "noise")
    assert agent.read_line() == b"this line is not JSON\n"
    messages, response = agent.collect(request_id)
    assert texts(messages) == ["I printed a line that is not JSON on stdout."]
    assert response["result"]["stopReason"] == "end_turn"
    assert agent.call("authenticate", {})["result"] == {}


def test_stderr_line(agent: AgentProcess) -> None:
    messages, response = run_prompt(agent, "stderr")
    assert texts(messages) == ["I wrote a line to stderr."]
    assert response["result"]["stopReason"] == "end_turn"
    agent.close()
    assert b"written to stderr on request" in agent.stderr


def test_unknown_update_kind(agent: AgentProcess) -> None:
    messages, response = run_prompt(agent, "unknown")
    odd = updates(messages)[0]
    assert odd["sessionUpdate"] == "craft_demo_unknown_kind" and odd["detail"]
    assert response["result"]["stopReason"] == "end_turn"


def test_pid(agent: AgentProcess) -> None:
    messages, _ = run_prompt(agent, "pid")
    [reply] = texts(messages)
    assert re.fullmatch(rf"pid {agent.proc.pid} [0-9a-f]{{8}}", reply)


def test_fail_gives_jsonrpc_error(agent: AgentProcess) -> None:
    messages, response = run_prompt(agent, "fail")
    assert messages == []
    assert response["error"] == {"code": -32603, "message": "demo failure requested"}


def test_fs_request_error_is_reported(agent: AgentProcess, tmp_path: Path) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "fs")
    fs_request = agent.read()
    assert fs_request["method"] == "fs/read_text_file"
    assert fs_request["params"] == {"sessionId": session_id, "path": str(tmp_path / "hello.txt")}
    agent.reply(fs_request["id"], error={"code": -32601, "message": "Method not found"})
    messages, response = agent.collect(request_id)
    assert texts(messages) == [
        "The client answered fs/read_text_file with an error: Method not found (code -32601)."
    ]
    assert response["result"]["stopReason"] == "end_turn"


def test_fs_request_result_is_reported(agent: AgentProcess) -> None:
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "fs")
    fs_request = agent.read()
    agent.reply(fs_request["id"], {"content": "abc"})
    messages, _ = agent.collect(request_id)
    assert texts(messages) == [
        "The client answered fs/read_text_file with a result (3 characters)."
    ]


def test_second_prompt_while_running_is_refused(agent: AgentProcess) -> None:
    session_id = start_session(agent)
    first = prompt(agent, session_id, "slow 3 0.2")
    second = prompt(agent, session_id, "hello")
    messages, response = agent.collect(second)
    assert response["error"]["code"] == -32602
    messages, response = agent.collect(first)
    assert texts(messages) == ["chunk 1 ", "chunk 2 ", "chunk 3 "]
    assert response["result"]["stopReason"] == "end_turn"


def final_tool_update(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """Return the status and text of the last tool_call_update."""
    (*_, last) = [u for u in updates(messages) if u["sessionUpdate"] == "tool_call_update"]
    return last["status"], last["content"][0]["content"]["text"]


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside the agent's working directory, holding one file."""
    folder = tmp_path_factory.mktemp("outside")
    (folder / "target.txt").write_text("original")
    return folder


# What is in the workspace before the prompt, and what the write path is swapped for while the
# agent waits for permission (after it has checked the path).
SWAPS = {
    "a folder on the way": ("sub/x.txt", "sub", "outside"),
    "a folder created later": ("new/x.txt", None, "outside"),
    "the file itself": ("x.txt", "x.txt", "outside/target.txt"),
}


@pytest.mark.parametrize("swap", SWAPS, ids=list(SWAPS))
def test_a_link_swapped_in_after_the_check_does_not_lead_the_write_outside(
    agent: AgentProcess, outside: Path, swap: str
) -> None:
    relative, existing, link_target = SWAPS[swap]
    swapped = agent.cwd / relative.split("/")[0]
    if existing == "sub":
        swapped.mkdir()
    elif existing:
        swapped.write_text("inside")
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, f"write {relative} pwned")
    _, permission = answer_permission_later(agent)
    if swapped.is_dir():
        swapped.rename(agent.cwd / "moved-away")
    elif swapped.exists():
        swapped.unlink()
    swapped.symlink_to(outside / link_target.removeprefix("outside").lstrip("/"))
    agent.reply(permission["id"], {"outcome": {"outcome": "selected", "optionId": "allow"}})
    messages, response = agent.collect(request_id)
    status, text = final_tool_update(messages)
    assert (status, text) == ("failed", f"Refused: {relative} goes through a symbolic link.")
    assert texts(messages) == [f"Did not write {relative}."]
    assert response["result"]["stopReason"] == "end_turn"
    assert sorted(p.name for p in outside.iterdir()) == ["target.txt"]
    assert (outside / "target.txt").read_text() == "original"


def answer_permission_later(agent: AgentProcess) -> tuple[list, dict]:
    """Read up to the permission request and return it unanswered."""
    before = []
    while (message := agent.read()).get("method") != "session/request_permission":
        before.append(message)
    return before, message


def test_a_file_with_another_hard_link_is_not_written(agent: AgentProcess, outside: Path) -> None:
    os.link(outside / "target.txt", agent.cwd / "linked.txt")
    session_id = start_session(agent)
    request_id = prompt(agent, session_id, "write linked.txt pwned")
    answer_permission(agent, "allow")
    messages, _ = agent.collect(request_id)
    assert final_tool_update(messages) == ("failed", "Refused: linked.txt has other hard links.")
    assert (outside / "target.txt").read_text() == "original"


def test_reading_through_a_link_is_refused(agent: AgentProcess, outside: Path) -> None:
    (agent.cwd / "inner").symlink_to(outside)
    messages, _ = run_prompt(agent, "read inner/target.txt")
    status, text = final_tool_update(messages)
    assert status == "failed" and text.startswith("Refused: inner/target.txt")
    assert "original" not in json.dumps(messages)


# -- restoring sessions, controls -------------------------------------------------------


@contextlib.contextmanager
def demo_agent(cwd: Path, *args: str) -> Iterator[AgentProcess]:
    process = AgentProcess(cwd, *args)
    try:
        yield process
    finally:
        process.close()
        for reader in process._readers:
            reader.join(TIMEOUT)
        for stream in (process.proc.stdout, process.proc.stderr):
            if stream is not None:
                stream.close()


def remembered_session(cwd: Path, *args: str) -> str:
    """Have one agent process remember "banana" in a new session; return its id."""
    with demo_agent(cwd, *args) as first:
        session_id = start_session(first)
        messages, _ = first.collect(prompt(first, session_id, "remember banana"))
        assert texts(messages) == ["I will remember banana."]
    return session_id


def reopen(agent: AgentProcess, method: str, session_id: str) -> tuple[list, dict]:
    """Initialize, then resume or load the session; return (updates before, answer)."""
    agent.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    request_id = agent.request(
        method, {"sessionId": session_id, "cwd": str(agent.cwd), "mcpServers": []}
    )
    before, answer = agent.collect(request_id)
    commands = updates([agent.read()])
    assert commands[0]["sessionUpdate"] == "available_commands_update"
    return before, answer


def test_a_new_process_resumes_a_session_without_replaying_it(tmp_path: Path) -> None:
    session_id = remembered_session(tmp_path)
    with demo_agent(tmp_path) as second:
        before, answer = reopen(second, "session/resume", session_id)
        assert before == []
        assert [o["currentValue"] for o in answer["result"]["configOptions"]] == ["fast", "ask"]
        assert answer["result"]["modes"]["currentModeId"] == "ask"
        messages, _ = second.collect(prompt(second, session_id, "recall"))
        assert texts(messages) == ["You asked me to remember: banana."]


def test_a_new_process_loads_a_session_replaying_it_first(tmp_path: Path) -> None:
    session_id = remembered_session(tmp_path)
    with demo_agent(tmp_path) as second:
        before, _ = reopen(second, "session/load", session_id)
        assert [(u["sessionUpdate"], u["content"]["text"]) for u in updates(before)] == [
            ("user_message_chunk", "remember banana"),
            ("agent_message_chunk", "I will remember banana."),
        ]
        messages, _ = second.collect(prompt(second, session_id, "/recall"))
        assert texts(messages) == ["You asked me to remember: banana."]


def test_an_unknown_session_cannot_be_resumed(tmp_path: Path) -> None:
    with demo_agent(tmp_path) as agent:
        agent.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        for session_id in ("demo-" + "0" * 32, "../../etc/passwd"):
            answer = agent.call(
                "session/resume", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []}
            )
            assert answer["error"]["code"] == -32002


@pytest.mark.parametrize(
    ("restore", "load", "resume"),
    [("both", True, True), ("load", True, False), ("resume", False, True), ("none", False, False)],
)
def test_the_restore_switch_says_what_is_advertised_and_answered(
    tmp_path: Path, restore: str, load: bool, resume: bool
) -> None:
    session_id = remembered_session(tmp_path)
    with demo_agent(tmp_path, "--restore", restore) as agent:
        init = agent.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        capabilities = init["result"]["agentCapabilities"]
        assert capabilities["loadSession"] is load
        assert ("resume" in capabilities["sessionCapabilities"]) is resume
        params = {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []}
        for method, offered in (("session/load", load), ("session/resume", resume)):
            answer = agent.call(method, params) if not offered else None
            if answer is not None:
                assert answer["error"]["code"] == -32601


def test_config_options_and_modes_are_set_and_kept(tmp_path: Path) -> None:
    with demo_agent(tmp_path) as agent:
        session_id = start_session(agent)
        answer = agent.call(
            "session/set_config_option",
            {"sessionId": session_id, "configId": "model", "value": "careful"},
        )
        assert [o["currentValue"] for o in answer["result"]["configOptions"]] == ["careful", "ask"]
        assert agent.call("session/set_mode", {"sessionId": session_id, "modeId": "code"}) == {
            "jsonrpc": "2.0", "id": agent._next_id, "result": {}
        }  # fmt: skip
        bad = agent.call(
            "session/set_config_option",
            {"sessionId": session_id, "configId": "model", "value": "huge"},
        )
        assert bad["error"]["code"] == -32602
        messages, _ = agent.collect(prompt(agent, session_id, "config"))
        assert texts(messages) == ["Model: careful. Mode: code."]
    with demo_agent(tmp_path, "--controls", "modes") as again:
        _, answer = reopen(again, "session/resume", session_id)
        assert "configOptions" not in answer["result"]
        assert answer["result"]["modes"]["currentModeId"] == "code"
        refused = again.call(
            "session/set_config_option",
            {"sessionId": session_id, "configId": "model", "value": "fast"},
        )
        assert refused["error"]["code"] == -32601


def test_usage_title_and_every_kind_of_permission_option(agent: AgentProcess) -> None:
    session_id = start_session(agent)
    messages, _ = agent.collect(prompt(agent, session_id, "title Tidy up"))
    kinds = [u["sessionUpdate"] for u in updates(messages, usage=True)]
    assert kinds == ["session_info_update", "agent_message_chunk", "usage_update"]
    assert updates(messages)[0]["title"] == "Tidy up"
    usage = updates(messages, usage=True)[-1]
    assert usage["size"] == 100_000 and usage["used"] > 0
    assert usage["cost"]["currency"] == "USD"
    request_id = prompt(agent, session_id, "ask")
    _, request = answer_permission(agent, "always")
    assert [(o["optionId"], o["kind"]) for o in request["params"]["options"]] == [
        ("once", "allow_once"), ("always", "allow_always"),
        ("no", "reject_once"), ("never", "reject_always"),
    ]  # fmt: skip
    messages, _ = agent.collect(request_id)
    assert texts(messages) == ["You chose Yes, and don't ask again (allow_always)."]
