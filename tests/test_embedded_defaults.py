"""`make run`'s settings end to end: SQLite, in-memory channel layer, local backend, demo agent.

The rest of the suite runs on PostgreSQL; this test serves the app exactly as `make run` does
(daphne, DJANGO_DEBUG on, nothing configured) from a fresh folder, signs in as the admin
account that `ensure_admin` created, and holds a conversation of two prompts over a real
websocket, checking that one agent process answered both.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import websocket
from django.conf import settings

from .conftest import free_port

ROOT = Path(settings.BASE_DIR)


@pytest.fixture
def embedded_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    return {**env, "DJANGO_DEBUG": "1", "CRAFT_VAR_DIR": str(tmp_path / "var")}


def manage(env, *args) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_ensure_admin_creates_a_random_password_once(embedded_env, tmp_path):
    (tmp_path / "var").mkdir()
    manage(embedded_env, "migrate", "--noinput")
    first = manage(embedded_env, "ensure_admin")
    password = re.search(r"with password (\S+)", first).group(1)
    assert len(password) >= 20
    kept = tmp_path / "var" / "admin-password.txt"
    assert kept.read_text().split() == ["admin", password]
    assert kept.stat().st_mode & 0o777 == 0o600
    second = manage(embedded_env, "ensure_admin")
    assert password not in second
    assert "exists" in second


def test_make_runs_configuration_serves_a_two_prompt_conversation(embedded_env, tmp_path):
    (tmp_path / "var").mkdir()
    manage(embedded_env, "migrate", "--noinput")
    manage(embedded_env, "collectstatic", "--noinput", "-v", "0")
    password = re.search(r"with password (\S+)", manage(embedded_env, "ensure_admin")).group(1)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "craft.asgi:application"],
        env=embedded_env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        for _ in range(200):
            try:
                login_page = opener.open(f"{url}/accounts/login/", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.05)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page).group(1)
        form = f"username=admin&password={password}&csrfmiddlewaretoken={token}".encode()
        opener.open(f"{url}/accounts/login/", data=form, timeout=10)
        cookies = {c.name: c.value for c in jar}
        assert "sessionid" in cookies

        request = urllib.request.Request(
            f"{url}/api/sessions/",
            data=b'{"title": "embedded"}',
            headers={"Content-Type": "application/json", "X-CSRFToken": cookies["csrftoken"]},
        )
        session = json.load(opener.open(request, timeout=30))

        ws = websocket.create_connection(
            f"ws://127.0.0.1:{port}/ws/sessions/{session['id']}/",
            header=[f"Cookie: sessionid={cookies['sessionid']}"],
            origin=url,
            timeout=30,
        )
        try:
            assert json.loads(ws.recv())["type"] == "hello"
            ws.send(json.dumps({"type": "resume", "after": 0}))
            replies = []
            for n in (1, 2):
                ws.send(json.dumps({"type": "prompt", "id": f"p{n}", "text": "pid"}))
                while (frame := json.loads(ws.recv()))["kind"] != "turn_end":
                    if frame["kind"] == "agent_message_chunk":
                        replies.append(frame["data"]["content"]["text"])
            assert len(replies) == 2
            assert replies[0] == replies[1]  # the same agent process answered both
            assert replies[0].startswith("pid ")
        finally:
            ws.close()
        assert (tmp_path / "var" / "craft.sqlite3").exists()
    finally:
        server.terminate()
        server.wait(10)
