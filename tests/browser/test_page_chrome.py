"""Everything around the transcript: titles, keys, focus, the sidebar, accessibility."""

from __future__ import annotations

import asyncio
import re

import pytest
from playwright.async_api import expect

from craft.models import Session
from craft.storage.db import db_sync_to_async
from sandboxes.models import Sandbox
from sandboxes.services import terminate_sandbox
from tests.ready import open_ready_session

from ..conftest import PASSWORD
from .conftest import assert_accessible, screenshot_path, signed_in_page, snap
from .test_chat_page import TURN_END, open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Chrome")


async def test_the_first_prompt_titles_a_new_session_everywhere(page, craft_server, owner):
    session = await db_sync_to_async(open_ready_session)(owner)
    await open_page(page, craft_server, session)
    await expect(page.locator("#session-title")).to_have_text("New session")
    await send_prompt(page, "Fix the flaky login test")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await expect(page.locator("#session-title")).to_contain_text("Fix the flaky login test")
    await expect(page).to_have_title("Fix the flaky login test · Craft")
    await expect(page.locator(f"#session-{session.pk} .session-link")).to_contain_text(
        "Fix the flaky login test"
    )


async def test_a_rename_updates_every_open_page_at_once(
    page, browser, craft_server, owner, session
):
    other = await signed_in_page(browser, craft_server, owner)
    try:
        await open_page(page, craft_server, session)
        await open_page(other, craft_server, session)
        item = page.locator(f"#session-{session.pk}")
        await item.locator("summary").click()
        await item.locator("input[name=title]").fill("Release checklist")
        await item.get_by_role("button", name="Rename").click()
        for tab in (page, other):
            await expect(tab.locator("#session-title")).to_have_text("Release checklist")
            await expect(tab).to_have_title("Release checklist · Craft")
            await expect(tab.locator(f"#session-{session.pk} .session-link")).to_have_text(
                "Release checklist"
            )
        await expect(page.locator(f"#session-{session.pk} .session-link")).to_be_focused()
    finally:
        await other.context.close()


async def test_a_blank_rename_says_why_it_was_refused(page, craft_server, session):
    await open_page(page, craft_server, session)
    item = page.locator(f"#session-{session.pk}")
    await item.locator("summary").click()
    await item.locator("input[name=title]").fill("   ")
    await item.get_by_role("button", name="Rename").click()
    error = page.locator(f"#session-{session.pk} .form-error")
    await expect(error).to_have_text("Give the session a title: it cannot be blank.")
    await expect(error).to_have_attribute("role", "alert")
    await expect(page.locator(f"#session-{session.pk} input[name=title]")).to_be_focused()
    await expect(page.locator("#session-title")).to_have_text("Chrome")
    await snap(page, "blank-rename")


async def test_escape_stops_the_agent(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "slow 300 0.05")
    await expect(page.locator("#transcript .msg.agent")).to_contain_text("chunk 3 ")
    await expect(page.locator("#working")).to_contain_text("Working…")
    await expect(page.locator("#favicon")).to_have_attribute("href", re.compile("favicon-busy"))
    await snap(page, "working")
    await page.keyboard.press("Escape")
    await expect(page.locator(TURN_END)).to_have_text("Stopped")
    await expect(page.locator("#working")).to_be_hidden()
    await expect(page.locator("#stop")).to_be_hidden()
    await expect(page.locator("#favicon")).not_to_have_attribute("href", re.compile("busy"))


async def test_the_keyboard_stays_on_a_permission_card_after_answering(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "write kept.txt focus")
    allow = page.locator("#transcript .permission").get_by_role("button", name="Allow")
    await allow.focus()
    await page.keyboard.press("Enter")
    answer = page.locator("#transcript .permission .permission-answer")
    await expect(answer).to_be_focused()
    await expect(answer).to_have_text("You allowed this once (Allow)")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await expect(answer).to_be_focused()


async def test_an_idle_page_does_not_poll(page, craft_server, session):
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    await open_page(page, craft_server, session)
    await asyncio.sleep(4)
    polled = [url for url in requests if "/sandbox/status/" in url or "/sessions/list/" in url]
    assert polled == []


async def test_the_sandbox_line_follows_the_session_to_its_new_sandbox(page, craft_server, session):
    # Once the session has moved to a new sandbox, the sidebar's line is about that one: its
    # later changes (here: stopped again) must reach the line too, not only the banner.
    await db_sync_to_async(terminate_sandbox)(session.sandbox)
    await page.goto(f"{craft_server.url}/sessions/{session.pk}/")
    line = page.locator("#sandbox-status .sandbox-state")
    await expect(line).to_have_text("Stopped")
    await send_prompt(page, "hello again")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await expect(line).to_have_text("Ready")
    # Stopped through the server (its notice reaches the page's socket), as a person would.
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    stopped = await page.request.delete(
        f"{craft_server.url}/api/sandbox/", headers={"X-CSRFToken": cookies["csrftoken"]}
    )
    assert stopped.ok, await stopped.text()
    await expect(page.locator("#sandbox-banner")).to_contain_text("sandbox was stopped")
    await expect(line).to_have_text("Stopped")


async def test_a_stopped_sandbox_s_session_carries_on_at_the_next_message(
    page, craft_server, session, owner
):
    await db_sync_to_async(terminate_sandbox)(session.sandbox)
    await page.goto(f"{craft_server.url}/sessions/{session.pk}/")
    banner = page.locator("#sandbox-banner")
    await expect(banner).to_contain_text("sandbox was stopped. Send a message to carry on")
    await expect(banner.get_by_role("button", name="Start again")).to_be_hidden()
    await expect(page.locator("#prompt")).to_be_enabled()
    await expect(page.locator("#sandbox-status .sandbox-state")).to_have_text("Stopped")
    await snap(page, "sandbox-stopped")
    await send_prompt(page, "hello again")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await expect(page).to_have_url(f"{craft_server.url}/sessions/{session.pk}/")
    await expect(page.locator("#sandbox-status .sandbox-state")).to_have_text("Ready")
    await expect(banner).to_be_hidden()
    live = await db_sync_to_async(lambda: list(Sandbox.objects.live().filter(owner=owner)))()
    assert len(live) == 1 and live[0].pk != session.sandbox_id
    moved = await db_sync_to_async(lambda: Session.objects.get(pk=session.pk).sandbox_id)()
    assert moved == live[0].pk


async def test_the_skip_link_and_the_phone_menu_work_from_the_keyboard(page, craft_server, session):
    await page.goto(f"{craft_server.url}/")
    await page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to the main content")
    await expect(skip).to_be_focused()
    await expect(skip).to_be_in_viewport()
    await open_page(page, craft_server, session)
    await page.set_viewport_size({"width": 390, "height": 844})
    toggle = page.get_by_role("button", name="Sessions")
    await expect(toggle).to_have_attribute("aria-expanded", "false")
    await toggle.click()
    await expect(toggle).to_have_attribute("aria-expanded", "true")
    await expect(page.locator("#sidebar")).to_be_visible()
    await expect(page.locator(f"#session-{session.pk} .session-link")).to_have_attribute(
        "aria-current", "page"
    )
    await page.screenshot(path=screenshot_path("sidebar-open-phone.png"))


async def test_dark_mode_follows_the_system(page, craft_server, session):
    await page.emulate_media(color_scheme="dark")
    await open_page(page, craft_server, session)
    await send_prompt(page, "demo 0")
    await expect(page.locator("#transcript .permission")).to_be_visible()
    background = await page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(15, 19, 26)"
    await snap(page, "dark-permission")
    await assert_accessible(page, "dark session page")


async def test_no_serious_accessibility_violations(page, staff_page, craft_server, session):
    anonymous = await page.context.browser.new_context()
    try:
        login = await anonymous.new_page()
        await login.goto(f"{craft_server.url}/accounts/login/")
        await assert_accessible(login, "login page")
        await snap(login, "login")
    finally:
        await anonymous.close()

    await page.goto(f"{craft_server.url}/")
    await assert_accessible(page, "home page")
    await snap(page, "home")

    # A session mid-turn, with an open permission card and a plan.
    await open_page(page, craft_server, session)
    await send_prompt(page, "demo 0")
    await expect(page.locator("#transcript .permission .options button")).to_have_count(2)
    await expect(page.locator("#working")).to_be_visible()
    await assert_accessible(page, "session page")
    # Streamed words are not read out one by one: the transcript is no live region; a polite
    # one says what changed, and errors are alerts.
    assert await page.locator("#transcript").get_attribute("aria-live") is None
    await expect(page.locator("#announcer")).to_have_attribute("aria-live", "polite")
    await expect(page.locator("#announcer")).to_have_text(re.compile("permission"))
    for alert in ("#load-error", "#frame-error"):
        await expect(page.locator(alert)).to_have_attribute("role", "alert")
    await snap(page, "session-mid-turn")

    await staff_page.goto(f"{craft_server.url}/admin/sandboxes/sandbox/")
    await expect(staff_page.locator("#result_list")).to_be_visible()
    await assert_accessible(staff_page, "admin inventory")
    await snap(staff_page, "admin-inventory")


async def test_signing_in_and_the_admin_work_under_the_policy(browser, craft_server, staff):
    context = await browser.new_context()
    try:
        page = await context.new_page()
        page.set_default_timeout(15000)
        response = await page.goto(f"{craft_server.url}/accounts/login/")
        assert "script-src 'self';" in response.headers["content-security-policy"]
        await page.locator("#id_username").fill("stella")
        await page.locator("#id_password").fill(PASSWORD)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("heading", name="Welcome to Craft")).to_be_visible()
        # A change form of the admin, with its scripts, and a save.
        await page.goto(f"{craft_server.url}/admin/auth/user/{staff.pk}/change/")
        await page.get_by_role("button", name="Save and continue editing").click()
        await expect(page.locator(".messagelist .success")).to_be_visible()
    finally:
        await context.close()


async def test_a_policy_violation_would_fail_the_test(page, craft_server, csp_violations):
    """The watch of tests/browser/conftest.py sees what the policy refuses."""
    await page.goto(f"{craft_server.url}/")
    await page.evaluate(
        """() => {
            const script = document.createElement("script");
            script.textContent = "window.injected = true";
            document.head.append(script);
            const div = document.createElement("div");
            div.setAttribute("style", "color: red");
            document.body.append(div);
        }"""
    )
    for _ in range(300):  # the reports arrive asynchronously: wait for them
        if len(csp_violations) >= 2:
            break
        await asyncio.sleep(0.05)
    assert await page.evaluate("window.injected") is None  # refused, not run
    assert any("script-src" in v for v in csp_violations), csp_violations
    assert any("style-src" in v for v in csp_violations), csp_violations
    csp_violations.clear()  # seen on purpose: the test itself passes
