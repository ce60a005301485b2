"""Every local agent's pipes are served by one thread (`sandboxes.pipes`).

These tests run real agent processes: many agents read by that one thread, an agent that
stops reading its input while asking Craft questions (the thread must never wait for it), a
reader that fails, and the pipes closed when agents stop (none left open).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from sandboxes.agent.connection import AgentConnection
from sandboxes.agent.protocol import AgentError, TurnEnd, TurnFailed, TurnItem, Update
from sandboxes.backends import local
from sandboxes.backends.local import LocalAgentProcess
from sandboxes.pipes import Lines, Pipes

from .agents import ending, reply_text, run_turn, start_demo_agent

EXPECTED = "".join(f"{n}\n" for n in range(1, 201))
HOSTILE = [sys.executable, str(Path(__file__).parent.parent / "agents" / "hostile_agent.py")]


def split(chunks: list[bytes], limit: int) -> list[bytes | int]:
    """Feed `chunks` to `Lines`; return its lines, and the sizes of the lines it skipped."""
    out: list[bytes | int] = []
    lines = Lines(limit, out.append, out.append)
    for chunk in chunks:
        lines.feed(chunk)
    lines.end()
    return out


def collect(items: list[TurnItem], done: threading.Event):
    def sink(item: TurnItem) -> None:
        items.append(item)
        if isinstance(item, TurnEnd | TurnFailed):
            done.set()

    return sink


def test_lines_come_whole_whatever_the_chunks_and_an_over_long_one_is_skipped():
    assert split([b'{"a"', b":1}\n{", b'"b":2}\n\n{"c":3}'], limit=10) == [
        b'{"a":1}',
        b'{"b":2}',
        b"",
        b'{"c":3}',  # the last line, without its newline
    ]
    # 12 bytes over two chunks, then a line that fits; a 20-byte last line without newline.
    assert split([b"x" * 8, b"y" * 4 + b"\nok\n", b"z" * 20], limit=10) == [13, b"ok", 20]
    assert split([b"0123456789\n", b"0123456789A\n"], limit=10) == [b"0123456789", 12]


def test_a_reader_that_fails_costs_its_own_pipe_nothing_else(caplog):
    pipes = Pipes()
    got: list[bytes] = []
    ended = threading.Event()
    bad_r, bad_w = os.pipe()
    good_r, good_w = os.pipe()

    def explode(chunk: bytes) -> None:
        raise RuntimeError("reader bug")

    pipes.watch(os.fdopen(bad_r, "rb"), explode, lambda: None)
    pipes.watch(os.fdopen(good_r, "rb"), got.append, ended.set)
    os.write(bad_w, b"boom\n")
    os.write(good_w, b"fine\n")
    os.close(good_w)
    assert ended.wait(30)
    assert b"".join(got) == b"fine\n"
    assert "serving an agent's pipe failed" in caplog.text
    os.close(bad_w)


class BrokenPipeObject:
    """A file object whose number cannot be read: a fault nobody foresaw."""

    def fileno(self) -> int:
        raise TypeError("no number")

    def close(self) -> None:
        pass


def test_a_pipe_the_thread_cannot_serve_is_ended_and_the_others_are_served(caplog):
    pipes = Pipes()
    refused = threading.Event()
    pipes.watch(BrokenPipeObject(), lambda chunk: None, refused.set)  # type: ignore[arg-type]
    assert refused.wait(30), "the pipe that could not be served was never ended"
    got: list[bytes] = []
    ended = threading.Event()
    good_r, good_w = os.pipe()
    pipes.watch(os.fdopen(good_r, "rb"), got.append, ended.set)
    os.write(good_w, b"still here")
    os.close(good_w)
    assert ended.wait(30), "the thread stopped serving pipes"
    assert b"".join(got) == b"still here"
    assert "serving an agent's pipe failed" in caplog.text


def test_many_agents_are_read_by_one_thread_and_leave_no_pipe_open(tmp_path):
    open_before = len(os.listdir("/proc/self/fd"))
    threads_before = threading.active_count()
    agents = [start_demo_agent(tmp_path / f"ws{i}") for i in range(12)]
    try:
        # Every agent streams at the same time; each gets its own chunks, in order.
        turns: list[list[TurnItem]] = [[] for _ in agents]
        ended = [threading.Event() for _ in agents]
        for agent, items, done in zip(agents, turns, ended, strict=True):
            agent.prompt("count 200", collect(items, done))
        for items, done in zip(turns, ended, strict=True):
            assert done.wait(60)
            assert ending(items) == TurnEnd("end_turn")
            assert reply_text(items) == EXPECTED
        # No thread per agent (there were two each): the one pipes thread, and whatever else
        # of this process happened to start meanwhile, is fewer than the agents.
        assert threading.active_count() - threads_before < len(agents)
    finally:
        for agent in agents:
            agent.stop()
    for agent in agents:
        assert agent.wait_closed(30)
    assert len(os.listdir("/proc/self/fd")) <= open_before + 3  # the pipes thread's own


def test_an_agent_that_stops_reading_its_input_holds_up_no_other_agent(tmp_path, monkeypatch):
    # A small allowance for what waits for the deaf agent, so that it runs out.
    monkeypatch.setattr(local, "STDIN_WAITING_BYTES", 64 << 10)
    workspace = tmp_path / "deaf"
    workspace.mkdir()
    deaf = AgentConnection(LocalAgentProcess(HOSTILE, workspace), cwd=str(workspace))
    deaf.start(timeout=15)
    other = start_demo_agent(tmp_path / "other")
    try:
        heard = threading.Event()
        items: list[object] = []

        def sink(item: object) -> None:
            items.append(item)
            if isinstance(item, Update) and "deaf" in str(item.data):
                heard.set()

        # 5,000 requests Craft answers with an error: about 600 KB of answers, which the
        # agent never reads. Every one of them is heard, and the other agent still answers.
        deaf.prompt("deafen 5000", sink)
        assert heard.wait(60), "the pipes' thread waited for an agent that does not read"
        assert ending(run_turn(other, "count 3")) == TurnEnd("end_turn")
        with pytest.raises(AgentError, match="read none of the last 65536 bytes"):
            deaf.notify("$/ping", {"pad": "x" * 1000})
    finally:
        deaf.stop()
        other.stop()
    assert not deaf.is_running
