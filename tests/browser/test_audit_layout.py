"""Layout the audit found broken (issue 46's bugs 6 and 7), at the sizes people use: a short
title beside the open Files panel on a laptop, and the bar, the drawer and the Stop button on
a phone. Screenshots: `audit-<case>`."""

from __future__ import annotations

import pytest
import pytest_asyncio
from playwright.async_api import expect

from craft.models import Session
from craft.storage.db import db_sync_to_async
from tests.catalog import catalog, catalog_toml
from tests.craft.wsclient import session_cookie
from tests.ready import open_ready_session

from .conftest import DESKTOP, PHONE, serve, signed_in_page, snap
from .test_chat_page import open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

CUT = "el => el.scrollWidth > el.clientWidth"  # text cut off (an ellipsis, or hidden)


@pytest.fixture(scope="module")
def craft_server(django_db_setup, tmp_path_factory):
    """A server offering two agents, as most do: the session's head names its agent too."""
    folder = tmp_path_factory.mktemp("audit")
    (folder / "agents.toml").write_text(catalog_toml())
    with serve({"CRAFT_AGENTS_FILE": str(folder / "agents.toml")}, folder / "sandboxes") as server:
        yield server


@pytest.fixture(autouse=True)
def agents(settings):
    settings.CRAFT_AGENTS = catalog()


@pytest_asyncio.fixture
async def page(browser, craft_server, owner):
    page = await signed_in_page(browser, craft_server, owner)
    yield page
    await page.context.close()


async def session_cookies(server, user) -> list[dict]:
    cookie = (await db_sync_to_async(session_cookie)(user)).split("=", 1)[1]
    return [{"name": "sessionid", "value": cookie, "url": server.url}]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "demo")


async def test_a_short_title_is_whole_beside_the_open_files_panel(page, craft_server, session):
    await page.set_viewport_size(DESKTOP)
    await open_page(page, craft_server, session)
    title = page.locator("#session-title")
    await expect(title).to_have_text("demo")
    await page.click("#workspace-toggle")
    await expect(page.locator("#panel-files")).to_be_visible()
    # While the agent works, the head holds the most (its time, Stop in the composer).
    await send_prompt(page, "slow 600 0.05")
    await expect(page.locator("#working")).to_be_visible()
    await expect(page.locator("#session-agent")).to_have_text("Demo agent")
    await page.evaluate("document.getElementById('notify-toggle').hidden = false")
    assert not await title.evaluate(CUT)
    box = await title.bounding_box()
    assert box is not None and box["width"] >= 40
    await snap(page, "audit-short-title-with-files")
    # A long one is cut with an ellipsis, whole in its tooltip... of the page's title.
    await db_sync_to_async(Session.objects.filter(pk=session.pk).update)(title="x" * 200)
    await page.reload()
    await page.click("#workspace-toggle")
    await expect(page.locator("#panel-files")).to_be_visible()
    box = await title.bounding_box()
    assert box is not None and box["width"] >= 40


async def test_on_a_phone_the_bar_fits_the_drawer_closes_and_stop_has_no_key_hint(
    browser, craft_server, staff
):
    # An administrator's bar has the most in it (Admin too).
    session = await db_sync_to_async(open_ready_session)(staff, "demo")
    context = await browser.new_context(
        viewport=PHONE, has_touch=True, is_mobile=True, device_scale_factor=2
    )
    await context.add_cookies(await session_cookies(craft_server, staff))
    page = await context.new_page()
    try:
        await open_page(page, craft_server, session)
        await expect(page.locator(".topbar").get_by_role("link", name="Admin")).to_be_visible()
        # Each of the bar's links and buttons inside it, on one line.
        outside = await page.evaluate(
            """() => {
                const bar = document.querySelector(".topbar").getBoundingClientRect();
                return [...document.querySelectorAll(".topbar a, .topbar button")]
                    .filter((el) => el.offsetParent !== null)
                    .filter((el) => {
                        const box = el.getBoundingClientRect();
                        return box.left < bar.left || box.right > bar.right || box.top < bar.top
                            || box.bottom > bar.bottom || el.getClientRects().length > 1
                            || box.height > 40;
                    })
                    .map((el) => el.textContent.trim());
            }"""
        )
        assert outside == []
        await snap(page, "audit-phone-bar")
        # The drawer: opened by its button, closed by its own Close button and by Esc.
        toggle = page.get_by_role("button", name="☰ Sessions")
        sidebar = page.locator("#sidebar")
        await toggle.click()
        await expect(sidebar).to_be_visible()
        await expect(toggle).to_have_attribute("aria-expanded", "true")
        await snap(page, "audit-phone-drawer")
        await sidebar.get_by_role("button", name="Close the list").click()
        await expect(sidebar).to_be_hidden()
        await expect(toggle).to_have_attribute("aria-expanded", "false")
        await expect(toggle).to_be_focused()
        await toggle.click()
        await expect(sidebar).to_be_visible()
        await page.keyboard.press("Escape")
        await expect(sidebar).to_be_hidden()
        # A touch screen has no Esc key: Stop says nothing of it.
        await send_prompt(page, "slow 600 0.05")
        stop = page.locator("#stop")
        await expect(stop).to_be_visible()
        await expect(stop).to_have_text("Stop", use_inner_text=True)
        shown = "el => el.checkVisibility() ? el.innerText : ''"  # what is on the screen
        assert "Esc" not in await page.locator("#composer-hint").evaluate(shown)
        await snap(page, "audit-phone-stop")
    finally:
        await context.close()
