"""A terminal's keystroke echo: through Craft's terminal socket beside a PTY alone.

Both run bash, and both time the same thing: a key typed (`x`) until the terminal shows it
again (readline's echo), then a backspace to keep the line short (not timed).

* a PTY alone: bash on a pseudo-terminal of this process, written and read directly: the floor;
* through Craft: the terminal websocket of a session (daphne), an `input` frame until the
  `output` frame that shows the key; the shell runs as the agent of the session runs (as root:
  the sandbox's user, its jail, network and budget); target within 5 ms of the floor.

Medians of many keystrokes, in one run.

    .venv/bin/python -m bench.terminal [--keystrokes 300]
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
import uuid
from typing import Any

from .harness import Figure, Site, median, run_alone

PROMPT = ("$ ", "# ")  # the end of bash's prompt (root's ends with #)
KEY = "x"
ERASE = "\x7f"
TARGET_MS = 5.0


async def run(site: Site, keystrokes: int = 300) -> list[Figure]:
    floor = await asyncio.to_thread(_on_a_pty, keystrokes)
    craft = await _through_craft(site, keystrokes)
    return [
        Figure("terminal: keystroke echo, a PTY alone", floor * 1000, "ms", "reported", None,
               f"bash, median of {keystrokes}"),
        Figure("terminal: keystroke echo through Craft", craft * 1000, "ms",
               f"within {TARGET_MS:g} ms of a PTY alone", (craft - floor) * 1000 <= TARGET_MS,
               f"{(craft - floor) * 1000:+.2f} ms on a PTY alone"),
    ]  # fmt: skip


def _on_a_pty(keystrokes: int) -> float:
    """Time the echo of `keystrokes` keys typed into bash on a PTY of this process."""
    master, slave = os.openpty()
    bash = shutil.which("bash") or "/bin/bash"
    home = tempfile.mkdtemp(prefix="craft-bench-terminal-")
    env = {"PATH": "/usr/bin:/bin", "TERM": "xterm-256color", "LANG": "C.UTF-8", "HOME": home}
    process = subprocess.Popen(
        [bash], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=home, start_new_session=True
    )
    os.close(slave)
    try:
        _read_until(master, *PROMPT)
        times = []
        for _ in range(keystrokes):
            began = time.perf_counter()
            os.write(master, KEY.encode())
            _read_until(master, KEY)
            times.append(time.perf_counter() - began)
            os.write(master, ERASE.encode())
            _read_until(master, "\b")
        return median(times)
    finally:
        process.kill()
        process.wait()
        os.close(master)
        shutil.rmtree(home, ignore_errors=True)


def _read_until(fd: int, *wanted: str, timeout: float = 10.0) -> None:
    seen = ""
    deadline = time.monotonic() + timeout
    while not any(text in seen for text in wanted):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise RuntimeError(f"the terminal did not show {wanted!r}: {seen[-200:]!r}")
        seen += os.read(fd, 65536).decode(errors="replace")


async def _through_craft(site: Site, keystrokes: int) -> float:
    """Time the echo of `keystrokes` keys typed through the terminal socket of a session."""
    import aiohttp

    user, cookie = await asyncio.to_thread(site.user, f"terminal-{uuid.uuid4().hex[:8]}")
    session = await asyncio.to_thread(site.session, user, "terminal")
    with site.serve() as server:
        async with aiohttp.ClientSession(headers={"Cookie": cookie, "Origin": server.url}) as http:
            url = f"{server.url.replace('http', 'ws')}/ws/sessions/{session}/terminals/"
            async with http.ws_connect(url) as ws:
                ready = await _frame(ws)
                assert ready["type"] == "ready", ready
                await _until(ws, *PROMPT)
                times = []
                for _ in range(keystrokes):
                    began = time.perf_counter()
                    await ws.send_str(json.dumps({"type": "input", "data": KEY}))
                    await _until(ws, KEY)
                    times.append(time.perf_counter() - began)
                    await ws.send_str(json.dumps({"type": "input", "data": ERASE}))
                    await _until(ws, "\b")
                await ws.send_str(json.dumps({"type": "input", "data": "exit\r"}))
    return median(times)


async def _frame(ws: Any) -> dict[str, Any]:
    message = await asyncio.wait_for(ws.receive(), 10)
    return json.loads(message.data)


async def _until(ws: Any, *wanted: str) -> None:
    seen = ""
    while not any(text in seen for text in wanted):
        frame = await _frame(ws)
        if frame["type"] != "output":
            raise RuntimeError(f"the terminal sent {frame}")
        seen += frame["data"]


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, keystrokes=300)


if __name__ == "__main__":
    main()
