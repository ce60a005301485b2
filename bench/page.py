"""Measure how long the chat page takes to render a session of N stored events in Chromium.

It uses the benchmarks' throwaway site (bench/harness.py), stores N events in one session (a
realistic mix: user messages, agent text and thoughts streamed in chunks, plans, tool calls with
their updates, diffs and output, permission requests and answers, turn ends), serves the app
with daphne, and opens the session page in headless Chromium (Debian's, through Playwright) with a
cold cache for every run. A run's time is from navigation start until the element of the last
event is in the page; it also reports the time to first byte of the page, when the history
requests ran, and when the frame showing the result was ready (styled, laid out, scrolled to
the bottom). Beside it, what any page costs a fresh context in the same browser: the
sign-in page's first paint (its style sheet, fonts and first layout). Then what the sidebar
costs the server after a change: the changed session's item against the whole list of 100.

    .venv/bin/python -m bench.page [--events 5000] [--runs 5]
"""

from __future__ import annotations

import asyncio
import http.client
import os
import time
import uuid
from typing import Any
from urllib.parse import urlparse

from .harness import Figure, Site, median, run_alone

CHROMIUM = os.environ.get("BENCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]

# Set before any page script runs: note the moment the last event's mark enters the page.
WATCH_SCRIPT = """
(() => {
  const selector = '#transcript [data-seq="%d"]';
  const observer = new MutationObserver(() => {
    if (document.querySelector(selector)) {
      window.__benchRendered = performance.now();
      observer.disconnect();
      // The frame that shows it: styled, laid out and scrolled to the bottom.
      requestAnimationFrame(() => setTimeout(() => (window.__benchPainted = performance.now())));
    }
  });
  observer.observe(document, { childList: true, subtree: true });
})();
"""

READ_TIMINGS = """
() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const loads = performance.getEntriesByType("resource")
    .filter((e) => e.name.includes("/events/?"));
  return {
    rendered: window.__benchRendered,
    painted: window.__benchPainted,
    ttfb: nav.responseStart,
    dom_content_loaded: nav.domContentLoadedEventEnd,
    history_start: loads.length ? Math.min(...loads.map((e) => e.startTime)) : null,
    history_end: loads.length ? Math.max(...loads.map((e) => e.responseEnd)) : null,
    history_requests: loads.length,
  };
}
"""


# --- the session's events --------------------------------------------------------------------

PROSE = (
    "the build fails because the test runner cannot find the fixture so I will look at how "
    "conftest loads it and then change the path before running the suite again"
)
WORDS = PROSE.split(" ")

CODE = "```python\ndef add(a: int, b: int) -> int:\n    return a + b\n\n\nprint(add(2, 3))\n```\n"


def _chunks(text: str, size: int = 6) -> list[str]:
    words = text.split(" ")
    return [" ".join(words[i : i + size]) + " " for i in range(0, len(words), size)]


def _say(kind: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (kind, {"sessionUpdate": kind, "content": {"type": "text", "text": chunk}})
        for chunk in _chunks(text)
    ]


def _plan(done: int) -> tuple[str, dict[str, Any]]:
    steps = ["Read the failing test", "Fix the fixture path", "Run the suite", "Report back"]
    entries = [
        {
            "content": step,
            "priority": "medium",
            "status": "completed" if i < done else "in_progress" if i == done else "pending",
        }
        for i, step in enumerate(steps)
    ]
    return ("plan", {"sessionUpdate": "plan", "entries": entries})


def _tool(n: int, workspace: str, with_permission: bool) -> list[tuple[str, dict[str, Any]]]:
    call_id = f"call-{n}"
    path = f"{workspace}/src/module_{n}.py"
    if n % 3 == 0:
        title, kind = f"Run pytest tests/test_{n}.py", "execute"
        content = [
            {
                "type": "content",
                "content": {
                    "type": "text",
                    "text": "".join(
                        f"tests/test_{n}.py::test_case_{i} PASSED\n" for i in range(30)
                    ),
                },
            }
        ]
    elif n % 3 == 1:
        title, kind = f"Edit src/module_{n}.py", "edit"
        old = "".join(f"line {i} of the module\n" for i in range(20))
        content = [
            {
                "type": "diff",
                "path": path,
                "oldText": old,
                "newText": old.replace("line 7 of", "changed line 7 of"),
            }
        ]
    else:
        title, kind = f"Read src/module_{n}.py", "read"
        content = [
            {
                "type": "content",
                "content": {
                    "type": "text",
                    "text": "".join(f"def function_{i}():\n    pass\n" for i in range(15)),
                },
            }
        ]
    call = {
        "toolCallId": call_id,
        "title": title,
        "kind": kind,
        "status": "pending",
        "locations": [{"path": path}],
        "rawInput": {"path": path},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("tool_call", {"sessionUpdate": "tool_call", **call})
    ]
    if with_permission:
        options = [
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
        ]
        request = f"req-{n}"
        events.append(
            (
                "permission_request",
                {"request": request, "toolCall": {**call, "content": content}, "options": options},
            )
        )
        events.append(("permission_answer", {"request": request, "option": "allow"}))
    update = {"sessionUpdate": "tool_call_update", "toolCallId": call_id}
    events.append(("tool_call_update", {**update, "status": "in_progress"}))
    events.append(("tool_call_update", {**update, "status": "completed", "content": content}))
    return events


def session_events(count: int, workspace: str) -> list[tuple[str, dict[str, Any]]]:
    """Return `count` events of a plausible session: turns of about a hundred events each."""
    events: list[tuple[str, dict[str, Any]]] = []
    turn = 0
    tools = 0
    while len(events) < count:
        turn += 1
        prose = " ".join(WORDS[(turn + i) % len(WORDS)] for i in range(120))
        events.append(
            ("user_message", {"id": f"prompt-{turn}", "text": f"Step {turn}: {prose[:90]}"})
        )
        events += _say("agent_thought_chunk", prose[:300])
        events.append(_plan(0))
        events += _say("agent_message_chunk", f"**Plan for step {turn}.** {prose}\n\n")
        for step in range(3):
            tools += 1
            events += _tool(tools, workspace, with_permission=step == 1)
            events.append(_plan(step + 1))
        reply = f"Done with step {turn}:\n\n- `src/module_{tools}.py` changed\n- {prose[:200]}\n\n"
        events += _say("agent_message_chunk", reply + (CODE if turn % 2 else ""))
        events.append(("turn_end", {"stop_reason": "end_turn"}))
    events = events[:count]
    events[-1] = ("turn_end", {"stop_reason": "end_turn"})
    return events


def store(site: Site, events: int) -> tuple[str, str]:
    """Create a user with one session holding `events` events; return (cookie, session id)."""
    from craft.models import Session
    from craft.storage.eventlog import append_events
    from craft.views import session_workspace

    user, cookie = site.user(f"page-{uuid.uuid4().hex[:6]}")
    session = Session.objects.get(pk=site.session(user, "A long session"))
    stored = session_events(events, session_workspace(session))
    for start in range(0, len(stored), 500):
        append_events(session.pk, stored[start : start + 500])
    return cookie.split("=", 1)[1], str(session.pk)


# A page's first paint: what any page costs a fresh browser context here (styles, fonts and the
# first layout of a new renderer), whatever its content.
FIRST_PAINT = "() => performance.getEntriesByName('first-contentful-paint')[0]?.startTime"


async def _first_paints(browser: Any, url: str, runs: int) -> list[float]:
    """The sign-in page's first paint in a fresh context, `runs` times (after one untimed)."""
    paints = []
    for run in range(runs + 1):
        # As for the session page: wait_for_function needs the eval the policy forbids.
        context = await browser.new_context(
            viewport={"width": 1440, "height": 900}, bypass_csp=True
        )
        page = await context.new_page()
        await page.goto(f"{url}/accounts/login/")
        await page.wait_for_function(f"({FIRST_PAINT})() !== undefined", timeout=60000)
        paint = await page.evaluate(FIRST_PAINT)
        await context.close()
        if run:
            paints.append(paint)
    return paints


async def _time_runs(url: str, cookie: str, session_id: str, events: int, runs: int) -> list[dict]:
    from playwright.async_api import async_playwright

    results = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            for run in range(runs + 1):  # the first run warms the server up and is not counted
                # The page's Content-Security-Policy forbids eval, which Playwright's
                # wait_for_function needs; the policy costs the page nothing measurable.
                context = await browser.new_context(
                    viewport={"width": 1440, "height": 900}, bypass_csp=True
                )
                await context.add_cookies([{"name": "sessionid", "value": cookie, "url": url}])
                await context.add_init_script(WATCH_SCRIPT % events)
                page = await context.new_page()
                await page.goto(f"{url}/sessions/{session_id}/")
                await page.wait_for_function("window.__benchPainted !== undefined", timeout=60000)
                timings = await page.evaluate(READ_TIMINGS)
                await context.close()
                if run:
                    results.append(timings)
            floor = await _first_paints(browser, url, runs)
            for timings, paint in zip(results, floor, strict=True):
                timings["floor_paint"] = paint
        finally:
            await browser.close()
    return results


# --- the sidebar after a change ----------------------------------------------------------------

SIDEBAR_SESSIONS = 100


def _sidebar_requests(url: str, cookie: str, current: str, changed: str, times: int) -> dict:
    """Time the sidebar's two ways of catching up with a change, one request at a time on one
    connection, alternating, beside `/healthz` (any request's cost): medians in ms."""
    address = urlparse(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    headers = {"Cookie": f"sessionid={cookie}", "HX-Request": "true"}
    paths = {
        "whole": f"/sessions/list/?current={current}",
        "item": f"/sessions/list/{changed}/?current={current}",
        "healthz": "/healthz",
    }
    took: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for run in range(times + 10):  # the first ten warm up
            for name, path in paths.items():
                start = time.perf_counter()
                connection.request("GET", path, headers=headers)
                answer = connection.getresponse()
                answer.read()
                assert answer.status == 200, (path, answer.status)
                if run >= 10:
                    took[name].append((time.perf_counter() - start) * 1000)
    finally:
        connection.close()
    return {name: median(values) for name, values in took.items()}


async def sidebar(site: Site, server: Any, times: int = 200) -> Figure:
    """What a page's sidebar costs the server for one changed session (the socket's
    `sessions` frame names it) against fetching the whole list, 100 sessions."""
    user, cookie = site.user(f"sidebar-{uuid.uuid4().hex[:6]}")
    ids = [site.session(user, f"session {n}") for n in range(SIDEBAR_SESSIONS)]
    cookie_value = cookie.split("=", 1)[1]
    ms = await asyncio.to_thread(
        _sidebar_requests, server.url, cookie_value, ids[0], ids[50], times
    )
    return Figure(
        f"sidebar after a change, {SIDEBAR_SESSIONS} sessions: the changed item",
        ms["item"],
        "ms",
        "-",
        None,
        f"the whole list {ms['whole']:.1f} ms, /healthz {ms['healthz']:.2f} ms "
        f"(medians of {times}, one at a time)",
    )


TARGET_MS = 400.0


async def run(site: Site, runs: int = 5, events: int = 5000) -> list[Figure]:
    cookie, session_id = store(site, events)
    with site.serve() as server:
        timings = await _time_runs(server.url, cookie, session_id, events, runs)
        list_figure = await sidebar(site, server)
    rendered = [t["rendered"] for t in timings]
    ms = median(rendered)
    return [
        Figure(
            f"session page, {events:,} events, rendered in Chromium",
            ms,
            "ms",
            f"<= {TARGET_MS:g} ms",
            ms <= TARGET_MS if events == 5000 else None,
            f"TTFB {median([t['ttfb'] for t in timings]):.0f} ms, best {min(rendered):.0f} ms, "
            f"worst {max(rendered):.0f} ms, history requests "
            f"{timings[-1]['history_requests']}; beside it, the sign-in page's first paint "
            f"{median([t['floor_paint'] for t in timings]):.0f} ms (any page's, fresh context)",
        ),
        list_figure,
    ]


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, runs=5, events=5000)


if __name__ == "__main__":
    main()
