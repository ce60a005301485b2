"""The ACP client against real demo-agent processes."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from sandboxes.agent.connection import AgentConnection
from sandboxes.agent.protocol import (
    AgentError,
    MalformedAnswer,
    PermissionRequest,
    TurnEnd,
    TurnFailed,
    TurnInProgress,
    Update,
)
from sandboxes.backends.local import LocalAgentProcess

from ..agents import ending, iter_prompt, reply_text, run_turn, start_demo_agent


def is_message(item):
    return isinstance(item, Update) and item.kind == "agent_message_chunk"


@pytest.fixture
def agent(tmp_path):
    connection = start_demo_agent(tmp_path / "ws")
    yield connection
    connection.stop()


def test_it_initializes_and_opens_a_session(agent):
    assert agent.is_running
    assert agent.agent_session_id
    assert agent.agent_info["name"] == "craft-demo-agent"


def test_it_streams_a_reply_and_ends_the_turn(agent):
    items = run_turn(agent, "hello there")
    assert reply_text(items) == "Echo: hello there"
    assert ending(items) == TurnEnd("end_turn")


def test_it_keeps_wire_order_of_500_updates(agent):
    items = run_turn(agent, "count 500")
    numbers = [int(item.data["content"]["text"]) for item in items if is_message(item)]
    assert numbers == list(range(1, 501))
    assert ending(items) == TurnEnd("end_turn")


def test_it_reads_a_5_mb_line(agent):
    items = run_turn(agent, "big 5", timeout=60)
    (chunk,) = [item for item in items if is_message(item)]
    text = chunk.data["content"]["text"]
    assert len(text.encode("utf-8")) >= 5 * 1024 * 1024
    assert "é" in text
    assert ending(items) == TurnEnd("end_turn")
    # The connection is still healthy after the big line.
    assert reply_text(run_turn(agent, "after")) == "Echo: after"


def test_it_skips_a_non_json_line_and_carries_on(agent, caplog):
    items = run_turn(agent, "noise")
    assert ending(items) == TurnEnd("end_turn")
    assert "non-JSON line" in caplog.text
    assert agent.is_running


def test_unknown_update_kinds_are_delivered_not_dropped(agent):
    items = run_turn(agent, "unknown")
    kinds = [item.kind for item in items if isinstance(item, Update)]
    assert "craft_demo_unknown_kind" in kinds


def test_a_crash_mid_turn_fails_the_turn_and_marks_it_not_running(agent):
    items = run_turn(agent, "crash")
    assert reply_text(items) == "About to crash"
    end = ending(items)
    assert isinstance(end, TurnFailed)
    assert "exited with code 3" in end.message
    assert not agent.is_running
    with pytest.raises(AgentError):
        agent.prompt("again", lambda item: None)


def test_an_error_response_fails_the_turn(agent):
    end = ending(run_turn(agent, "fail"))
    assert isinstance(end, TurnFailed)
    assert "demo failure requested" in end.message
    assert agent.is_running


def test_cancel_during_a_slow_stream_ends_with_cancelled(agent):
    items = []
    started = threading.Event()

    def sink(item):
        items.append(item)
        started.set()

    done = threading.Event()
    agent.prompt(
        "slow 200 0.05",
        lambda item: (sink(item), done.set() if isinstance(item, TurnEnd | TurnFailed) else None),
    )
    assert started.wait(60)
    agent.cancel()
    assert done.wait(60)
    assert items[-1] == TurnEnd("cancelled")
    chunks = [item for item in items if isinstance(item, Update)]
    assert 0 < len(chunks) < 200  # cut short: the whole stream is 200 chunks
    # The same process serves the next turn.
    assert reply_text(run_turn(agent, "still here")) == "Echo: still here"


def test_a_permission_request_answered_allow_lets_the_agent_write(agent, tmp_path):
    items = run_turn(agent, "write notes/a.txt first draft", answer="allow")
    (request,) = [item for item in items if isinstance(item, PermissionRequest)]
    assert {o["optionId"] for o in request.options} == {"allow", "reject"}
    assert (tmp_path / "ws" / "notes" / "a.txt").read_text() == "first draft"
    tool_updates = [
        item.data for item in items if isinstance(item, Update) and item.kind == "tool_call_update"
    ]
    diff = [c for u in tool_updates for c in u.get("content") or [] if c.get("type") == "diff"]
    assert diff and diff[0]["newText"] == "first draft"
    assert ending(items) == TurnEnd("end_turn")


def test_a_permission_request_answered_reject_stops_the_write(agent, tmp_path):
    items = run_turn(agent, "write b.txt nope", answer="reject")
    assert any(isinstance(item, PermissionRequest) for item in items)
    assert not (tmp_path / "ws" / "b.txt").exists()
    assert "Did not write" in reply_text(items)


def test_an_unknown_permission_option_is_refused_and_can_be_answered_again(agent):
    items = []
    asked = threading.Event()

    def sink(item):
        items.append(item)
        if isinstance(item, PermissionRequest):
            asked.set()

    agent.prompt("write c.txt x", sink)
    assert asked.wait(5)
    request = next(item for item in items if isinstance(item, PermissionRequest))
    with pytest.raises(ValueError):
        agent.answer_permission(request.request_id, "bogus")
    assert agent.answer_permission(request.request_id, "reject")
    assert not agent.answer_permission(request.request_id, "reject")


def test_fs_requests_get_a_json_rpc_error(agent):
    text = reply_text(run_turn(agent, "fs"))
    assert "error" in text.lower()


def test_a_second_prompt_during_a_turn_is_refused(agent):
    done = threading.Event()
    agent.prompt("slow 20 0.05", lambda item: done.set() if isinstance(item, TurnEnd) else None)
    with pytest.raises(TurnInProgress):
        agent.prompt("two", lambda item: None)
    agent.cancel()
    assert done.wait(5)


def test_stop_ends_the_process(agent):
    process = agent.process
    agent.stop()
    assert not agent.is_running
    assert process.exit_code() is not None


def test_a_program_that_is_not_an_agent_fails_to_start(tmp_path):
    with pytest.raises(AgentError):
        start_demo_agent(tmp_path / "ws", ["python3", "-c", "print('hello')"])


# --- A hostile agent: malformed messages cost themselves, never the connection -------------

HOSTILE = [sys.executable, str(Path(__file__).parent.parent.parent / "agents" / "hostile_agent.py")]


@pytest.fixture
def hostile(tmp_path):
    connection = start_demo_agent(tmp_path / "ws", HOSTILE)
    yield connection
    connection.stop()


def last_text(items):
    chunks = [i for i in items if isinstance(i, Update) and i.kind == "agent_message_chunk"]
    return chunks[-1].data["content"]["text"]


def assert_survived(connection, items, word):
    """The turn ended normally, its last chunk arrived, and the agent still answers."""
    assert ending(items) == TurnEnd("end_turn")
    assert last_text(items) == f"after {word}"
    assert connection.is_running
    assert reply_text(run_turn(connection, "ping")) == "hostile: pingafter ping"


@pytest.mark.parametrize("word", ["listparams", "badresponse", "deep", "malformed"])
def test_malformed_agent_messages_do_not_stop_the_reader(hostile, word, caplog):
    items = run_turn(hostile, word)
    assert_survived(hostile, items, word)
    assert "agent exited" not in caplog.text


def test_answers_to_ids_craft_never_used_are_logged_and_cost_nothing(hostile, caplog):
    items = run_turn(hostile, "badresponse")
    assert_survived(hostile, items, "badresponse")
    unknown = [r.getMessage() for r in caplog.records if "answered unknown id" in r.getMessage()]
    assert [message.partition("unknown id ")[2] for message in unknown] == [
        "[1]",
        "{'a': 1}",
        "999",
        "998",
        "997",
    ]


# --- Malformed answers: each fails its own request or turn, in words, and nothing else -----

PROMPT_ANSWERS = {
    "list": "the agent answered session/prompt with a list, not an object",
    "string": "the agent answered session/prompt with a string, not an object",
    "number": "the agent answered session/prompt with a number, not an object",
    "object-stopreason": (
        "the agent answered session/prompt with stopReason as a number, not a string"
    ),
    "error-string": (
        "the agent answered session/prompt with an error that is a string, not an object"
    ),
    "error-message": (
        "the agent answered session/prompt with an error whose message is a list, not a string"
    ),
    "both": "the agent answered session/prompt with both a result and an error",
}


@pytest.mark.parametrize(("answer", "message"), PROMPT_ANSWERS.items())
def test_a_malformed_prompt_answer_fails_the_turn_once_and_the_next_turn_works(
    hostile, answer, message
):
    items, ended = [], threading.Event()

    def sink(item):
        items.append(item)
        if isinstance(item, TurnEnd | TurnFailed):
            ended.set()

    hostile.prompt(f"badanswer {answer}", sink)
    assert ended.wait(15)
    # The next turn's end comes after anything the agent wrote for the first one.
    assert reply_text(run_turn(hostile, "ping")) == "hostile: pingafter ping"
    assert [i for i in items if isinstance(i, TurnEnd | TurnFailed)] == [TurnFailed(message)]
    assert items[-1] == TurnFailed(message)
    assert last_text(items) == "after badanswer"
    assert hostile.is_running


def test_a_prompt_answered_without_a_stop_reason_ends_normally(hostile):
    # ACP wants a stopReason; agents that leave it out have always ended their turn this way.
    assert ending(run_turn(hostile, "badanswer empty")) == TurnEnd("end_turn")


def start_hostile(workspace: Path, *args: str, reattach: str | None = None) -> AgentConnection:
    """Start the hostile agent with `args` and open its session (the start may fail)."""
    workspace.mkdir(parents=True, exist_ok=True)
    process = LocalAgentProcess([*HOSTILE, *args], workspace)
    connection = AgentConnection(process, cwd=str(workspace))
    try:
        connection.start(timeout=15, reattach=reattach)
    except AgentError:
        assert not connection.is_running
        assert connection.process.exit_code() is not None, "a failed start leaves no agent"
        raise
    return connection


@pytest.mark.parametrize(
    ("method", "answer", "message"),
    [
        ("initialize", "list", "the agent answered initialize with a list, not an object"),
        ("initialize", "string", "the agent answered initialize with a string, not an object"),
        (
            "initialize",
            "agent-info-list",
            "the agent answered initialize with agentInfo as a list, not an object",
        ),
        (
            "initialize",
            "error-string",
            "the agent answered initialize with an error that is a string, not an object",
        ),
        ("session/new", "empty", "the agent answered session/new without sessionId"),
        (
            "session/new",
            "session-id-number",
            "the agent answered session/new with sessionId as a number, not a string",
        ),
        ("session/new", "number", "the agent answered session/new with a number, not an object"),
        ("session/new", "both", "the agent answered session/new with both a result and an error"),
    ],
)
def test_a_malformed_answer_to_a_start_request_fails_the_start_in_words(
    tmp_path, method, answer, message
):
    with pytest.raises(AgentError) as failure:
        start_hostile(tmp_path / "ws", method, answer)
    assert str(failure.value) == f"agent did not start: {message}"
    assert isinstance(failure.value.__cause__, MalformedAnswer)


@pytest.mark.parametrize("method", ["session/resume", "session/load"])
def test_a_malformed_answer_to_a_reattach_fails_the_start_instead_of_starting_afresh(
    tmp_path, method
):
    with pytest.raises(AgentError) as failure:
        start_hostile(tmp_path / "ws", method, "list", reattach="earlier")
    assert str(failure.value) == (
        f"agent did not start: the agent answered {method} with a list, not an object"
    )


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("list", "with a list, not an object"),
        ("empty", "without configOptions"),
        ("error-message", "with an error whose message is a list, not a string"),
    ],
)
def test_a_malformed_config_option_answer_fails_that_request_only(tmp_path, answer, message):
    connection = start_hostile(tmp_path / "ws", "session/set_config_option", answer)
    try:
        with pytest.raises(MalformedAnswer) as failure:
            connection.set_config_option("model", "careful", timeout=15)
        assert str(failure.value) == f"the agent answered session/set_config_option {message}"
        assert connection.config_options is None
        assert reply_text(run_turn(connection, "ping")) == "hostile: pingafter ping"
    finally:
        connection.stop()


def test_a_mode_change_answered_with_a_list_fails_and_one_with_an_empty_object_works(tmp_path):
    for answer, fails in (("list", True), ("empty", False)):
        connection = start_hostile(tmp_path / answer, "session/set_mode", answer)
        try:
            if fails:
                with pytest.raises(MalformedAnswer, match="set_mode with a list, not an object"):
                    connection.set_mode("code", timeout=15)
            else:
                connection.set_mode("code", timeout=15)
            assert connection.is_running
        finally:
            connection.stop()


def test_updates_that_are_objects_are_delivered_whatever_their_kind(hostile):
    items = run_turn(hostile, "malformed")
    kinds = [item.kind for item in items if isinstance(item, Update)]
    # The five non-objects are skipped; the objects arrive, with their kind as a string.
    assert kinds[:6] == [
        "unknown",
        "7",
        "['plan']",
        "plan",
        "agent_message_chunk",
        "tool_call_update",
    ]


def test_permission_options_with_odd_ids_become_strings_and_the_agent_hears_its_own_id(hostile):
    items = []
    for item in iter_prompt(hostile, "permission", timeout=15):
        items.append(item)
        if isinstance(item, PermissionRequest):
            request = item
            assert [o["optionId"] for o in item.options] == ["1", '{"x": 1}', "ok"]
            assert [o["name"] for o in item.options] == ["One", '{"x": 1}', "OK"]
            assert hostile.answer_permission(item.request_id, "1")
    assert request.tool_call == {"toolCallId": "p1"}
    answer = json.loads(reply_text(items).removeprefix("answer: ").removesuffix("after permission"))
    assert answer == {"outcome": {"optionId": 1, "outcome": "selected"}}
    assert_survived(hostile, items, "permission")


def test_a_permission_request_without_usable_options_is_answered_cancelled(hostile):
    items = run_turn(hostile, "permission-none")
    assert not any(isinstance(item, PermissionRequest) for item in items)
    assert reply_text(items).startswith('answer: {"outcome": {"outcome": "cancelled"}}')
    assert_survived(hostile, items, "permission-none")


def test_a_permission_request_with_list_params_gets_an_error_answer(hostile):
    items = run_turn(hostile, "permission-badparams")
    assert '"code": -32602' in reply_text(items)
    assert_survived(hostile, items, "permission-badparams")


def restarted(agent, workspace, *args):
    """Stop `agent` and start another demo agent that reattaches to its session."""
    from sandboxes.agent.connection import AgentConnection
    from sandboxes.backends.local import LocalAgentProcess, resolve_command

    agent.stop()
    argv = resolve_command(["craft-demo-agent", *args])
    connection = AgentConnection(LocalAgentProcess(argv, workspace), cwd=str(workspace))
    connection.start(timeout=15, reattach=agent.agent_session_id)
    return connection


@pytest.mark.parametrize(("restore", "restored"), [("both", "resume"), ("load", "load"),
                                                    ("none", "none")])  # fmt: skip
def test_a_new_agent_reattaches_and_nothing_before_the_answer_is_delivered(
    tmp_path, restore, restored
):
    workspace = tmp_path / "ws"
    first = start_demo_agent(workspace, ["craft-demo-agent", "--restore", restore])
    run_turn(first, "remember apple")
    second = restarted(first, workspace, "--restore", restore, "--replay-on-resume")
    try:
        early = []
        second.idle_sink = early.append
        assert second.restored == restored
        assert (second.agent_session_id == first.agent_session_id) is (restored != "none")
        assert second.config_options is not None and second.modes is not None
        # Only what came after the resume or load answer: the commands, never the replay.
        deadline = time.monotonic() + 5
        while not early and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [item.kind for item in early] == ["available_commands_update"]
    finally:
        second.stop()


def test_it_sets_config_options_and_modes_and_follows_the_agent(agent):
    assert agent.set_config_option("model", "careful")[0]["currentValue"] == "careful"
    assert agent.config_options[0]["currentValue"] == "careful"
    agent.set_mode("code")
    assert agent.modes["currentModeId"] == "code"
    with pytest.raises(AgentError, match="-32602"):
        agent.set_config_option("model", "enormous")
    assert reply_text(run_turn(agent, "config")) == "Model: careful. Mode: code."


def test_a_prompt_to_a_dead_agent_is_not_sent(agent):
    from sandboxes.agent.protocol import PromptNotSent

    agent.process.terminate()
    agent.wait_closed()
    with pytest.raises(PromptNotSent):
        agent.prompt("hello", lambda item: None)
    assert not agent.turn_active
