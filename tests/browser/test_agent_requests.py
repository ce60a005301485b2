"""What a person sees when the agent asks for information (elicitation forms and links),
withdraws a question, or runs a command whose output streams live: Chromium against a real
daphne and the real demo agent."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from .conftest import assert_accessible, serve, signed_in_page, snap
from .test_chat_page import TURN_END, open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

CARD = "#transcript .elicitation"
REPLY = "#transcript .msg.agent"


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Questions")


async def test_a_form_is_filled_in_sent_and_stays_answered_after_a_reload(
    page, craft_server, session
):
    await open_page(page, craft_server, session)
    await send_prompt(page, "elicit")
    card = page.locator(CARD)
    await expect(card.locator(".elicitation-q strong")).to_have_text("Configure the demo project")
    await expect(card.get_by_label("Project name")).to_have_value("demo")  # its default
    await card.get_by_label("Replicas").fill("3")
    await card.get_by_label("Sample ratio").fill("0.5")
    await card.get_by_label("Public").check()
    pin = page.locator("#permission-pin")
    await expect(pin).to_be_visible()
    await expect(pin.locator("#permission-pin-title")).to_have_text("Configure the demo project")
    await pin.click()
    await expect(card.get_by_label("Project name")).to_be_focused()
    await snap(page, "elicitation-form")
    await assert_accessible(page, "a form the agent asks to fill in")
    # Colour is required: the browser holds the form back until it is chosen.
    await card.get_by_role("button", name="Send").click()
    await expect(card).to_have_attribute("data-answer", "")
    await card.get_by_label("Colour").select_option("green")
    await card.get_by_role("button", name="Send").click()
    await expect(page.locator(TURN_END)).to_have_count(1)
    await expect(page.locator(REPLY)).to_contain_text(
        'You accepted: {"colour": "green", "name": "demo", "public": true, "ratio": 0.5, '
        '"replicas": 3}.'
    )
    await expect(card.locator(".elicitation-answer")).to_have_text("You sent your answers.")
    await expect(pin).to_be_hidden()
    await page.reload()
    await expect(page.locator(TURN_END)).to_have_count(1)
    await expect(card).to_have_attribute("data-answer", "accept")
    await expect(card.get_by_role("button", name="Send")).to_be_disabled()


async def test_html_in_a_form_reads_as_text(page, craft_server, session):
    dialogs = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await open_page(page, craft_server, session)
    await send_prompt(page, "elicit html")
    card = page.locator(CARD)
    await expect(card.locator("label")).to_contain_text("<b>Bold</b><img src=x onerror=alert(1)>")
    await expect(card.locator(".field-help")).to_have_text("<script>alert(2)</script>")
    await expect(card.locator(".elicitation-q strong")).to_contain_text("<i>HTML</i>")
    tags = await card.locator("b, img, script, i:not([data-seq]), a").evaluate_all(
        "ns => ns.map(n => n.outerHTML)"
    )
    assert tags == []
    await card.get_by_role("button", name="Decline").click()
    await expect(page.locator(REPLY)).to_contain_text("You declined.")
    assert dialogs == []


async def test_unknown_field_types_are_shown_as_unsupported(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "elicit unknown")
    card = page.locator(CARD)
    await expect(card.locator(".unsupported")).to_have_text(
        "This page can't show this kind of field (color)."
    )
    await card.get_by_label("Name").fill("n")
    await card.get_by_role("button", name="Send").click()
    await expect(page.locator(REPLY)).to_contain_text('You accepted: {"name": "n"}.')
    await send_prompt(page, "elicit unknown-required")
    second = page.locator(CARD).nth(1)
    await expect(second.get_by_role("button", name="Send")).to_be_disabled()
    await expect(second).to_contain_text("you can only decline it")
    await second.get_by_role("button", name="Decline").click()
    await expect(page.locator(TURN_END)).to_have_count(2)


async def test_a_form_of_1000_fields_is_refused_with_a_clear_message(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "elicit many")
    card = page.locator(CARD)
    await expect(card.locator(".elicitation-answer")).to_have_text(
        "Craft could not show this request: the form has 1000 fields; Craft shows forms of at "
        "most 100."
    )
    assert await card.locator("input, button").count() == 0
    await expect(page.locator(TURN_END)).to_have_count(1)


async def test_a_link_shows_its_host_and_whole_url_and_is_accepted(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "elicit url")
    card = page.locator(CARD)
    await expect(card.locator(".elicitation-host")).to_have_text("example.com")
    link = card.get_by_role("link", name="https://example.com/demo/authorize?step=1")
    await expect(link).to_have_attribute("href", "https://example.com/demo/authorize?step=1")
    await expect(link).to_have_attribute("target", "_blank")
    await expect(link).to_have_attribute("rel", "noopener noreferrer")
    await snap(page, "elicitation-url")
    await assert_accessible(page, "a link the agent asks to open")
    await card.get_by_role("button", name="I opened it: accept").click()
    await expect(page.locator(REPLY)).to_contain_text("You accepted.")
    await expect(card.locator(".elicitation-answer")).to_have_text(
        "You agreed to open the link. The agent says it is done."
    )


async def test_a_question_the_agent_withdraws_closes_its_card(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "withdraw elicit 1")
    card = page.locator(CARD)
    await expect(card.get_by_role("button", name="Send")).to_be_enabled()
    await expect(card.locator(".elicitation-answer")).to_have_text(
        "Withdrawn: the agent no longer needs an answer."
    )
    await expect(card.get_by_role("button", name="Send")).to_be_disabled()
    await expect(page.locator(REPLY)).to_contain_text("I withdrew my request")


async def test_a_stopped_turn_closes_its_open_form(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "elicit")
    card = page.locator(CARD)
    await expect(card.get_by_role("button", name="Send")).to_be_enabled()
    await page.locator("#stop").click()
    await expect(card.locator(".elicitation-answer")).to_have_text(
        "Cancelled: the turn was stopped."
    )


async def test_command_output_streams_live_into_the_card(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "terminal 6 0.4")
    card = page.locator("#transcript .tool")
    output = card.locator(".terminal-output")
    # Seen while the command still runs: the turn has not ended yet.
    await expect(output).to_contain_text("step 2 of 6: ok")
    assert await page.locator(TURN_END).count() == 0
    await expect(card.locator(".command")).to_have_text("$ demo-build --lines 6")
    await expect(card.locator(".terminal-exit")).to_have_text("Exited with code 0")
    await expect(output).to_contain_text("step 6 of 6: ok")
    await expect(page.locator(TURN_END)).to_have_count(1)
    await snap(page, "terminal-output")
    await page.reload()
    await expect(page.locator("#transcript .tool .terminal-output")).to_contain_text(
        "step 1 of 6: ok\nstep 2 of 6: ok"
    )


async def test_an_agent_that_wants_authentication_lists_its_ways_to_sign_in(
    browser, owner, tmp_path
):
    session = await db_sync_to_async(open_ready_session)(owner, "Sign in")
    env = {"CRAFT_AGENT_COMMAND": "craft-demo-agent --auth"}
    with serve(env, tmp_path / "sandboxes") as server:
        page = await signed_in_page(browser, server, owner)
        try:
            await open_page(page, server, session)
            await send_prompt(page, "hello")
            error = page.locator("#transcript .agent-error")
            await expect(error.locator("p").first).to_have_text(
                "The agent needs you to sign in first."
            )
            await expect(error.locator(".auth-methods li")).to_have_text(
                [
                    "Demo login: Sign in with a demo account",
                    "Demo API key: Set DEMO_API_KEY in the sandbox",
                ]
            )
            await snap(page, "agent-wants-authentication")
        finally:
            await page.context.close()
