"""The Terminal tab as a person uses it in Chromium, against daphne as root with sandbox users:
a shell that runs `id` as the sandbox's user, survives a dropped socket (back to the same shell,
its scrollback kept), attaches its selected text to the message, and dies with the sandbox;
another person's page cannot open it.
The page keeps its Content-Security-Policy throughout (the browser fixture fails on any
violation), and the screenshots are of each new state, on a laptop and on a phone."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
from playwright.async_api import expect

from sandboxes.backends import budget, firewall, network

from ..craft.live.test_live_status import admin_terminate
from ..craft.live.test_terminal_socket import open_session
from .conftest import assert_accessible, serve, signed_in_page, snap
from .test_live_status import off_the_loop

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="sandbox users need root"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
]

SCREEN = "#terminal-screens .terminal-screen:not([hidden]) .xterm-rows"


@pytest.fixture(scope="module")
def craft_server(django_db_setup, tmp_path_factory):
    """The app as `make run` as root has it: sandbox users, their jail, network and budget."""
    place = Path(tempfile.mkdtemp(prefix="craft-containment-"))
    place.chmod(0o755)
    base = secrets.randbelow(1000) * 1000 + 1_100_000_000
    uids = {
        "CRAFT_SANDBOX_UIDS": "on",
        "CRAFT_SANDBOX_UID_BASE": str(base),
        "CRAFT_SANDBOX_UID_COUNT": "1000",
    }
    try:
        with serve(uids, place / "sandboxes") as server:
            yield server
    finally:
        network.remove_installation(base)
        firewall.remove(base)
        budget.remove(base)
        shutil.rmtree(place, ignore_errors=True)


async def open_terminal_tab(page, craft_server, session_id: str) -> None:
    await page.goto(f"{craft_server.url}/sessions/{session_id}/")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    await page.click("#workspace-toggle")
    await page.click("#tab-terminal")
    await expect(page.locator("#panel-terminal")).to_be_visible()


async def type_line(page, text: str) -> None:
    await page.locator("#terminal-screens .terminal-screen:not([hidden]) .xterm").click()
    await page.keyboard.type(text)
    await page.keyboard.press("Enter")


async def test_a_terminal_runs_as_the_sandbox_user_and_comes_back_after_a_drop(
    page, craft_server, owner
):
    session_id = await off_the_loop(open_session, craft_server, owner)
    await open_terminal_tab(page, craft_server, session_id)
    await snap(page, "terminal-empty")
    await page.click("#terminal-new")
    screen = page.locator(SCREEN)
    await type_line(page, "id")
    await expect(screen).to_contain_text("uid=11")  # the sandbox's uid: 1,100,000,000 and up
    await expect(screen).not_to_contain_text("uid=0(")
    await type_line(page, "echo before-the-drop")
    await expect(screen).to_contain_text("before-the-drop", timeout=15000)
    await snap(page, "terminal-id")
    await assert_accessible(page, "the Terminal tab")

    # The network drops the socket: the page comes back to the same shell, scrollback first.
    # (Keys still on their way when the socket drops are lost with it, as over ssh: the drop
    # comes once the shell has run the line, which only its output, 42, shows.)
    await type_line(page, "export MARK=same-shell; echo marked-$((6*7))")
    await expect(screen).to_contain_text("marked-42")
    craft_server.hook(f"drop/{session_id}/")
    await expect(page.locator("#terminal-state")).to_contain_text("Connected again")
    # Its scrollback first. (Not the line above the prompt: bash redraws a prompt that a new
    # width wraps otherwise, and may wipe what is just above it.)
    await expect(screen).to_contain_text("uid=11")
    await type_line(page, "echo still-$MARK")
    await expect(screen).to_contain_text("still-same-shell")
    await snap(page, "terminal-reconnected")

    # A reload too: the terminal's id is kept for the tab.
    await page.reload()
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    await page.click("#workspace-toggle")
    await page.click("#tab-terminal")
    await expect(screen).to_contain_text("uid=11")
    await type_line(page, "echo again-$MARK")
    await expect(screen).to_contain_text("again-same-shell")


async def test_selected_output_is_attached_to_the_message(page, craft_server, owner):
    session_id = await off_the_loop(open_session, craft_server, owner)
    await open_terminal_tab(page, craft_server, session_id)
    await page.click("#terminal-new")
    await type_line(page, "echo attach-me")
    screen = page.locator(SCREEN)
    await expect(screen).to_contain_text("attach-me")
    await expect(page.locator("#terminal-attach")).to_be_disabled()
    box = await screen.bounding_box()  # a drag over the first lines selects them
    await page.mouse.move(box["x"] + 2, box["y"] + 2)
    await page.mouse.down()
    await page.mouse.move(box["x"] + box["width"] - 4, box["y"] + 80, steps=5)
    await page.mouse.up()
    await expect(page.locator("#terminal-attach")).to_be_enabled()
    await page.click("#terminal-attach")
    value = await page.locator("#prompt").input_value()
    assert "Output of my terminal" in value and "attach-me" in value
    await snap(page, "terminal-attached")


async def test_a_terminal_dies_with_its_sandbox(page, craft_server, owner, staff):
    session_id = await off_the_loop(open_session, craft_server, owner)
    await open_terminal_tab(page, craft_server, session_id)
    await page.click("#terminal-new")
    screen = page.locator(SCREEN)
    await type_line(page, "echo alive")
    await expect(screen).to_contain_text("alive")
    sandbox = (await off_the_loop(_sandbox_of, session_id)).pk
    await off_the_loop(admin_terminate, craft_server, staff, sandbox)
    await expect(page.locator("#terminal-state")).to_contain_text("The shell exited")
    await expect(screen).to_contain_text("The shell exited with code")
    await expect(page.locator(".terminal-tab")).to_have_text("Terminal 1 (ended)")
    await snap(page, "terminal-ended")


def _sandbox_of(session_id: str):
    from craft.models import Session

    return Session.objects.get(pk=session_id).sandbox


async def test_another_person_s_terminal_socket_is_refused(browser, craft_server, owner, stranger):
    session_id = await off_the_loop(open_session, craft_server, owner)
    page = await signed_in_page(browser, craft_server, stranger)
    try:
        await page.goto(f"{craft_server.url}/")
        code = await page.evaluate(
            """(session) => new Promise((done) => {
                const ws = new WebSocket(`ws://${location.host}/ws/sessions/${session}/terminals/`);
                ws.onmessage = () => done("a frame came");
                ws.onclose = (event) => done(event.code);
            })""",
            session_id,
        )
    finally:
        await page.context.close()
    assert code == 4403
