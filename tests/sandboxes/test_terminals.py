"""A terminal is a real shell on a PTY, run where and as the session's agent runs.

On the local backend (as root: the sandbox's user, its jail, network and budget) and on the
kubernetes backend (pod exec with a TTY, against the test API server): the shell runs in the
session's workspace, with the agent's environment and nothing of the server's, Ctrl-C
interrupts the foreground program, a resize reaches it, its exit code is heard, and it ends
with its sandbox.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from craft.session_activity import session_activity
from sandboxes import reaper, services
from sandboxes.models import ReaperAction, Sandbox
from sandboxes.terminals import (
    DETACHED_SECONDS,
    IN_FLIGHT_BYTES,
    SCROLLBACK_BYTES,
    Terminal,
    terminals,
    utf8_tail,
)

from .test_reaper import age

pytestmark = pytest.mark.django_db(transaction=True)
Kind = ReaperAction.Kind

WAIT = 20.0
SERVER_IGNORES = (signal.SIGINT, signal.SIGQUIT)


class Screen:
    """A socket's view of a terminal: everything it was sent, and how it ended."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.code: int | None = None
        self.done = threading.Event()
        self._changed = threading.Condition()

    def output(self, data: bytes) -> None:
        with self._changed:
            self.data += data
            self._changed.notify_all()

    def ended(self, code: int | None) -> None:
        self.code = code
        self.done.set()

    def ended_with(self) -> int | None:
        assert self.done.wait(WAIT), "the terminal did not end"
        return self.code

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + WAIT
        with self._changed:
            while (found := re.search(pattern, self.text)) is None:
                left = deadline - time.monotonic()
                assert left > 0, f"{pattern!r} not shown; the terminal shows:\n{self.text}"
                self._changed.wait(left)
        return found


def open_terminal(workspace, cols: int = 80, rows: int = 24) -> tuple[Terminal, Screen]:
    terminal = terminals.open(
        workspace.session.owner_id, workspace.sandbox, workspace.session.pk, cols, rows
    )
    screen = Screen()
    terminal.attach(screen)
    return terminal, screen


def run(terminal: Terminal, screen: Screen, command: str, marker: str) -> str:
    """Type `command` and return what the terminal showed from then on, up to `marker`
    (printed after it). What is typed is echoed too: tests look for what only the command's
    output can show (`u''id=` typed shows `uid=` only when run)."""
    start = len(screen.data)
    terminal.write(f"{command}; echo {marker[:2]}''{marker[2:]}\r".encode())
    screen.wait_for(re.escape(marker) + r"\r\n")
    shown = screen.data[start:].decode(errors="replace")
    return shown[: shown.index(marker + "\r\n")]


# The conftest's fixtures, with this test's terminals closed (and waited for) before the
# sandbox's machine is cleaned up: its cgroups go after the terminals' own.
@pytest.fixture
def workspace(workspace):
    yield workspace
    terminals.close_all()


@pytest.fixture
def local_workspace(local_workspace):
    yield local_workspace
    terminals.close_all()


def test_the_shell_runs_as_the_agent_in_the_session_s_workspace(workspace):
    terminal, screen = open_terminal(workspace)
    shown = run(terminal, screen, "echo u''id=$(id -u) c''wd=$(pwd) t''erm=$TERM", "DONE1")
    uid = int(re.search(r"uid=(\d+) ", shown)[1])
    cwd = re.search(r"cwd=(\S+) ", shown)[1]
    assert re.search(r"term=xterm-256color\r\n", shown)
    # (The test API server runs a pod's processes in the pod's folder on this machine.)
    assert cwd == str(workspace.folder)
    if workspace.backend == "local":
        assert uid == workspace.uid != os.geteuid()


def test_the_shell_has_none_of_the_server_s_environment(local_workspace, monkeypatch):
    # (A pod's environment is its image's and its spec's: the test API server's is this one.)
    monkeypatch.setenv("CRAFT_SERVER_SECRET", "s3cr3t-of-the-server")
    terminal, screen = open_terminal(local_workspace)
    shown = run(terminal, screen, "env", "DONE2")
    assert "s3cr3t-of-the-server" not in shown
    names = set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=", shown, re.M))
    assert names <= {
        "LANG", "TERM", "SHELL", "PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "PWD",
        "OLDPWD", "SHLVL", "_", "LINES", "COLUMNS", "TZ",
    }, names  # fmt: skip


def test_ctrl_c_interrupts_the_foreground_program(workspace):
    terminal, screen = open_terminal(workspace)
    # Printed by the foreground job itself: once it shows, the job has the terminal.
    terminal.write(b"sh -c 'echo sleep\"\"ing; exec sleep 60'; echo not''interrupted\r")
    screen.wait_for("sleeping")
    terminal.write(b"\x03")
    # Were the sleep not interrupted, the shell would read this only a minute later.
    run(terminal, screen, "echo back", "BACK")
    assert "notinterrupted" not in screen.text


def test_ctrl_c_interrupts_even_on_a_server_that_ignores_it(local_workspace):
    # A server started in the background of a script ignores SIGINT and SIGQUIT; its
    # sandboxes' programs must not.
    ignored = {number: signal.signal(number, signal.SIG_IGN) for number in SERVER_IGNORES}
    try:
        terminal, screen = open_terminal(local_workspace)
        shown = run(terminal, screen, "grep SigIgn /proc/self/status", "IGNORED")
        mask = int(re.search(r"SigIgn:\s+([0-9a-f]+)", shown)[1], 16)
        assert not [number for number in SERVER_IGNORES if mask & 1 << (number - 1)], shown
        terminal.write(b"sh -c 'echo sleep\"\"ing; exec sleep 60'; echo not''interrupted\r")
        screen.wait_for("sleeping")
        terminal.write(b"\x03")
        run(terminal, screen, "echo back", "BACK")
        assert "notinterrupted" not in screen.text
    finally:
        for number, handler in ignored.items():
            signal.signal(number, handler)


def test_a_resize_reaches_the_programs_on_the_terminal(workspace):
    terminal, screen = open_terminal(workspace, cols=80, rows=24)
    assert re.search(r"\b24 80\r\n", run(terminal, screen, "stty size", "SIZE1"))
    terminal.resize(132, 40)
    assert re.search(r"\b40 132\r\n", run(terminal, screen, "stty size", "SIZE2"))


def test_the_shell_s_exit_code_is_heard_and_the_terminal_dropped(workspace):
    terminal, screen = open_terminal(workspace)
    terminal.write(b"exit 3\r")
    assert screen.ended_with() == 3
    assert terminals.get(terminal.id, terminal.owner_id, terminal.session_id) is None
    assert terminals.count(terminal.owner_id) == 0


def test_a_terminal_ends_with_its_sandbox(workspace):
    terminal, screen = open_terminal(workspace)
    run(terminal, screen, "true", "READY")
    services.terminate_sandbox(workspace.sandbox)
    screen.ended_with()
    assert terminals.sandboxes() == set()


def test_a_terminal_ends_with_its_session(workspace):
    terminal, screen = open_terminal(workspace)
    run(terminal, screen, "true", "READY")
    services.remove_session_workspace(workspace.sandbox, workspace.session.pk)
    screen.ended_with()


def test_a_socket_that_comes_back_gets_the_scrollback_then_live_output(workspace):
    terminal, first = open_terminal(workspace)
    run(terminal, first, "echo before", "EARLIER")
    terminal.detach(first)
    again = Screen()
    scrollback, open_ = terminal.attach(again)
    assert open_ and b"EARLIER" in scrollback
    terminal.write(b"echo LA''TER\r")
    again.wait_for("LATER")
    assert "EARLIER" not in again.text  # sent once, in the scrollback


def test_a_terminal_left_without_a_socket_is_closed_after_a_while(workspace):
    terminal, screen = open_terminal(workspace)
    run(terminal, screen, "true", "READY")
    terminal.detach(screen)
    assert terminals.close_abandoned(time.monotonic() + DETACHED_SECONDS / 2) == 0
    assert terminals.close_abandoned(time.monotonic() + DETACHED_SECONDS + 1) == 1
    deadline = time.monotonic() + WAIT
    while terminals.get(terminal.id, terminal.owner_id, terminal.session_id) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_person_s_terminals_are_limited(workspace, settings):
    settings.CRAFT_MAX_TERMINALS_PER_USER = 2
    open_terminal(workspace)
    open_terminal(workspace)
    with pytest.raises(services.SandboxError, match="2 terminals open"):
        open_terminal(workspace)


def test_the_scrollback_keeps_whole_characters():
    data = ("é" * 10).encode()  # 2 bytes each
    assert utf8_tail(data, 5) == ("é" * 2).encode()
    assert utf8_tail(data, 6) == ("é" * 3).encode()
    assert utf8_tail(b"abc", 10) == b"abc"
    assert SCROLLBACK_BYTES == 256 * 1024


def test_an_open_terminal_keeps_its_sandbox_from_being_idle(workspace, settings):
    settings.CRAFT_SANDBOX_IDLE_SECONDS = 60
    terminal, screen = open_terminal(workspace)
    run(terminal, screen, "true", "READY")
    age(workspace.sandbox, 120)
    report = reaper.reap_sandboxes(session_activity)
    assert report.errors == [] and report.actions == []
    assert Sandbox.objects.get(pk=workspace.sandbox.pk).status == Sandbox.Status.RUNNING
    run(terminal, screen, "echo still", "THERE")
    terminal.write(b"exit\r")
    screen.ended_with()
    age(workspace.sandbox, 120)
    report = reaper.reap_sandboxes(session_activity)
    assert [(a.kind, a.sandbox_id) for a in report.actions] == [
        (Kind.TERMINATED_IDLE, workspace.sandbox.pk)
    ]


def test_the_reaper_closes_the_terminals_of_a_sandbox_another_process_stopped(workspace):
    terminal, screen = open_terminal(workspace)
    run(terminal, screen, "true", "READY")
    Sandbox.objects.filter(pk=workspace.sandbox.pk).update(status=Sandbox.Status.FAILED)
    reaper.stop_idle_agents(session_activity)
    screen.ended_with()


def test_a_terminal_is_read_no_further_than_its_sockets_send(workspace):
    terminal, screen = open_terminal(workspace)
    run(terminal, screen, "true", "READY")
    terminal.sent(screen, len(screen.data))
    acked = len(screen.data)
    behind = 0  # the most the terminal was ever ahead of what the socket sent
    terminal.write(b"head -c 4000000 /dev/zero | tr '\\0' x; echo; echo DO''NE\r")

    start = acked

    def done() -> bool:
        return screen.data.find(b"DONE\r\n", start) >= 0

    # The socket sends only once the terminal is as far ahead as flow control lets it be.
    while not done():
        with screen._changed:
            assert screen._changed.wait_for(
                lambda acked=acked: len(screen.data) - acked >= IN_FLIGHT_BYTES or done(), WAIT
            ), "the terminal stalled"
            size = len(screen.data)
        behind = max(behind, size - acked)
        terminal.sent(screen, size - acked)
        acked = size
    assert IN_FLIGHT_BYTES <= behind <= IN_FLIGHT_BYTES + (64 << 10)
