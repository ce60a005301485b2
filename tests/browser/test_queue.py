"""Talking while the agent works, in Chromium: the queue (send, edit, remove, send now, across a
reload and in a second tab), edit and resend, retry after an error, ↑ recall, copy.

Real server, real demo agent; what the page shows is checked against the stored log.
"""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from craft.models import Event
from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from .conftest import signed_in_page, snap
from .test_chat_page import open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

TURN_ENDS = "#transcript .turn-end"
QUEUED = "#queue-list li"


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Queue")


@db_sync_to_async
def prompts_run(session):
    return list(
        Event.objects.filter(session=session, kind="user_message")
        .order_by("seq")
        .values_list("data__text", flat=True)
    )


@db_sync_to_async
def stop_reasons(session):
    return list(
        Event.objects.filter(session=session, kind="turn_end")
        .order_by("seq")
        .values_list("data__stop_reason", flat=True)
    )


async def queued_texts(page):
    return await page.locator(f"{QUEUED} .queued-text").all_text_contents()


async def test_prompts_sent_during_a_turn_wait_can_be_changed_and_run_in_order(
    page, browser, craft_server, owner, session
):
    await open_page(page, craft_server, session)
    await send_prompt(page, "slow 300 0.05")
    await expect(page.locator("#stop")).to_be_visible()
    for text in ("first waiting", "second waiting", "third waiting"):
        await send_prompt(page, text)
        await expect(page.locator(f"{QUEUED} .queued-text", has_text=text)).to_be_visible()
        await expect(page.locator("#prompt")).to_have_value("")  # the box is free again
    await expect(page.locator("#queue-count")).to_have_text("3 messages wait")
    await snap(page, "queue-three-waiting")

    # A reload, and a second tab, show the same queue.
    await page.reload()
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    await expect(page.locator(QUEUED)).to_have_count(3)
    other = await signed_in_page(browser, craft_server, owner)
    await open_page(other, craft_server, session)
    assert await queued_texts(other) == ["first waiting", "second waiting", "third waiting"]

    # Edit the first in this tab; remove the second in the other one.
    first = page.locator(QUEUED).nth(0)
    await first.get_by_role("button", name="Edit: first waiting").click()
    box = first.locator("textarea")
    await expect(box).to_be_focused()
    await box.fill("first, edited")
    await snap(page, "queue-editing")
    await box.press("Enter")
    await other.get_by_role("button", name="Remove: second waiting").click()
    await expect(page.locator(QUEUED)).to_have_count(2)
    assert await queued_texts(page) == ["first, edited", "third waiting"]
    await expect(other.locator(f"{QUEUED} .queued-text")).to_have_text(
        ["first, edited", "third waiting"]
    )

    await page.click("#stop")
    await expect(page.locator(TURN_ENDS)).to_have_count(3, timeout=60000)
    await expect(page.locator("#queue")).to_be_hidden()
    await expect(other.locator(TURN_ENDS)).to_have_count(3)
    assert await prompts_run(session) == ["slow 300 0.05", "first, edited", "third waiting"]
    assert await stop_reasons(session) == ["cancelled", "end_turn", "end_turn"]
    user_texts = await page.locator("#transcript .msg.user .bubble").all_text_contents()
    assert [t.strip() for t in user_texts] == await prompts_run(session)
    await other.context.close()


async def test_send_now_stops_the_turn_and_sends_that_message_next(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "slow 300 0.05")
    await expect(page.locator("#stop")).to_be_visible()
    await send_prompt(page, "later")
    await send_prompt(page, "steer this way")
    await expect(page.locator(QUEUED)).to_have_count(2)
    await page.get_by_role("button", name="Send now: steer this way").click()
    await expect(page.locator(TURN_ENDS)).to_have_count(3, timeout=60000)
    assert await prompts_run(session) == ["slow 300 0.05", "steer this way", "later"]
    assert (await stop_reasons(session))[0] == "cancelled"
    await snap(page, "queue-steered")


async def test_edit_resends_a_prompt_in_a_fork_or_as_a_new_turn_and_history_stays(
    page, craft_server, session
):
    await open_page(page, craft_server, session)
    await send_prompt(page, "hello there")
    await expect(page.locator(TURN_ENDS)).to_have_count(1)
    edit = "Edit and send again: a fork of this session from just before this message"
    # Sent as a new message in this session when the person says so.
    await page.get_by_role("button", name=edit).click()
    await expect(page.locator("#prompt")).to_have_value("hello there")
    await expect(page.locator("#prompt")).to_be_focused()
    await page.get_by_role("button", name="Send as a new message instead").click()
    await page.keyboard.type(", again")
    await page.keyboard.press("Enter")
    await expect(page.locator(TURN_ENDS)).to_have_count(2)
    assert await prompts_run(session) == ["hello there", "hello there, again"]
    bubbles = page.locator("#transcript .msg.agent .bubble")
    await expect(bubbles.nth(1)).to_contain_text("Echo: hello there, again")
    # Else a fork from just before the message, with the edited text (tests/browser/
    # test_going_back.py); this session's history stays as it is.
    await page.get_by_role("button", name=edit).first.click()
    await page.keyboard.type(", in a fork")
    await page.keyboard.press("Enter")
    await page.wait_for_url(lambda url: str(session.pk) not in url)
    await expect(page.locator(TURN_ENDS)).to_have_count(1)
    await expect(bubbles.last).to_contain_text("Echo: hello there, in a fork")
    assert await prompts_run(session) == ["hello there", "hello there, again"]


async def test_retry_after_an_error_sends_the_same_message_again(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "fail")
    retry = page.locator(f"{TURN_ENDS} .turn-retry")
    await expect(retry).to_be_visible()
    await snap(page, "retry-after-error")
    await retry.click()
    await expect(page.locator(TURN_ENDS)).to_have_count(2)
    assert await prompts_run(session) == ["fail", "fail"]
    # A turn that ended well offers no retry.
    await send_prompt(page, "hello")
    await expect(page.locator(TURN_ENDS)).to_have_count(3)
    await expect(page.locator(f"{TURN_ENDS} .turn-retry")).to_have_count(2)


async def test_arrow_up_recalls_earlier_prompts_and_down_gives_back_the_draft(
    page, craft_server, session
):
    await open_page(page, craft_server, session)
    for text in ("one", "two"):
        await send_prompt(page, text)
        await expect(page.locator(f"{TURN_ENDS}")).to_have_count(1 if text == "one" else 2)
    await page.fill("#prompt", "")
    await page.focus("#prompt")
    await page.keyboard.press("ArrowUp")
    await expect(page.locator("#prompt")).to_have_value("two")
    await page.keyboard.press("ArrowUp")
    await expect(page.locator("#prompt")).to_have_value("one")
    await page.keyboard.press("ArrowUp")  # the oldest: stays
    await expect(page.locator("#prompt")).to_have_value("one")
    await page.keyboard.press("End")
    await page.keyboard.press("ArrowDown")
    await expect(page.locator("#prompt")).to_have_value("two")
    await page.keyboard.press("ArrowDown")
    await expect(page.locator("#prompt")).to_have_value("")


async def test_copy_puts_a_whole_message_on_the_clipboard(page, craft_server, session):
    await page.context.grant_permissions(
        ["clipboard-read", "clipboard-write"], origin=craft_server.url
    )
    await open_page(page, craft_server, session)
    await send_prompt(page, "count 3")
    await expect(page.locator(TURN_ENDS)).to_have_count(1)
    await page.get_by_role("button", name="Copy the agent's message").click()
    await expect(page.get_by_role("button", name="Copy the agent's message")).to_have_text("Copied")
    assert await page.evaluate("navigator.clipboard.readText()") == "1\n2\n3\n"
    await page.get_by_role("button", name="Copy your message").click()
    assert await page.evaluate("navigator.clipboard.readText()") == "count 3"
