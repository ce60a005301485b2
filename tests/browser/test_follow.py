"""The page follows the agent: the newest event stays in view unless the person scrolled up,
their own message and an open permission request always come into view, and an open request
stays reachable from beside the composer however long the turn. Real daphne, real Chromium,
the real demo agent."""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import expect

from tests.ready import open_ready_session

from .conftest import DESKTOP, snap
from .test_chat_page import TURN_END, open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

PERMISSION = "#transcript .permission"
# Whether the last element matching the selector is wholly in the part of the window that is
# not covered: below the session's sticky head, above the composer.
IN_VIEW = """(selector) => {
  const nodes = document.querySelectorAll(selector);
  const node = nodes[nodes.length - 1];
  if (!node) return false;
  const box = node.getBoundingClientRect();
  const top = document.querySelector(".session-head").getBoundingClientRect().bottom;
  const bottom = document.getElementById("composer").getBoundingClientRect().top;
  return box.height > 0 && box.top >= top - 1 && box.bottom <= bottom + 1;
}"""
SCROLLED = """() => `scrolled to ${scrollY} of ${
  document.documentElement.scrollHeight - innerHeight}`"""
# Whether the element of the first selector lies within the element of the second.
INSIDE = """([inner, outer]) => {
  const a = document.querySelector(inner).getBoundingClientRect();
  const b = document.querySelector(outer).getBoundingClientRect();
  return a.width > 0 && a.left >= b.left && a.right <= b.right
    && a.top >= b.top && a.bottom <= b.bottom;
}"""


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Following")


async def until(page, condition: str, arg: object = None, timeout: float = 10) -> None:
    """Wait until `condition` (a JavaScript function of `arg`) holds in the page (polled through
    evaluate: the page's policy refuses wait_for_function's predicates)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await page.evaluate(condition, arg):
        if loop.time() > deadline:
            where = await page.evaluate(SCROLLED)
            raise AssertionError(f"gave up waiting for {condition} ({arg}); {where}")
        await asyncio.sleep(0.1)


async def in_view(page, selector: str) -> bool:
    return await page.evaluate(IN_VIEW, selector)


async def test_twelve_long_messages_keep_the_latest_in_view(page, craft_server, session):
    await page.set_viewport_size(DESKTOP)
    await open_page(page, craft_server, session)
    for i in range(1, 13):
        words = " ".join(f"word{i}-{w}" for w in range(40))
        await send_prompt(page, f"message {i} {words}")
        await expect(page.locator(TURN_END)).to_have_count(i)
        await until(page, IN_VIEW, TURN_END)
        await expect(page.get_by_role("button", name="Jump to the latest")).to_be_hidden()
    await snap(page, "follow-twelve-messages")


async def test_the_permission_the_agent_waits_on_is_in_view(page, craft_server, session):
    await page.set_viewport_size(DESKTOP)
    await open_page(page, craft_server, session)
    hello = " ".join(["hello"] * 200)
    for round in range(3):
        await send_prompt(page, hello)
        await expect(page.locator(TURN_END)).to_have_count(3 * round + 1)
        await send_prompt(page, hello)
        await expect(page.locator(TURN_END)).to_have_count(3 * round + 2)
        await send_prompt(page, "demo")
        card = page.locator(PERMISSION).nth(round)
        await expect(card.get_by_role("button", name="Allow")).to_be_visible()
        await until(page, IN_VIEW, f"{PERMISSION} .options")
        if round == 0:
            await snap(page, "follow-permission-in-view")
        await card.get_by_role("button", name="Allow").click()
        await expect(page.locator(TURN_END)).to_have_count(3 * round + 3)


async def test_an_open_permission_stays_reachable_from_beside_the_composer(
    page, craft_server, session
):
    await page.set_viewport_size(DESKTOP)
    await open_page(page, craft_server, session)
    hello = " ".join(["hello"] * 200)
    for i in (1, 2):
        await send_prompt(page, hello)
        await expect(page.locator(TURN_END)).to_have_count(i)
    await send_prompt(page, "demo 0.05")
    card = page.locator(PERMISSION)
    allow = card.get_by_role("button", name="Allow")
    await expect(allow).to_be_visible()
    pin = page.locator("#permission-pin")
    await expect(pin).to_have_text("The agent asks: Write hello.txt — Review")

    # The person scrolls up to read what came before: the card leaves the screen, the pin
    # and the way back to the latest stay, beside the composer, over nothing of the transcript.
    await page.mouse.move(800, 450)
    await page.mouse.wheel(0, -4000)
    await until(page, "() => scrollY < 100")
    assert not await in_view(page, f"{PERMISSION} .options")
    jump = page.get_by_role("button", name="Jump to the latest")
    await expect(jump).to_be_visible()
    for element in ("#permission-pin", "#jump"):
        assert await page.evaluate(INSIDE, [element, "#composer"]), element
    await snap(page, "follow-permission-pinned")

    # The keyboard reaches the card through the pin, and answers it there.
    await pin.focus()
    await page.keyboard.press("Enter")
    await until(page, IN_VIEW, f"{PERMISSION} .options")
    await expect(allow).to_be_focused()
    await snap(page, "follow-permission-revealed")
    await page.keyboard.press("Enter")
    await expect(pin).to_be_hidden()
    await expect(page.locator(TURN_END)).to_have_count(3)
    await until(page, IN_VIEW, TURN_END)  # following again
    await expect(jump).to_be_hidden()
