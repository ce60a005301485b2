"""An agent's stderr costs the server bounded memory and a bounded share of its log."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from sandboxes import stderr_text
from sandboxes.stderr_log import TAIL_LINES, StderrLog

from .agent.test_acp_connection import HOSTILE
from .agents import reply_text, run_turn, start_demo_agent

MIB = 1 << 20


def vm_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def wait_for(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.02)


def stderr_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "craft.agent.stderr"]


@pytest.fixture
def hostile(tmp_path):
    connection = start_demo_agent(tmp_path / "ws", HOSTILE)
    yield connection
    connection.stop()


def test_a_300_mib_stderr_line_is_cut_without_growing_the_server(hostile, caplog, settings):
    caplog.set_level(logging.INFO, logger="craft.agent.stderr")
    limit = settings.CRAFT_MAX_STDERR_BYTES
    # The peak RSS since now (Linux: writing 5 to clear_refs resets VmHWM to VmRSS).
    Path("/proc/self/clear_refs").write_text("5")
    before = vm_kib("VmRSS")
    assert reply_text(run_turn(hostile, "stderr 300", timeout=120)) == "after stderr"
    wait_for(lambda: stderr_messages(caplog))  # the pump has read and logged the whole line
    grown = (vm_kib("VmHWM") - before) * 1024
    assert grown < 150 * MIB, f"the server grew by {grown / MIB:.0f} MiB"
    cut = f"{'x' * limit} [cut: a line of {300 * MIB} bytes]"
    assert hostile.process.stderr_tail() == cut
    assert stderr_messages(caplog) == [f"[{hostile.process.ident}] {cut}"]


def test_a_flood_of_stderr_lines_is_logged_at_the_rate_and_the_rest_counted(
    tmp_path, caplog, settings
):
    settings.CRAFT_STDERR_LOG_BYTES_PER_SECOND = 4096
    caplog.set_level(logging.INFO, logger="craft.agent.stderr")
    agent = start_demo_agent(tmp_path / "ws", HOSTILE)
    ident = agent.process.ident
    try:
        assert reply_text(run_turn(agent, "stderrflood 20000")) == "after stderrflood"
    finally:
        agent.stop()
    logged: list[int] = []
    dropped = [0, 0]

    def all_counted() -> bool:
        logged.clear()
        dropped[:] = [0, 0]
        for message in stderr_messages(caplog):
            if line := re.fullmatch(rf"\[{ident}\] flood (\d+) x+", message):
                logged.append(int(line[1]))
            elif summary := re.fullmatch(
                rf"\[{ident}\] (\d+) lines \((\d+) bytes\) of stderr were not logged: "
                r"more than 4096 bytes a second",
                message,
            ):
                dropped[0] += int(summary[1])
                dropped[1] += int(summary[2])
        return len(logged) + dropped[0] == 20_000

    # The last count is logged when the agent's stderr ends, after it stopped.
    wait_for(all_counted)
    assert logged == sorted(logged) and logged[0] == 0
    assert dropped[0] > 10_000, "about 2 MB went by at 4 KB a second"
    assert dropped[1] == 99 * dropped[0]


def test_logging_resumes_with_a_count_of_what_was_dropped():
    now = [0.0]
    log = StderrLog("agent", max_line=1000, rate=250, clock=lambda: now[0])
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("craft.agent.stderr")
    logger.addHandler(handler)
    try:
        log.feed(b"".join(b"%02d" % i + b"y" * 98 + b"\n" for i in range(10)))  # 100 bytes each
        assert [m[8:10] for m in logged] == ["00", "01", "02"]  # 250 bytes a second, in debt
        now[0] = 1.0  # 250 bytes more: 200 in the bucket
        log.feed(b"z" * 250 + b"\n")
        log.feed(b"later\n")  # the bucket is empty again
        log.close()
    finally:
        logger.removeHandler(handler)
    assert logged[3:] == [
        "[agent] 7 lines (700 bytes) of stderr were not logged: more than 250 bytes a second",
        "[agent] " + "z" * 250,
        "[agent] 1 lines (5 bytes) of stderr were not logged: more than 250 bytes a second",
    ]
    assert log.tail().splitlines()[-2:] == ["z" * 250, "later"]  # kept for errors all the same


def test_a_line_is_cut_to_the_limit_and_a_last_line_without_newline_is_kept():
    log = StderrLog("agent", max_line=5, rate=0)
    for piece in (b"abc", b"defgh", b"ij\nshort\nno newline"):
        log.feed(piece)
    log.close()
    assert log.tail().splitlines() == [
        "abcde [cut: a line of 10 bytes]",
        "short",
        "no ne [cut: a line of 10 bytes]",
    ]
    assert re.fullmatch(r"[^\n]*", log.tail().splitlines()[0])


def test_a_tail_past_its_lines_says_earlier_lines_were_cut_and_starts_on_a_whole_line():
    """The audit's bug 8 (issue 46): a long traceback's details started in its middle."""
    log = StderrLog("agent", rate=0)
    lines = [f'  File "app.py", line {n}, in step_{n}' for n in range(TAIL_LINES + 15)]
    log.feed(("\n".join(lines) + "\n").encode())
    tail = log.tail().split("\n")
    assert tail[0] == stderr_text.EARLIER_CUT
    assert tail[1:] == lines[-TAIL_LINES:]
    # Stored once, whatever is cut later; what a turn wrote is told apart all the same.
    assert stderr_text.kept(log.tail()).count(stderr_text.EARLIER_CUT) == 1
    before = log.tail()
    log.feed(b"RuntimeError: the model provider closed the connection\n")
    assert stderr_text.written_after(before, log.tail()) == (
        "RuntimeError: the model provider closed the connection"
    )
    assert stderr_text.said(log.tail()) == "RuntimeError: the model provider closed the connection"
    # A short tail has no such line.
    short = StderrLog("agent", rate=0)
    short.feed(b"one\ntwo\n")
    assert short.tail() == "one\ntwo"
