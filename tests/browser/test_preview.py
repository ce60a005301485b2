"""The Preview tab in Chromium, as root with sandbox users, the jail and the sandbox's network:
the demo agent starts an app, the tab offers its port, the frame shows the page through the
preview origin and its websocket answers through the proxy; "Open in new tab" opens it in a
tab of its own; the app killed, the tab says so and the frame shows the proxy's page. Without
a preview origin the tab says previews are off. Screenshots of each state at 1440 by 900 and
390 by 844.
"""

from __future__ import annotations

import pytest
import pytest_asyncio
from playwright.async_api import expect

from craft.storage.db import db_sync_to_async
from tests.ports import free_port
from tests.ready import open_ready_session
from tests.sandboxes.hostile import contain, needs_root

from ..craft.preview.test_preview import _kill_app
from ..server import Daphne
from .conftest import OUTPUT, LiveServer, assert_accessible, signed_in_page, snap
from .test_chat_page import TURN_END, open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

APP = "#preview-frame"


@pytest.fixture
def preview_server(settings, machine, uid_base):
    """The app as `make run` serves it as root (sandbox users, the jail, the sandbox's own
    network, its budget), with previews on the server's second port."""
    contain(settings, "on")
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent"]
    preview_port = free_port()
    origin = f"http://{{port}}-{{session}}.localhost:{preview_port}"
    settings.CRAFT_PREVIEW_ORIGIN = origin
    server = Daphne(
        OUTPUT,
        app="tests.browser.faults:application",
        options=("-e", f"tcp:port={preview_port}:interface=127.0.0.1"),
        CRAFT_SHUTDOWN_GRACE_SECONDS="2",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        CRAFT_SANDBOX_UIDS="on",
        CRAFT_SANDBOX_ROOT=str(settings.CRAFT_SANDBOX_ROOT),
        CRAFT_SANDBOX_UID_BASE=str(uid_base),
        CRAFT_SANDBOX_UID_COUNT="1000",
        CRAFT_AGENT_COMMAND="craft-demo-agent",
        CRAFT_PREVIEW_ORIGIN=origin,
    ).start()
    assert server.process is not None
    yield LiveServer(server.url, server.process, server.log)
    server.terminate(timeout=60)


@pytest_asyncio.fixture
async def preview_page(browser, preview_server, owner):
    page = await signed_in_page(browser, preview_server, owner)
    yield page
    await page.context.close()


async def open_preview_tab(page) -> None:
    await page.click("#workspace-toggle")
    await page.click("#tab-preview")
    await expect(page.locator("#panel-preview")).to_be_visible()


@needs_root
async def test_the_agents_app_is_previewed_with_its_websocket_and_opened_in_a_tab(
    preview_page, preview_server, owner
):
    page = preview_page
    session = await db_sync_to_async(open_ready_session)(owner, "Preview")
    await open_page(page, preview_server, session)
    await open_preview_tab(page)
    state = page.locator("#preview-state")
    await expect(state).to_contain_text("Nothing listens in the sandbox yet")
    await expect(page.locator(APP)).to_be_hidden()
    await snap(page, "preview-nothing-listens")

    await send_prompt(page, "serve 8080")
    await expect(page.locator(TURN_END)).to_have_count(1)
    # The turn's end refreshes the ports: the app's is offered and shown at once.
    await expect(page.locator("#preview-port")).to_have_value("8080")
    app = page.frame_locator(APP)
    await expect(app.locator("h1")).to_have_text("Demo app on port 8080")
    # Its websocket, through the proxy, from the preview origin.
    await expect(app.locator("#echo")).to_have_text("echo: hello over the websocket")
    source = await page.locator(APP).get_attribute("src")
    assert source.startswith(f"http://8080-{session.pk.hex}.localhost:")
    await assert_accessible(page, "the Preview tab showing an app")
    await snap(page, "preview-app")

    # Reload: the app again, with a fresh link.
    await page.click("#preview-reload")
    await expect(app.locator("#echo")).to_have_text("echo: hello over the websocket")

    # A tab of its own: a link of its own, the app there too, and no way back to Craft's page.
    async with page.context.expect_page() as opened:
        await page.click("#preview-open")
    tab = await opened.value
    await expect(tab.locator("h1")).to_have_text("Demo app on port 8080")
    await expect(tab.locator("#echo")).to_have_text("echo: hello over the websocket")
    assert await tab.evaluate("window.opener") is None
    await tab.close()

    # The app goes away: the tab says so, and the frame shows the proxy's page naming the port.
    await db_sync_to_async(_kill_app)(session)
    await page.click("#preview-refresh")
    await expect(state).to_contain_text("The app on port 8080 is down")
    await page.click("#preview-reload")
    await expect(app.locator("h1")).to_have_text("Preview of port 8080")
    await expect(app.locator("p")).to_contain_text("Nothing answers on port 8080")
    await snap(page, "preview-app-down")


async def test_without_a_preview_origin_the_tab_says_previews_are_off(page, craft_server, owner):
    session = await db_sync_to_async(open_ready_session)(owner, "No previews")
    await open_page(page, craft_server, session)
    await open_preview_tab(page)
    await expect(page.locator("#preview-state")).to_contain_text("Previews are off")
    await expect(page.locator("#preview-port")).to_be_disabled()
    await expect(page.locator("#preview-reload")).to_be_disabled()
    await assert_accessible(page, "the Preview tab with previews off")
    await snap(page, "preview-off")


POST_LINK = """async ([url, port]) => {
    const token = document.querySelector("input[name=csrfmiddlewaretoken]").value;
    const response = await fetch(url, {method: "POST", credentials: "same-origin",
        headers: {"Content-Type": "application/json", "X-CSRFToken": token},
        body: JSON.stringify({port})});
    return [response.status, await response.json()];
}"""


@needs_root
async def test_a_preview_is_refused_without_its_token_to_another_user_and_on_crafts_origin(
    browser, preview_page, preview_server, owner, stranger
):
    page = preview_page
    session = await db_sync_to_async(open_ready_session)(owner, "Preview")
    await open_page(page, preview_server, session)
    await send_prompt(page, "serve 8080")
    await expect(page.locator(TURN_END)).to_have_count(1)
    api = f"{preview_server.url}/api/sessions/{session.pk}/preview/"
    status, given = await page.evaluate(POST_LINK, [api, 8080])
    assert status == 200, given
    app_origin = given["origin"]

    # Without the token: a browser that never had the link gets the page saying where to go.
    elsewhere = await browser.new_context()
    try:
        other = await elsewhere.new_page()
        answer = await other.goto(f"{app_origin}/")
        assert answer is not None and answer.status == 403
        await expect(other.locator("p")).to_contain_text("Open this preview from Craft")
        await snap(other, "preview-refused")
    finally:
        await elsewhere.close()

    # Another user: no link to someone else's session, and no preview without one.
    theirs = await signed_in_page(browser, preview_server, stranger)
    try:
        their_session = await db_sync_to_async(open_ready_session)(stranger, "Theirs")
        await open_page(theirs, preview_server, their_session)
        status, refused = await theirs.evaluate(POST_LINK, [api, 8080])
        assert status == 404, refused
        answer = await theirs.goto(f"{app_origin}/")
        assert answer is not None and answer.status == 403
    finally:
        await theirs.context.close()

    # Craft's own origin serves none of it; a preview host serves nothing of Craft.
    craft_entry = given["url"].replace(app_origin, preview_server.url)
    answer = await page.goto(craft_entry)
    assert answer is not None and answer.status == 404
    answer = await page.goto(f"{app_origin}/sessions/{session.pk}/")
    assert answer is not None and answer.status == 403
    await expect(page.locator("h1")).to_have_text("Preview of port 8080")


@needs_root
async def test_the_frame_works_where_third_party_cookies_are_blocked(preview_server, owner):
    """The frame's cookie is partitioned (CHIPS): Chromium keeps it for Craft's site even with
    third-party cookies blocked, as Chrome's phase-out blocks them."""
    from playwright.async_api import async_playwright

    from .conftest import CHROMIUM, CHROMIUM_ARGS

    async with async_playwright() as playwright:
        strict = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[*CHROMIUM_ARGS, "--test-third-party-cookie-phaseout"],
        )
        try:
            page = await signed_in_page(strict, preview_server, owner)
            session = await db_sync_to_async(open_ready_session)(owner, "Strict")
            await open_page(page, preview_server, session)
            await send_prompt(page, "serve 8080")
            await expect(page.locator(TURN_END)).to_have_count(1)
            await open_preview_tab(page)
            app = page.frame_locator(APP)
            await expect(app.locator("#echo")).to_have_text("echo: hello over the websocket")
        finally:
            await strict.close()
