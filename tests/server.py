"""Daphne in a subprocess against the test database, to be started, stopped and killed.

For the tests that are about the server process itself: restarts, SIGTERM, SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket
from django.conf import settings

from .conftest import free_port
from .craft.wsclient import session_cookie


class Daphne:
    """One daphne process serving craft.asgi (as `daphne craft.asgi:application` would)."""

    def __init__(self, workdir: Path, **env: str) -> None:
        db = settings.DATABASES["default"]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"daphne-{self.port}.log"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "CRAFT_SANDBOX_ROOT": str(settings.CRAFT_SANDBOX_ROOT),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Daphne:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "daphne", "--websocket-max-message-size", "4194304",
                 "--websocket-max-frame-size", "4194304",
                 "-b", "127.0.0.1", "-p", str(self.port),
                 "craft.asgi:application"],
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
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


class Socket:
    """A signed-in websocket on one session of a `Daphne` (websocket-client, blocking)."""

    def __init__(self, server: Daphne, user: Any, session_id: Any) -> None:
        self.ws = websocket.create_connection(
            f"ws://127.0.0.1:{server.port}/ws/sessions/{session_id}/",
            header=[f"Cookie: {session_cookie(user)}"],
            origin=server.url,
            timeout=30,
        )
        self.hello = self.frame()
        assert self.hello["type"] == "hello", self.hello

    def frame(self) -> dict[str, Any]:
        return json.loads(self.ws.recv())

    def send(self, frame: dict[str, Any]) -> None:
        self.ws.send(json.dumps(frame))

    def until(self, done: Any) -> list[dict[str, Any]]:
        frames = []
        while True:
            frames.append(self.frame())
            if done(frames[-1]):
                return frames

    def close(self) -> None:
        self.ws.close()
