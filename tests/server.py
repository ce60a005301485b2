"""Daphne in a subprocess, started as `make run` and the deployment start it.

The one place tests start a server: the browser tests, the tests of `make run`'s embedded
defaults, and the tests about the server process itself (restarts, SIGTERM, SIGKILL,
several workers). By default it serves `craft.asgi` against the test database.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import websocket
from django.conf import settings

from .conftest import OPEN_SOCKETS
from .craft.wsclient import session_cookie
from .ports import free_port

# As `make run` starts daphne: client frames of up to 4 MiB reach Craft (docs/deployment.md).
DAPHNE_OPTIONS = [
    "--websocket-max-message-size",
    "4194304",
    "--websocket-max-frame-size",
    "4194304",
]


def test_database_env() -> dict[str, str]:
    """This environment, pointed at the test database and the test's sandbox folder."""
    db = settings.DATABASES["default"]
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CRAFT_SANDBOX_ROOT": str(settings.CRAFT_SANDBOX_ROOT),
    }


class Daphne:
    """One daphne process serving an ASGI application (`craft.asgi` unless told otherwise)."""

    def __init__(
        self,
        workdir: Path,
        *,
        app: str = "craft.asgi:application",
        base_env: dict[str, str] | None = None,
        options: tuple[str, ...] = (),
        launcher: tuple[str, ...] = (),
        **env: str,
    ) -> None:
        self.app = app
        self.launcher = list(launcher)  # what daphne's command runs behind
        self.options = [*DAPHNE_OPTIONS, *options]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / f"daphne-{self.port}.log"
        self.env = {**(test_database_env() if base_env is None else base_env), **env}
        database = self.env.get("DATABASE_URL", "")
        if database.startswith("postgres"):
            # PostgreSQL then says whose a connection is (pg_stat_activity), as the log is named.
            joiner = "&" if "?" in database else "?"
            self.env["DATABASE_URL"] = f"{database}{joiner}application_name=daphne-{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Daphne:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [*self.launcher, sys.executable, "-m", "daphne", *self.options, "-b", "127.0.0.1",
                 "-p", str(self.port), self.app],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=settings.BASE_DIR,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/accounts/login/", timeout=1).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.process.kill()
                    log = self.log.read_text()[-3000:]
                    raise AssertionError(f"daphne did not start:\n{log}") from None
                time.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        """Kill the server at once (a test that wants a clean stop sends SIGTERM itself)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout: float = 10) -> None:
        """Stop the server cleanly; kill it if it takes longer than `timeout`."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            # Turns a test left running make the server wait out its shutdown grace.
            self.process.kill()
            self.process.wait(10)  # reaped, or the Popen warns (an error here) once dropped


def wait_for_log(server: Daphne, line: str, *, count: int, timeout: float = 120) -> None:
    """Wait until the server has logged `line` `count` times (a deadline only for a broken
    server: a loaded machine just takes longer)."""
    deadline = time.monotonic() + timeout
    while (seen := server.log.read_text().count(line)) < count:
        assert time.monotonic() < deadline, f"the server logged {line!r} {seen} times, not {count}"
        time.sleep(0.1)


def api(server: Daphne, user: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """Make a signed-in JSON API request to the server; return (status, JSON body)."""
    return api_request(server.url, session_cookie(user), method, path, body)


def open_session(server: Daphne, user: Any, agent: str) -> Socket:
    """Open a session of `agent` through the API and a socket on it, resumed from the start."""
    status, session = api(server, user, "POST", "/api/sessions/", {"agent": agent})
    assert status == 201, session
    socket = Socket(server, user, session["id"])
    socket.send({"type": "resume", "after": 0})
    return socket


def ask(socket: Socket, text: str) -> str:
    """Send a prompt and return what the agent answered in that turn."""
    socket.send({"type": "prompt", "id": f"{text}-{time.monotonic()}", "text": text})
    frames = socket.until(lambda f: f.get("kind") == "turn_end")
    chunks = [f["data"] for f in frames if f.get("kind") == "agent_message_chunk"]
    errors = [f for f in frames if f.get("kind") == "agent_error" or f["type"] == "error"]
    assert chunks, errors or frames
    return "".join(chunk["content"]["text"] for chunk in chunks)


def api_request(url: str, cookie: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """Make a JSON API request with a session cookie; return (status, JSON body)."""
    csrf = secrets.token_hex(16)  # any 32 characters: the cookie and the header must agree
    request = urllib.request.Request(
        f"{url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={
            "Content-Type": "application/json",
            "Cookie": f"{cookie}; csrftoken={csrf}",
            "X-CSRFToken": csrf,
            "Origin": url,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, _json_or_none(answer.read())
    except urllib.error.HTTPError as failed:
        with failed:
            return failed.status, _json_or_none(failed.read())


def _json_or_none(body: bytes) -> Any:
    return json.loads(body) if body else None  # 204 has no body


def close_code(ws: websocket.WebSocket) -> int:
    """Read `ws` until the server's close frame and return its code, without answering it.

    websocket-client's `recv_data_frame` answers a close frame at once, and that answer meets a
    reset when the server has already given up waiting for it (a slow test reads late): the
    close code was received all the same, and it is what a test is about.
    """
    while True:
        frame = ws.recv_frame()
        if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
            return int.from_bytes(frame.data[:2], "big")


def closed_by_server(ws) -> bool:
    """Read what is there; True once the server closed the connection (4408, or a reset: a
    client that does not read does not answer the close either, so the server drops it)."""
    ws.settimeout(15)
    try:
        while True:
            opcode, frame = ws.recv_data_frame(control_frame=True)
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                return int.from_bytes(frame.data[:2], "big") == 4408
    except (ConnectionResetError, websocket.WebSocketConnectionClosedException):
        return True
    except websocket.WebSocketTimeoutException:
        return False
    finally:
        ws.shutdown()


class Socket:
    """A signed-in websocket on one session of a `Daphne` (websocket-client, blocking)."""

    def __init__(self, server: Daphne, user: Any, session_id: Any) -> None:
        self.ws = websocket.create_connection(
            f"ws://127.0.0.1:{server.port}/ws/sessions/{session_id}/",
            header=[f"Cookie: {session_cookie(user)}"],
            origin=server.url,
            timeout=30,
        )
        OPEN_SOCKETS.add(self)
        self.events: list[dict[str, Any]] = []  # every event frame received, in order
        self.hello = self.frame()
        assert self.hello["type"] == "hello", self.hello

    def frame(self) -> dict[str, Any]:
        frame = json.loads(self.ws.recv())
        if frame.get("type") == "event":
            self.events.append(frame)
        return frame

    def send(self, frame: dict[str, Any]) -> None:
        self.ws.send(json.dumps(frame))

    def until(self, done: Any) -> list[dict[str, Any]]:
        frames = []
        while True:
            frames.append(self.frame())
            if done(frames[-1]):
                return frames

    def until_kind(self, kind: str, count: int = 1) -> list[dict[str, Any]]:
        """Receive until the `count`-th event of `kind` from now; an error frame fails."""
        seen = 0

        def done(frame: dict[str, Any]) -> bool:
            nonlocal seen
            assert frame.get("type") != "error", frame
            seen += frame.get("kind") == kind
            return seen == count

        return self.until(done)

    def close(self) -> None:
        OPEN_SOCKETS.discard(self)
        self.ws.close()
