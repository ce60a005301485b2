"""Measure how long a websocket resume of N stored events takes, end to end.

It builds a throwaway database (SQLite in a temporary folder by default, or the database named
by BENCH_DATABASE_URL), stores N events in one session, serves the app with daphne on a free
loopback port, then connects a real websocket client with a signed-in session cookie, sends
`resume` after 0 and times until the last event arrives. It prints one line per run and a
summary.

    .venv/bin/python bench/resume.py [--events 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prepare(events: int) -> tuple[str, str]:
    """Migrate, create a user with a session holding `events` events; return (cookie, id)."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from craft.eventlog import append_events
    from craft.services import open_session
    from tests.craft.wsclient import session_cookie

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="bench-password-unused")
    session = open_session(user, "bench")
    chunk = {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "a typical streamed chunk of agent text "},
    }
    for start in range(0, events, 500):
        append_events(session.pk, [("agent_message_chunk", chunk)] * min(500, events - start))
    return session_cookie(user), str(session.pk)


def time_resume(url: str, cookie: str, session_id: str, events: int) -> float:
    import websocket  # websocket-client

    ws = websocket.create_connection(
        f"{url.replace('http', 'ws')}/ws/sessions/{session_id}/",
        header=[f"Cookie: {cookie}"],
        origin=url,  # the app's own origin: scheme, host and port
        timeout=30,
    )
    try:
        hello = json.loads(ws.recv())
        assert hello["type"] == "hello" and hello["last_seq"] == events, hello
        started = time.perf_counter()
        ws.send(json.dumps({"type": "resume", "after": 0}))
        expected = 1
        while expected <= events:
            frame = json.loads(ws.recv())
            assert frame["type"] == "event" and frame["seq"] == expected, frame
            expected += 1
        return time.perf_counter() - started
    finally:
        ws.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="craft-bench-"))
    (workdir / "static").mkdir()  # STATIC_ROOT; WhiteNoise warns when it is missing
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "craft.settings",
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": "bench-only-secret",
        "DJANGO_SECURE_COOKIES": "0",
        "DATABASE_URL": os.environ.get(
            "BENCH_DATABASE_URL", f"sqlite:///{workdir / 'bench.sqlite3'}"
        ),
        "CRAFT_VAR_DIR": str(workdir),
        "CRAFT_LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    cookie, session_id = prepare(args.events)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "craft.asgi:application",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{url}/accounts/login/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        database = env["DATABASE_URL"].split(":", 1)[0]
        print(f"resume of {args.events} events over a real websocket (daphne, {database})")
        times = []
        for run in range(1, args.runs + 1):
            seconds = time_resume(url, cookie, session_id, args.events)
            times.append(seconds)
            rate = args.events / seconds
            print(f"  run {run}: {seconds * 1000:7.1f} ms  ({rate:,.0f} events/s)")
        print(
            f"median {statistics.median(times) * 1000:.1f} ms, best {min(times) * 1000:.1f} ms, "
            f"worst {max(times) * 1000:.1f} ms"
        )
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
