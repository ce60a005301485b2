"""`make run`'s configuration served for real: SQLite, in-memory channel layer, daphne.

Used by the tests that check what `make run` does end to end (tests/test_embedded_*.py).
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import websocket
from django.conf import settings

from .server import Daphne

ROOT = Path(settings.BASE_DIR)


def embedded_env(var_dir: Path, uid_base: int | None = None, **extra: str) -> dict[str, str]:
    """Return this environment without Craft's settings, plus debug and `var_dir`, and the
    test's own sandbox uid range (the `uid_base` fixture) when given: what a server running
    as root leaves of its sandboxes (networks, cgroups, the network rule) is then the test's,
    removed after it, never the default installation's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    if uid_base is not None:
        env |= {"CRAFT_SANDBOX_UID_BASE": str(uid_base), "CRAFT_SANDBOX_UID_COUNT": "1000"}
    return {**env, "DJANGO_DEBUG": "1", "CRAFT_VAR_DIR": str(var_dir), **extra}


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


class SignedIn:
    """The admin, signed in to a running server."""

    def __init__(self, url: str, password: str, process: subprocess.Popen[bytes]) -> None:
        self.url = url
        self.process = process
        jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        for _ in range(200):
            try:
                login_page = self.opener.open(f"{url}/accounts/login/", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.05)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page).group(1)
        form = f"username=admin&password={password}&csrfmiddlewaretoken={token}".encode()
        self.opener.open(f"{url}/accounts/login/", data=form, timeout=10)
        self.cookies = {c.name: c.value for c in jar}
        assert "sessionid" in self.cookies

    def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "X-CSRFToken": self.cookies["csrftoken"]},
        )
        return json.load(self.opener.open(request, timeout=30))

    def get_json(self, path: str) -> dict[str, Any]:
        return json.load(self.opener.open(f"{self.url}{path}", timeout=30))

    def wait_until_running(self, deadline_seconds: float = 60) -> None:
        """Wait for the signed-in user's sandbox (provisioned in the background) to run."""
        deadline = time.monotonic() + deadline_seconds
        while (sandbox := self.get_json("/api/sandbox/"))["status"] != "running":
            assert sandbox["status"] == "provisioning", sandbox
            assert time.monotonic() < deadline, "the sandbox never started"
            time.sleep(0.05)

    def socket(self, session_id: str) -> websocket.WebSocket:
        self.wait_until_running()
        ws = websocket.create_connection(
            f"ws{self.url.removeprefix('http')}/ws/sessions/{session_id}/",
            header=[f"Cookie: sessionid={self.cookies['sessionid']}"],
            origin=self.url,
            timeout=30,
        )
        assert json.loads(ws.recv())["type"] == "hello"
        ws.send(json.dumps({"type": "resume", "after": 0}))
        return ws


def turn(ws: websocket.WebSocket, prompt_id: str, text: str) -> list[dict[str, Any]]:
    """Send a prompt and return the frames of its turn, up to its turn_end."""
    ws.send(json.dumps({"type": "prompt", "id": prompt_id, "text": text}))
    frames = []
    while (frame := json.loads(ws.recv()))["kind"] != "turn_end":
        frames.append(frame)
    return frames


def chunks(frames: list[dict[str, Any]]) -> list[str]:
    return [f["data"]["content"]["text"] for f in frames if f["kind"] == "agent_message_chunk"]


@contextlib.contextmanager
def serve(env: dict[str, str], var_dir: Path, launcher: tuple[str, ...] = ()) -> Iterator[SignedIn]:
    """Set up `var_dir` as `make run` does, serve it with daphne (behind `launcher`), and sign
    in as the admin."""
    var_dir.mkdir(exist_ok=True)
    manage(env, "migrate", "--noinput")
    manage(env, "collectstatic", "--noinput", "-v", "0")
    password = re.search(r"with password (\S+)", manage(env, "ensure_admin")).group(1)
    server = Daphne(var_dir, base_env=env, launcher=launcher).start()
    assert server.process is not None
    try:
        yield SignedIn(server.url, password, server.process)
    finally:
        server.terminate()
