"""What the page does when data is big or the network is bad: hung loads, offline, 1 MiB frames."""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import expect

from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events
from tests.ready import open_ready_session

from .conftest import snap
from .test_chat_page import TURN_END, assert_page_matches_log, open_page, send_prompt, stored

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

MIB = 1024 * 1024


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Limits")


async def test_a_hung_load_times_out_and_the_next_one_renders(page, hooks, session):
    await db_sync_to_async(append_events)(
        session.pk,
        [
            ("user_message", {"id": "x", "text": "before the hang"}),
            ("agent_message_chunk", {"content": {"type": "text", "text": "stored reply"}}),
            ("turn_end", {"stop_reason": "end_turn"}),
        ],
    )
    hooks.hook("configure/", hang_loads=1)
    await page.goto(f"{hooks.url}/sessions/{session.pk}/")
    banner = page.locator("#load-error")
    await expect(banner).to_contain_text("took too long", timeout=15000)
    await snap(page, "load-timed-out")
    await expect(banner).to_be_hidden(timeout=10000)
    await expect(page.locator("#transcript .msg.agent .bubble")).to_have_text("stored reply")
    assert hooks.loads(session.pk) == 2
    await send_prompt(page, "and live again")
    await expect(page.locator(TURN_END)).to_have_count(2)
    await assert_page_matches_log(page, session)


async def test_the_connection_indicator_says_connected_again_after_offline(
    page, craft_server, session
):
    await open_page(page, craft_server, session)
    indicator = page.locator("#conn")
    await page.context.set_offline(True)
    await expect(indicator).to_have_attribute("data-state", "offline")
    await expect(indicator).to_have_text("Offline")
    await snap(page, "offline")
    await page.context.set_offline(False)
    await expect(indicator).to_have_attribute("data-state", "connected")
    await expect(indicator).to_have_text("Connected")
    await send_prompt(page, "back online")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await assert_page_matches_log(page, session)


async def until(page, condition: str, timeout: float = 15) -> None:
    """Wait until `condition` (a JavaScript function) holds in the page. Not wait_for_function:
    Playwright builds a predicate that is not true at once with `new Function`, which the
    page's Content-Security-Policy refuses; evaluate goes through the debugging protocol."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await page.evaluate(condition):
        assert loop.time() < deadline, f"gave up waiting for {condition}"
        await asyncio.sleep(0.1)


async def test_the_banner_and_the_connection_indicator_stay_on_screen(page, hooks, session):
    chunk = {"content": {"type": "text", "text": "a line of a long conversation\n\n" * 20}}
    await db_sync_to_async(append_events)(
        session.pk,
        [("user_message", {"id": "u", "text": "talk a lot"})]
        + [("agent_message_chunk", chunk)] * 60,
    )
    await open_page(page, hooks, session)
    # Every event is on the page once open_page returns, but its Markdown may be rendered a
    # moment later (a busy machine): wait for the long page, never assume it.
    await until(page, "() => document.documentElement.scrollHeight > 5000")
    at_bottom = "() => innerHeight + scrollY >= document.documentElement.scrollHeight - 80"
    await until(page, at_bottom)  # a loaded page shows the latest
    # The person scrolls up (a scroll the page itself makes never stops its following).
    await page.mouse.move(700, 400)
    await page.mouse.wheel(0, -100000)
    jump = page.get_by_role("button", name="Jump to the latest")
    await expect(jump).to_be_visible()
    hooks.hook("configure/", fail_loads=3)  # about 2 s of failures, then it loads
    hooks.hook(f"drop/{session.pk}/")
    await expect(page.locator("#load-error")).to_be_visible()
    await page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight / 2)")
    for sticky in ("#conn", "#load-error"):
        box = await page.locator(sticky).bounding_box()
        assert box is not None and 0 <= box["y"] < 200, sticky
    await snap(page, "banner-in-a-long-session")
    await expect(page.locator("#load-error")).to_be_hidden()
    await jump.click()
    await expect(jump).to_be_hidden()
    await until(page, at_bottom)


async def test_a_3_mib_agent_message_arrives_whole_without_killing_the_socket(
    page, craft_server, session
):
    sockets = []
    page.on("websocket", lambda ws: sockets.append(ws))
    await open_page(page, craft_server, session)
    await send_prompt(page, "big 3")
    await expect(page.locator(TURN_END)).to_have_text("Done", timeout=30000)
    message = page.locator("#transcript .msg.agent")
    await expect(message).to_have_count(1)
    # Shown collapsed, so that 3 MiB do not make a page a mile long.
    assert await page.evaluate("document.documentElement.scrollHeight") < 5000
    await snap(page, "big-message")
    await message.get_by_role("button", name="Show all").click()
    text = await message.locator(".plain").evaluate("node => node.textContent")
    lines = text.splitlines()
    assert len(lines) == 3 * 16384
    assert lines[-1].startswith("00049152 Craft demo agent big payload")
    assert len(sockets) == 1, "the socket was closed and reopened"
    assert await page.locator("#load-error").is_hidden()
    await assert_page_matches_log(page, session)


async def test_a_2_mib_paste_is_refused_before_it_is_sent(page, craft_server, session):
    sockets = []
    page.on("websocket", lambda ws: sockets.append(ws))
    await open_page(page, craft_server, session)
    await page.evaluate(
        "size => { const box = document.getElementById('prompt');"
        " box.value = 'a'.repeat(size); box.focus(); }",
        2 * MIB,
    )
    await page.press("#prompt", "Enter")
    error = page.locator("#frame-error")
    await expect(error).to_contain_text("too long to send")
    await expect(error).to_have_attribute("role", "alert")
    assert await page.evaluate("document.getElementById('prompt').value.length") == 2 * MIB
    await snap(page, "paste-too-long")
    # Nothing was sent: the socket is the first one, and a normal prompt still works.
    await page.fill("#prompt", "a normal prompt")
    await page.press("#prompt", "Enter")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    assert [e.data["text"] for e in await stored(session) if e.kind == "user_message"] == [
        "a normal prompt"
    ]
    assert len(sockets) == 1
