"""What a person sees: the chat page in Chromium against daphne and the demo agent."""

from __future__ import annotations

import asyncio
import datetime
from collections import Counter
from pathlib import Path

import pytest
from playwright.async_api import expect

from craft.models import Event
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events
from tests.ready import open_ready_session

from .conftest import PHONE, snap

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

TURN_END = "#transcript .turn-end .label"


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Browser session")


@db_sync_to_async
def stored(session):
    return list(Event.objects.filter(session=session).order_by("seq"))


@db_sync_to_async
def last_seq(session) -> int:
    return (
        Event.objects.filter(session=session).order_by("-seq").values_list("seq", flat=True).first()
        or 0
    )


async def open_page(page, craft_server, session):
    """Open the session's page; return once it is connected and shows every stored event."""
    seq = await last_seq(session)
    await page.goto(f"{craft_server.url}/sessions/{session.pk}/")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    if seq:
        await page.locator(f'#transcript [data-seq="{seq}"]').wait_for(state="attached")


async def send_prompt(page, text):
    await page.fill("#prompt", text)
    await page.press("#prompt", "Enter")


async def rendered_seqs(page) -> list[int]:
    return [
        int(s)
        for s in await page.locator("#transcript [data-seq]").evaluate_all(
            "nodes => nodes.map(n => n.dataset.seq)"
        )
    ]


async def assert_page_matches_log(page, session):
    """Every stored event is on the page exactly once, and the agent's text is complete.

    Events may still come (a turn that used tools is followed by its changes): the page and
    the log are compared until they agree, for up to 15 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        events = await stored(session)
        seqs = await rendered_seqs(page)
        if sorted(seqs) == [e.seq for e in events] or loop.time() > deadline:
            break
        await asyncio.sleep(0.2)
    assert [s for s, n in Counter(seqs).items() if n > 1] == []
    assert sorted(seqs) == [e.seq for e in events]
    agent_text = "".join(
        (e.data.get("content") or {}).get("text", "")
        for e in events
        if e.kind == "agent_message_chunk"
    )
    # The bubbles' text, without their "Show all"/"Show less" buttons.
    shown = "".join(
        await page.locator("#transcript .msg.agent .bubble").evaluate_all(
            """nodes => nodes.map(node => {
                const copy = node.cloneNode(true);
                copy.querySelectorAll(".toggle-more").forEach(b => b.remove());
                return copy.innerText;
            })"""
        )
    )
    # Markdown renders the text and folds its whitespace: compare everything else.
    assert "".join(shown.split()) == "".join(agent_text.split())


async def test_a_reply_streams_in_before_the_turn_ends(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "slow 40 0.05")
    reply = page.locator("#transcript .msg.agent .bubble").last
    await expect(reply).to_contain_text("chunk 3 ")
    early = len(await reply.inner_text())
    assert await page.locator(TURN_END).count() == 0
    await expect(page.locator("#stop")).to_be_visible()
    await snap(page, "chat-mid-turn")
    await expect(reply).to_contain_text("chunk 20 ")
    assert len(await reply.inner_text()) > early
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await expect(page.locator("#stop")).to_be_hidden()
    await expect(page.locator("#prompt")).to_have_value("")
    await snap(page, "chat-after-turn")
    await assert_page_matches_log(page, session)


async def test_the_demo_scenario_renders_plan_tools_and_permission(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "demo 0.05")
    permission = page.locator("#transcript .permission")
    await expect(permission).to_be_visible()
    await snap(page, "chat-permission")
    await permission.get_by_role("button", name="Allow").click()
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await expect(page.locator("#transcript .tool").first).to_have_attribute(
        "data-status", "completed"
    )
    await expect(
        page.locator("#transcript .plan .plan-entry[data-status=completed]")
    ).to_have_count(3)
    await expect(page.locator("#transcript .diff .add").first).to_contain_text("Hello from")
    await snap(page, "chat-demo")
    await assert_page_matches_log(page, session)


async def test_a_permission_prompt_can_be_answered_by_clicking(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "write clicked.txt yes please")
    await page.locator("#transcript .permission").get_by_role("button", name="Allow").click()
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await expect(page.locator("#transcript .permission")).to_have_attribute("data-answer", "allow")
    await expect(page.locator("#transcript .tool")).to_have_attribute("data-status", "completed")
    workspace = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    assert (workspace / "clicked.txt").read_text() == "yes please"


async def test_stop_cancels_the_turn(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "slow 300 0.05")
    await expect(page.locator("#transcript .msg.agent")).to_contain_text("chunk 2 ")
    await page.click("#stop")
    await expect(page.locator(TURN_END)).to_have_text("Stopped")
    await expect(page.locator("#send")).to_be_enabled()
    chunks = [e for e in await stored(session) if e.kind == "agent_message_chunk"]
    assert len(chunks) < 300


async def test_after_stop_the_keyboard_is_back_in_the_prompt_box(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "slow 300 0.05")
    await expect(page.locator("#transcript .msg.agent")).to_contain_text("chunk 2 ")
    await page.locator("#stop").focus()
    await page.keyboard.press("Enter")
    await expect(page.locator(TURN_END)).to_have_text("Stopped")
    await expect(page.locator("#stop")).to_be_hidden()
    await expect(page.locator("#prompt")).to_be_focused()


async def test_on_a_phone_the_message_box_keeps_most_of_the_width_mid_turn(
    page, craft_server, session
):
    await page.set_viewport_size(PHONE)
    await open_page(page, craft_server, session)
    await send_prompt(page, "hello")
    await expect(page.locator(TURN_END)).to_have_count(1)
    await expect(page.locator("#attach-image")).to_be_visible()  # the agent takes images
    await send_prompt(page, "slow 300 0.05")
    await expect(page.locator("#stop")).to_be_visible()
    box = await page.locator("#prompt").bounding_box()
    assert box is not None and box["width"] >= 0.6 * PHONE["width"], box
    for button in ("#attach-image", "#send", "#stop"):
        edge = await page.locator(button).bounding_box()
        assert edge is not None, button
        assert edge["x"] >= 0 and edge["x"] + edge["width"] <= PHONE["width"], button
    await snap(page, "composer-phone-midturn")
    await page.click("#stop")
    await expect(page.locator(TURN_END).last).to_have_text("Stopped")


async def test_reloading_mid_turn_shows_the_whole_turn_once(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "slow 60 0.03")
    await expect(page.locator("#transcript .msg.agent")).to_contain_text("chunk 5 ")
    await page.reload()
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await assert_page_matches_log(page, session)


async def test_after_a_dropped_socket_the_transcript_equals_the_log(page, craft_server, session):
    await open_page(page, craft_server, session)
    sockets = []
    page.on("websocket", lambda ws: sockets.append(ws))
    await send_prompt(page, "slow 60 0.03")
    await expect(page.locator("#transcript .msg.agent")).to_contain_text("chunk 5 ")
    craft_server.hook(f"drop/{session.pk}/")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    assert len(sockets) >= 1  # it reconnected
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    await assert_page_matches_log(page, session)


async def test_a_burst_of_reconnects_during_a_slow_load_triggers_one_load(page, hooks, session):
    await db_sync_to_async(append_events)(
        session.pk, [("agent_message_chunk", {"content": {"type": "text", "text": "x"}})]
    )
    hooks.hook("configure/", hold_loads=1)  # until released: the burst comes meanwhile
    sockets = []
    page.on("websocket", lambda ws: sockets.append(ws))
    await page.goto(f"{hooks.url}/sessions/{session.pk}/")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    for _ in range(3):
        hooks.hook(f"drop/{session.pk}/")
        await expect(page.locator("#conn")).to_have_attribute("data-state", "reconnecting")
        await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    assert hooks.loads(session.pk) == 1
    assert len(sockets) == 4
    hooks.hook("release/")
    # The slow load finishes and the page resumes on the newest socket: it is live.
    await send_prompt(page, "hello after the burst")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    assert hooks.loads(session.pk) == 1
    await assert_page_matches_log(page, session)


async def test_failed_loads_are_shown_retried_and_then_render_once(page, hooks, session):
    hooks.hook("configure/", fail_loads=2)
    await page.goto(f"{hooks.url}/sessions/{session.pk}/")
    banner = page.locator("#load-error")
    await expect(banner).to_be_visible()
    await expect(banner).to_contain_text("Couldn't load this session")
    # Events stored after the page was rendered arrive with the load that finally succeeds.
    await db_sync_to_async(append_events)(
        session.pk,
        [
            ("user_message", {"id": "x", "text": "stored while loads failed"}),
            ("agent_message_chunk", {"content": {"type": "text", "text": "late reply"}}),
            ("turn_end", {"stop_reason": "end_turn"}),
        ],
    )
    await expect(banner).to_be_hidden()
    await expect(page.locator("#transcript .msg.agent .bubble")).to_have_text("late reply")
    assert hooks.loads(session.pk) == 3
    await assert_page_matches_log(page, session)


async def test_retry_now_runs_the_next_load_at_once(page, hooks, session):
    hooks.hook("configure/", fail_loads=1)
    # The page's clock stands still: the automatic retry cannot run before the click.
    await page.clock.install()
    await page.clock.pause_at(datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC))
    await page.goto(f"{hooks.url}/sessions/{session.pk}/")
    banner = page.locator("#load-error")
    await expect(banner).to_be_visible()
    await page.click("#retry-now")
    await expect(banner).to_be_hidden()
    assert hooks.loads(session.pk) == 2
    await page.clock.run_for(60_000)  # past every automatic retry the failure scheduled
    assert hooks.loads(session.pk) == 2


async def test_the_sidebar_creates_renames_and_deletes_sessions(page, craft_server, session):
    await open_page(page, craft_server, session)
    item = page.locator(f"#session-{session.pk}")
    await item.locator("summary").click()
    await item.locator("input[name=title]").fill("Renamed in the browser")
    await item.get_by_role("button", name="Rename").click()
    await expect(page.locator(f"#session-{session.pk} .session-link")).to_have_text(
        "Renamed in the browser"
    )
    await page.get_by_role("button", name="+ New session").click()
    await expect(page).not_to_have_url(f"{craft_server.url}/sessions/{session.pk}/")
    await expect(page.locator(".session-item")).to_have_count(2)
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    item = page.locator(f"#session-{session.pk}")
    await item.locator("summary").click()
    await item.get_by_role("button", name="Delete").click()
    await expect(page.locator(".session-item")).to_have_count(1)
