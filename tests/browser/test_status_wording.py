"""What a person is told when something goes wrong, as each fault happens, in Chromium.

Every person, staff or not, reads why in their own words and what to do next: the agent's
own error text, a server restart (with the permission request it left open), an
administrator stopping their sandbox mid-turn (and the next message carrying on in a new
one), and their session deleted in another tab. Screenshots: `status-<case>`.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.async_api import expect

from craft.models import Event, Session
from craft.session_activity import session_activity
from craft.storage.db import db_sync_to_async
from sandboxes import reaper
from sandboxes.models import Sandbox
from tests.ready import open_ready_session

from ..server import Daphne, Socket
from .conftest import OUTPUT, assert_accessible, signed_in_page, snap
from .test_chat_page import open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ERROR = "#transcript .agent-error"
TURN_END = "#transcript .turn-end .label"
# A reconnect after a restart waits out the page's backoff.
RECONNECT = 30_000


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Status session")


async def test_an_agent_error_shows_everyone_what_the_agent_said(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "fail")
    error = page.locator(ERROR)
    await expect(error).to_contain_text("The agent reported an error.")
    await expect(error.locator(".error-said")).to_have_text(
        "The agent said: demo failure requested (code -32603)"
    )
    await expect(error.locator(".error-next")).to_have_text(
        "Send your message again, or change it."
    )
    await expect(error.locator("details")).to_have_count(0)  # nothing hidden behind staff
    await expect(page.locator(TURN_END)).to_have_text("Ended with an error")
    # Said once, by the card: no toast repeats it over the Retry under it.
    footer = page.locator("#transcript .turn-end").last
    await expect(footer).to_have_text("Ended with an error · Retry")
    await expect(page.locator("#frame-error")).to_be_hidden()
    retry = footer.get_by_role("button", name="Retry: send the same message again")
    box = await retry.bounding_box()
    assert box is not None
    on_top = await page.evaluate(
        "([x, y]) => document.elementFromPoint(x, y)?.className",
        [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2],
    )
    assert on_top == "turn-retry"
    await snap(page, "status-agent-error")


def daphne(sandboxes, port: int | None = None) -> Daphne:
    """Serve the app as the browser tests do; on `port` to stand in for a killed server."""
    server = Daphne(
        OUTPUT, app="tests.browser.faults:application",
        CRAFT_SANDBOX_ROOT=str(sandboxes), DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
    )  # fmt: skip
    if port is not None:
        server.port, server.url = port, f"http://127.0.0.1:{port}"
    return server.start()


async def test_a_server_restart_is_told_on_the_turn_and_on_its_open_question(
    browser, owner, session, tmp_path
):
    first = daphne(tmp_path / "sandboxes")
    second = None
    page = await signed_in_page(browser, first, owner)
    try:
        await open_page(page, first, session)
        await send_prompt(page, "write notes.txt hello")
        card = page.locator("#transcript .permission")
        await expect(card.get_by_role("button", name="Allow")).to_be_enabled()
        first.stop()  # SIGKILL, while the agent waits for the person's answer
        second = daphne(tmp_path / "sandboxes", port=first.port)  # its start closes the turn

        error = page.locator(ERROR)
        await expect(error).to_have_attribute("data-cause", "server_restarted", timeout=RECONNECT)
        await expect(error).to_contain_text(
            "The server restarted while the agent was working, so this turn was cut short."
        )
        await expect(error.locator(".error-next")).to_have_text(
            "Send your message again to carry on."
        )
        await expect(card.locator(".permission-answer")).to_have_text(
            "Not answered: the server restarted."
        )
        await expect(card).not_to_contain_text("Cancelled")
        await expect(page.locator(TURN_END)).to_have_text("Interrupted")
        await snap(page, "status-server-restarted")
    finally:
        await page.context.close()
        first.stop()
        if second is not None:
            second.terminate(timeout=60)


async def test_a_graceful_shutdown_s_ended_turn_and_one_closed_while_away_are_in_the_list(
    browser, owner, session, tmp_path
):
    first = daphne(tmp_path / "sandboxes")
    second = None
    page = await signed_in_page(browser, first, owner)
    try:
        # Another session's longer turn keeps the server in its grace after this one ends.
        other = await db_sync_to_async(open_ready_session)(owner, "Longer")
        longer = await asyncio.to_thread(Socket, first, owner, other.pk)
        longer.send({"type": "resume", "after": 0})
        longer.send({"type": "prompt", "id": "g1", "text": "slow 150 0.1"})
        await asyncio.to_thread(longer.until_kind, "user_message")
        await open_page(page, first, session)
        item = page.locator(f"#session-{session.pk} .session-link")
        await send_prompt(page, "slow 30 0.1")
        await expect(item).to_have_attribute("data-state", "working")
        longer_item = page.locator(f"#session-{other.pk} .session-link")
        await expect(longer_item).to_have_attribute("data-state", "working")
        first.process.terminate()  # SIGTERM: the running turns may end within the grace
        await expect(page.locator(TURN_END)).to_have_text("Done", timeout=RECONNECT)
        # Said while the server still finishes the other turn.
        await expect(item).to_have_attribute("data-state", "idle")
        await expect(item).not_to_contain_text("Working")
        assert first.process.poll() is None
        await expect(longer_item).to_have_attribute("data-state", "working")
        # Killed before the other turn ends: the next server closes that turn as it starts,
        # while the page is not connected; once it is, its list says so.
        first.stop()
        longer.ws.shutdown()
        second = daphne(tmp_path / "sandboxes", port=first.port)
        await expect(page.locator("#conn")).to_have_attribute(
            "data-state", "connected", timeout=RECONNECT
        )
        await expect(longer_item).not_to_have_attribute("data-state", "working")
        await expect(item).to_have_attribute("data-state", "idle")
        await snap(page, "status-graceful-shutdown")
    finally:
        await page.context.close()
        first.stop()
        if second is not None:
            second.terminate(timeout=60)


@db_sync_to_async
def sandbox_of(session_id):
    return Session.objects.get(pk=session_id).sandbox_id


@db_sync_to_async
def kinds_of(session_id):
    return list(Event.objects.filter(session_id=session_id).values_list("kind", flat=True))


async def test_an_administrator_stopping_the_sandbox_is_told_and_the_next_message_carries_on(
    page, staff_page, craft_server, session
):
    await open_page(page, craft_server, session)
    await send_prompt(page, "slow 600 0.05")
    await page.locator("#transcript .msg.agent").wait_for()

    # Staff terminate the sandbox in the admin, which asks first.
    await staff_page.goto(f"{craft_server.url}/admin/sandboxes/sandbox/")
    await staff_page.check(f'input[name="_selected_action"][value="{session.sandbox_id}"]')
    await staff_page.select_option('select[name="action"]', "terminate")
    await staff_page.locator('button[name="index"]').click()  # "Go"
    await expect(staff_page.locator("#content")).to_contain_text("Delete 1 sandbox?")
    await assert_accessible(staff_page, "the terminate confirmation")
    await snap(staff_page, "status-admin-terminate-confirmation")
    await staff_page.get_by_role("button", name="Yes, delete").click()
    await expect(staff_page.locator(".messagelist")).to_contain_text("Deleted 1 sandbox.")

    error = page.locator(ERROR)
    await expect(error).to_contain_text(
        "An administrator stopped your sandbox, so this turn was cut short."
    )
    await expect(error.locator(".error-next")).to_contain_text("a new sandbox starts")
    await expect(page.locator(TURN_END)).to_have_text("Interrupted")  # not "Stopped"
    await expect(page.locator("#sandbox-banner")).to_contain_text(
        "An administrator stopped your sandbox. Send a message to carry on"
    )
    await expect(page.locator("#sandbox-status")).to_contain_text(
        "An administrator stopped your sandbox."
    )
    await expect(page.locator("#prompt")).to_be_enabled()
    await assert_accessible(page, "a session whose sandbox an administrator stopped")
    await snap(page, "status-admin-terminated")

    await send_prompt(page, "hello again")
    reply = page.locator("#transcript .msg.agent").last
    await expect(reply).to_contain_text("hello again", timeout=30_000)
    await expect(page.locator(TURN_END).last).to_have_text("Done")
    await expect(page.locator("#transcript .divider")).to_contain_text("Agent restarted")
    await expect(page.locator("#sandbox-banner")).to_be_hidden()
    assert await sandbox_of(session.pk) != session.sandbox_id  # the same session, moved
    kinds = await kinds_of(session.pk)
    assert kinds.count("user_message") == 2  # the conversation stays
    await snap(page, "status-admin-terminated-continued")


async def test_a_sandbox_the_reaper_stopped_for_idleness_says_so_and_the_next_message_carries_on(
    page, craft_server, session, settings
):
    settings.CRAFT_SANDBOX_IDLE_SECONDS = 60
    long_ago = timezone.now() - timedelta(hours=1)

    def reap() -> None:
        Sandbox.objects.filter(pk=session.sandbox_id).update(last_activity_at=long_ago)
        Session.objects.filter(pk=session.pk).update(updated_at=long_ago)
        reaper.reap_sandboxes(session_activity)

    await db_sync_to_async(reap)()
    assert await sandbox_of(session.pk) == session.sandbox_id
    await open_page(page, craft_server, session)
    await expect(page.locator("#sandbox-banner")).to_contain_text(
        "Your sandbox was stopped after being idle. Send a message to carry on"
    )
    await expect(page.locator("#sandbox-status")).to_contain_text(
        "Your sandbox was stopped after being idle."
    )
    await send_prompt(page, "hello after a while")
    reply = page.locator("#transcript .msg.agent").last
    await expect(reply).to_contain_text("hello after a while", timeout=30_000)
    await expect(page.locator("#sandbox-banner")).to_be_hidden()
    assert await sandbox_of(session.pk) != session.sandbox_id


async def test_a_session_deleted_in_another_tab_says_so(page, craft_server, session):
    await open_page(page, craft_server, session)
    other = await page.context.new_page()
    await open_page(other, craft_server, session)
    other.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    item = other.locator(f"#session-{session.pk}")
    await item.locator("summary").click()
    await item.get_by_role("button", name="Delete").click()
    # The deletion stops the session's agent, which the page asked to start on opening (a
    # start under way is stopped, not waited for), and removes its workspace: on a loaded
    # machine, more than the 5 s an expectation waits by default.
    await expect(other).not_to_have_url(
        f"{craft_server.url}/sessions/{session.pk}/", timeout=15_000
    )
    await other.close()

    await expect(page.locator("#frame-error")).to_have_text(
        "This session was deleted (in another tab or window), with its conversation and files. "
        "Start a new session to carry on."
    )
    await expect(page.locator("#conn")).to_contain_text("Deleted")
    await expect(page.locator("#prompt")).to_be_disabled()
    await expect(page.locator("#frame-error")).not_to_contain_text("in a moment")
    await snap(page, "status-session-deleted")
