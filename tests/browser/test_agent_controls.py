"""The agent's memory and its own controls, as a person sees them in Chromium: the restart
divider, config pickers and modes, the command palette, usage, titles, permission options by
the agent's names, file mentions and images. Real daphne, real demo agents."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal

import pytest
from playwright.async_api import expect

from craft.models import Event
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events
from sandboxes.in_sandbox.demo_agent import FRESH_MARKER
from tests.ready import open_ready_session

from .conftest import assert_accessible, serve, signed_in_page, snap
from .test_chat_page import TURN_END, open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

store = db_sync_to_async(append_events)
REPLY = "#transcript .msg.agent .bubble"
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "")


@db_sync_to_async
def kinds_of(session) -> list[str]:
    events = Event.objects.filter(session=session).order_by("seq")
    return list(events.values_list("kind", flat=True))


@db_sync_to_async
def agent_texts(session) -> list[str]:
    """The agent's replies, one string per turn."""
    replies: list[str] = []
    for event in Event.objects.filter(session=session).order_by("seq"):
        if event.kind == "user_message":
            replies.append("")
        elif event.kind == "agent_message_chunk" and replies:
            replies[-1] += event.data["content"]["text"]
    return replies


async def logged(session, kind: str) -> None:
    """Wait until the log holds an event of `kind`."""
    for _ in range(200):
        if kind in await kinds_of(session):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {kind} event")


async def turn(page, text: str, done: int) -> None:
    """Send a prompt and wait for the page's `done`th turn end."""
    await send_prompt(page, text)
    await expect(page.locator(TURN_END)).to_have_count(done)


async def test_the_restart_divider_says_whether_the_context_came_back(page, craft_server, session):
    for i, restored in enumerate(["resume", "load", "none", "bogus"]):
        await store(session.pk, [
            ("user_message", {"id": f"u{i}", "text": f"prompt {i}"}),
            ("agent_restarted", {"restored": restored}),
            ("turn_end", {"stop_reason": "end_turn"}),
        ])  # fmt: skip
    await store(session.pk, [("agent_restarted", "not an object")])  # type: ignore[list-item]
    await open_page(page, craft_server, session)
    dividers = page.locator("#transcript .divider")
    await expect(dividers).to_have_text([
        "Agent restarted — context restored",
        "Agent restarted — context restored",
        "Agent restarted — the agent starts fresh",
        "Agent restarted",
        "Agent restarted",
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("restore", "reply", "divider"),
    [
        ("resume", "You asked me to remember: banana.", "Agent restarted — context restored"),
        ("load", "You asked me to remember: banana.", "Agent restarted — context restored"),
        ("none", FRESH_MARKER, "Agent restarted — the agent starts fresh"),
    ],
)
async def test_a_killed_agent_comes_back_and_the_page_says_how(
    browser, owner, tmp_path, restore, reply, divider
):
    session = await db_sync_to_async(open_ready_session)(owner, "")
    env = {"CRAFT_AGENT_COMMAND": f"craft-demo-agent --restore {restore}"}
    with serve(env, tmp_path / "sandboxes") as server:
        page = await signed_in_page(browser, server, owner)
        try:
            await open_page(page, server, session)
            await turn(page, "remember banana", 1)
            await turn(page, "pid", 2)
            # A live reply's text is drawn at the next frame, the turn's end at once.
            await expect(page.locator(REPLY).last).to_have_text(re.compile(r"^pid \d+ "))
            pid_reply = await page.locator(REPLY).last.inner_text()
            pid = int(pid_reply.split()[1])
            os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.3)
            await turn(page, "recall", 3)
            await expect(page.locator(REPLY).last).to_have_text(reply)
            await expect(page.locator("#transcript .divider")).to_have_text(divider)
            await snap(page, f"agent-restarted-{restore}")
            await page.reload()
            await expect(page.locator("#transcript .divider")).to_have_count(1)
            kinds = await kinds_of(session)
            assert kinds.count("agent_restarted") == 1
            assert "user_message_chunk" not in kinds, "nothing the agent replayed was stored"
            assert (await agent_texts(session)) == [
                "I will remember banana.", pid_reply, reply,
            ]  # fmt: skip
        finally:
            await page.context.close()


async def test_config_options_commands_usage_and_title_round_trip(page, craft_server, session):
    await open_page(page, craft_server, session)
    # Before the first message: the page had the agent started, and shows what it offers.
    model = page.get_by_label("Model", exact=True)
    await expect(model).to_have_value("fast")
    await expect(page.locator("#composer-hint-more")).to_be_visible()
    assert "user_message" not in await kinds_of(session)
    await snap(page, "controls-before-the-first-message")
    await turn(page, "hello", 1)
    await expect(model).to_have_value("fast")
    await expect(page.get_by_label("Mode", exact=True)).to_have_value("ask")
    await expect(page.locator("#usage-text")).to_contain_text("Context")
    await model.select_option("careful")
    await logged(session, "config_option_update")
    await turn(page, "config", 2)
    await expect(page.locator(REPLY).last).to_have_text("Model: careful. Mode: ask.")

    # The palette: "/" lists the agent's commands; the keyboard picks one.
    await page.fill("#prompt", "/re")
    options = page.locator("#palette [role=option]")
    await expect(options.locator(".name")).to_have_text(["/remember", "/recall"])
    await snap(page, "command-palette")
    await page.press("#prompt", "ArrowDown")
    await page.press("#prompt", "Enter")
    await expect(page.locator("#prompt")).to_have_value("/recall ")
    await expect(page.locator("#palette")).to_be_hidden()
    await page.press("#prompt", "Enter")
    await expect(page.locator(TURN_END)).to_have_count(3)

    await turn(page, "title Garden work", 4)
    await expect(page.locator("#session-title")).to_have_text("Garden work")
    await assert_accessible(page, "session page with the agent's controls")

    # Another viewer (a reload) sees the same state, from the log.
    await page.reload()
    await expect(page.get_by_label("Model", exact=True)).to_have_value("careful")
    await expect(page.locator("#session-title")).to_have_text("Garden work")
    await expect(page.locator("#usage-text")).to_contain_text("tokens")


async def test_enter_on_a_command_typed_in_full_sends_it(page, craft_server, session):
    await open_page(page, craft_server, session)
    await turn(page, "remember plums", 1)
    await page.fill("#prompt", "/recall")
    await expect(page.locator("#palette [role=option] .name")).to_have_text(["/recall"])
    await page.press("#prompt", "Enter")
    await expect(page.locator(TURN_END)).to_have_count(2)
    await expect(page.locator(REPLY).last).to_have_text("You asked me to remember: plums.")
    await expect(page.locator("#prompt")).to_have_value("")


async def test_an_agent_with_modes_only_gets_a_mode_picker(browser, owner, tmp_path):
    session = await db_sync_to_async(open_ready_session)(owner, "")
    env = {"CRAFT_AGENT_COMMAND": "craft-demo-agent --controls modes --no-images"}
    with serve(env, tmp_path / "modes-sandboxes") as server:
        page = await signed_in_page(browser, server, owner)
        try:
            await open_page(page, server, session)
            await turn(page, "hello", 1)
            mode = page.get_by_label("Mode", exact=True)
            await expect(mode).to_have_value("ask")
            await expect(page.get_by_label("Model", exact=True)).to_have_count(0)
            await expect(page.locator("#attach-image")).to_be_hidden()
            await mode.select_option("code")
            await logged(session, "current_mode_update")
            await turn(page, "config", 2)
            await expect(page.locator(REPLY).last).to_have_text("Model: fast. Mode: code.")
        finally:
            await page.context.close()


async def test_permission_options_carry_the_agent_s_own_names(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "ask")
    buttons = page.locator("#transcript .permission .options button")
    await expect(buttons).to_have_text([
        "Yes, this time", "Yes, and don't ask again", "No, not this time",
        "No, and don't ask again",
    ])  # fmt: skip
    await buttons.nth(1).click()
    await expect(page.locator("#transcript .permission-answer")).to_have_text(
        "You allowed this from now on (Yes, and don't ask again)"
    )
    await expect(page.locator(TURN_END)).to_have_count(1)


async def test_files_are_mentioned_and_images_attached(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "write notes.txt hi")
    await page.locator("#transcript .permission").get_by_role("button", name="Allow").click()
    await expect(page.locator(TURN_END)).to_have_count(1)
    await page.fill("#prompt", "look at @no")
    await expect(page.locator("#palette [role=option] .name")).to_have_text(["@notes.txt"])
    await page.press("#prompt", "Tab")
    await expect(page.locator("#prompt")).to_have_value("look at @notes.txt ")
    await page.set_input_files(
        "#image-input", files=[{"name": "dot.png", "mimeType": "image/png", "buffer": PIXEL}]
    )
    await expect(page.locator("#attachments li")).to_contain_text("dot.png (68 bytes)")
    await snap(page, "composer-attachments")
    await page.press("#prompt", "Enter")
    await expect(page.locator(TURN_END)).to_have_count(2)
    await expect(page.locator("#transcript .msg-attachments")).to_have_text(
        "Attached: notes.txt, dot.png (68 bytes)"
    )
    await expect(page.locator(REPLY).last).to_contain_text("I received 2 attachment(s)")
    await expect(page.locator("#attachments")).to_be_hidden()


async def test_a_mention_of_a_missing_file_is_not_attached_and_the_person_is_told(
    page, craft_server, session
):
    await open_page(page, craft_server, session)
    await turn(page, "hello", 1)
    await send_prompt(page, "look at @nothere.txt please")
    await expect(page.locator("#frame-error")).to_have_text(
        "Not attached: nothere.txt is not in the workspace. Your message was sent without it."
    )
    await expect(page.locator(TURN_END)).to_have_count(2)
    await expect(page.locator(REPLY).last).to_have_text("Echo: look at @nothere.txt please")
    await expect(page.locator("#transcript .msg-attachments")).to_have_count(0)
    await snap(page, "composer-missing-mention")


async def test_files_that_are_not_images_are_refused_by_name_by_the_image_picker(
    page, craft_server, session
):
    await open_page(page, craft_server, session)
    await turn(page, "hello", 1)
    error = page.locator("#frame-error")
    await page.set_input_files(
        "#image-input",
        files=[
            {"name": "report.pdf", "mimeType": "application/pdf", "buffer": b"%PDF-1.4"},
            {"name": "dot.png", "mimeType": "image/png", "buffer": PIXEL},
        ],
    )
    await expect(error).to_have_text("Not attached: report.pdf (only images can be attached).")
    await expect(page.locator("#attachments li")).to_have_count(1)
    await expect(page.locator("#attachments li")).to_contain_text("dot.png")
    await snap(page, "composer-files-refused")
    # Dropped on the composer, a file that is not an image is uploaded and attached instead
    # (tests/browser/test_uploads.py).


async def test_odd_controls_from_an_agent_never_wedge_the_page(page, craft_server, session):
    odd = [
        ("agent_info", {"configOptions": "model", "modes": [1], "promptCapabilities": None}),
        ("config_option_update", {"configOptions": [
            None, {"id": 3}, {"id": "model", "type": "select", "currentValue": 7,
                              "options": [{"value": "a"}, {"group": "g", "options": [
                                  {"value": "b", "name": "B"}, "junk"]}]},
            {"id": "flag", "type": "boolean", "currentValue": True},
        ]}),
        ("current_mode_update", {"currentModeId": {"x": 1}}),
        ("available_commands_update", {"availableCommands": [None, {"name": ""}, {"name": 5},
                                                             {"name": "ok"}]}),
        ("usage_update", {"used": "lots", "size": 0, "cost": {"amount": 1, "currency": "??"}}),
        ("usage_update", {"used": 50, "size": 100, "cost": {"amount": 1, "currency": "NOPE!"}}),
        ("user_message", {"id": "u1", "text": "hi", "attachments": [None, {"type": "image"}]}),
        ("agent_restarted", {}),
    ]  # fmt: skip
    await store(session.pk, odd)
    await open_page(page, craft_server, session)
    seqs = await page.locator("#transcript [data-seq]").evaluate_all(
        "nodes => nodes.map(n => Number(n.dataset.seq))"
    )
    assert sorted(seqs) == list(range(1, len(odd) + 1))
    await expect(page.locator("#pickers select")).to_have_count(1)  # only the usable option
    await expect(page.locator("#usage-text")).to_contain_text("Context 50%")
    await expect(page.locator("#transcript .msg-attachments")).to_have_text("Attached: image")
