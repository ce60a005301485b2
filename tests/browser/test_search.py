"""Search as a person uses it in Chromium: Ctrl+K from the home page finds a session by a word
of its conversation and opens it at that message; on a session's page, a match in that
session is jumped to; Esc closes the dialog. Real daphne, real demo agent, turns indexed as
they end. Screenshots: `search-<case>`."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from .conftest import assert_accessible, snap
from .test_chat_page import TURN_END, open_page
from .test_live_status import off_the_loop, socket_to

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def turns_elsewhere(server, user, session, prompts: list[str]) -> None:
    """Run the prompts in `session` from a socket outside the page."""
    socket = socket_to(server, user, session)
    socket.send({"type": "resume", "after": 0})
    for n, text in enumerate(prompts):
        socket.send({"type": "prompt", "id": f"q{n}", "text": text})
        socket.until_kind("turn_end")
    socket.close()


async def test_ctrl_k_finds_a_session_by_a_word_and_opens_it_at_that_message(
    page, craft_server, owner
):
    other = await db_sync_to_async(open_ready_session)(owner, "Zoo plans")
    prompts = [f"note number {n}" for n in range(40)]
    prompts[3] = "the narwhal enclosure needs a bigger pool"
    await off_the_loop(turns_elsewhere, craft_server, owner, other, prompts)
    await page.goto(f"{craft_server.url}/")
    await page.keyboard.press("Control+k")
    dialog = page.locator("#search-dialog")
    await expect(dialog).to_be_visible()
    await expect(page.locator("#search-input")).to_be_focused()
    await page.keyboard.type("narwh")
    results = page.locator("#search-results [role=option]")
    await expect(results).to_have_count(1)
    await expect(results.first.locator(".search-title")).to_have_text("Zoo plans")
    await expect(results.first.locator(".search-snippet mark").first).to_have_text("narwh")
    await expect(page.locator("#search-status")).to_have_text(
        "1 result. Arrow keys to choose, Enter to open."
    )
    await assert_accessible(page, "the search dialog")
    await snap(page, "search-home")
    await page.keyboard.press("Enter")
    await page.wait_for_url(f"**/sessions/{other.pk}/#event-*")
    message = page.locator("#transcript .msg.user").filter(has_text="the narwhal enclosure")
    await expect(message).to_be_in_viewport()
    await expect(message).to_be_focused()
    await snap(page, "search-opened-at-message")


async def test_on_a_session_page_its_own_match_is_jumped_to_and_esc_closes(
    page, craft_server, owner
):
    session = await db_sync_to_async(open_ready_session)(owner, "Long one")
    prompts = [f"filler message {n}" for n in range(40)]
    prompts[1] = "remember the pelican"
    await off_the_loop(turns_elsewhere, craft_server, owner, session, prompts)
    await open_page(page, craft_server, session)
    await expect(page.locator(TURN_END)).to_have_count(40)
    await page.get_by_role("button", name="Search").click()
    await page.locator("#search-input").fill("pelican")
    here = page.locator("#search-results [role=option][data-seq]")
    await expect(here).to_have_count(2)  # the prompt, and the demo agent's echo of it
    await expect(page.locator(".search-heading").first).to_have_text("In this session")
    await page.keyboard.press("ArrowDown")
    await expect(here.nth(1)).to_have_attribute("aria-selected", "true")
    await page.keyboard.press("Enter")
    await expect(page.locator("#search-dialog")).to_be_hidden()
    reply = page.locator("#transcript .msg.agent").filter(has_text="remember the pelican")
    await expect(reply).to_be_in_viewport()
    await expect(reply).to_be_focused()
    await snap(page, "search-in-session")
    await page.keyboard.press("Control+k")
    await page.locator("#search-input").fill("zzzz")
    await expect(page.locator("#search-status")).to_have_text("No matches.")
    await page.keyboard.press("Escape")
    await expect(page.locator("#search-dialog")).to_be_hidden()
