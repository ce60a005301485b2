"""The transcript as a person reads it: cards, permissions, Markdown, odd agent data, paths.

Events a test stores itself reach the page through a load (they are stored before the page
opens, or before a reload). The doorbell that announces new events lives in the server
process, so events stored here reach an open page live only when something the server does
rings it, such as the page's next prompt.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.async_api import expect

from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events
from craft.views import session_workspace
from tests.ready import open_ready_session

from .conftest import snap
from .test_chat_page import TURN_END, assert_page_matches_log, open_page, send_prompt, stored

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

store = db_sync_to_async(append_events)


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Transcript")


async def test_cards_of_a_later_turn_never_overwrite_an_earlier_turns_card(
    page, craft_server, session
):
    # The agent process restarts after the crash, so its tool call ids start again at call-1.
    await open_page(page, craft_server, session)
    await send_prompt(page, "write a.txt one")
    await page.locator("#transcript .permission").get_by_role("button", name="Allow").click()
    await expect(page.locator(TURN_END)).to_have_count(1)
    await send_prompt(page, "crash")
    await expect(page.locator(TURN_END)).to_have_count(2)
    await send_prompt(page, "read a.txt")
    await expect(page.locator(TURN_END)).to_have_count(3)

    async def check() -> None:
        cards = page.locator("#transcript .tool")
        await expect(cards).to_have_count(2)
        await expect(cards.nth(0).locator(".tool-title")).to_have_text("Write a.txt")
        await expect(cards.nth(0).locator(".diff .add")).to_have_text("one")
        await expect(cards.nth(1).locator(".tool-title")).to_have_text("Read a.txt")
        await expect(cards.nth(1).locator(".tool-text")).to_have_text("one")
        await expect(cards.nth(1)).to_have_attribute("data-status", "completed")

    await check()
    await snap(page, "cards-after-agent-restart")
    await page.reload()
    await expect(page.locator(TURN_END)).to_have_count(3)
    await check()
    await assert_page_matches_log(page, session)


async def test_a_permission_card_shows_what_it_asks_to_approve(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "write notes/todo.txt buy milk")
    card = page.locator("#transcript .permission")
    await expect(card).to_be_visible()
    # Before anyone answers: the diff, with the path relative to the workspace, and every
    # option by the agent's own name.
    await expect(card.locator(".diff .add")).to_have_text("buy milk")
    await expect(card.locator(".diff-path")).to_contain_text("notes/todo.txt")
    assert not (await card.locator(".diff-path").inner_text()).startswith("/")
    await expect(card.locator(".options button")).to_have_text(["Allow", "Reject"])
    await expect(card.locator(".options button.allow_once")).to_have_count(1)
    await expect(card.locator(".options button.reject_once")).to_have_count(1)
    await snap(page, "permission-with-diff")
    await card.get_by_role("button", name="Reject").click()
    await expect(card.locator(".permission-answer")).to_have_text("You rejected this (Reject)")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    await expect(page.locator("#transcript .tool .badge")).to_have_text("Failed")


async def test_permission_cards_show_commands_locations_and_every_option_kind(
    page, craft_server, session
):
    workspace = await db_sync_to_async(session_workspace)(session)
    options = [
        {"optionId": "a1", "name": "Allow once", "kind": "allow_once"},
        {"optionId": "a2", "name": "Always allow `npm`", "kind": "allow_always"},
        {"optionId": "r1", "name": "Not now", "kind": "reject_once"},
        {"optionId": "r2", "name": "Never", "kind": "reject_always"},
    ]
    call = {
        "toolCallId": "t1",
        "title": "npm test",
        "kind": "execute",
        "rawInput": {"command": ["npm", "test", f"{workspace}/pkg"]},
        "locations": [{"path": f"{workspace}/pkg/package.json", "line": 3}],
    }
    await store(
        session.pk,
        [
            ("user_message", {"id": "u1", "text": "run the tests"}),
            ("tool_call", {"sessionUpdate": "tool_call", **call, "status": "pending"}),
            ("permission_request", {"request": "q1", "toolCall": call, "options": options}),
        ],
    )
    await open_page(page, craft_server, session)
    card = page.locator("#transcript .permission")
    await expect(card.locator(".command")).to_have_text("$ npm test pkg")
    await expect(card.locator(".locations")).to_have_text("pkg/package.json:3")
    await expect(card.locator(".options button")).to_have_text(
        ["Allow once", "Always allow `npm`", "Not now", "Never"]
    )
    for kind in ("allow_once", "allow_always", "reject_once", "reject_always"):
        await expect(card.locator(f".options button.{kind}")).to_have_count(1)
    assert workspace not in await page.locator("#transcript").inner_text()


async def test_malformed_agent_data_never_wedges_the_page(page, craft_server, session):
    await open_page(page, craft_server, session)
    malformed = [
        ("plan", {"entries": [None]}),
        ("plan", {"entries": 5}),
        ("permission_request", {"request": "r1", "toolCall": None, "options": [None, 3]}),
        ("permission_answer", {"request": "never-asked", "option": "allow"}),
        ("tool_call_update", {"toolCallId": 7, "content": "not a list", "status": 12}),
        ("tool_call", {"toolCallId": "t", "content": [None, {"type": "diff"}, 5]}),
        ("agent_message_chunk", {"content": None}),
        ("turn_end", {}),
        ("craft_demo_unknown_kind", {"detail": "x"}),
        ("available_commands_update", {"availableCommands": []}),
    ]
    await store(session.pk, malformed)
    # The prompt rings the server's doorbell: the odd events reach the page live, before it.
    await send_prompt(page, "hello after the odd data")
    await expect(page.locator("#transcript .note")).to_have_count(2)
    # A tool the agent never finished before its turn ended does not claim to be running.
    await expect(page.locator('#transcript .tool[data-tool-call-id="t"] .badge')).to_have_text(
        "Not finished"
    )
    await expect(page.locator("#transcript .msg.agent").last).to_contain_text("Echo: hello")
    await expect(page.locator(TURN_END).last).to_have_text("Done")
    assert await page.locator("#load-error").is_hidden()
    await assert_page_matches_log(page, session)
    await snap(page, "malformed-data")
    await page.reload()  # the same data from history
    await expect(page.locator(TURN_END).last).to_have_text("Done")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    assert await page.locator("#load-error").is_hidden()
    await assert_page_matches_log(page, session)


async def test_markdown_is_rendered_safely_with_highlighted_copyable_code(
    page, craft_server, session
):
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    text = (
        "Here is **bold** and a [link](https://example.com).\n\n"
        '<img src="x" onerror="window.pwned = 1"> <b>raw html</b>\n\n'
        "```html\n<script>window.pwned = 2</script>\n<p>hi</p>\n```\n\n"
        "# A heading\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    )
    await store(
        session.pk,
        [
            ("user_message", {"id": "m", "text": "show me markdown"}),
            ("agent_message_chunk", {"content": {"type": "text", "text": text[:40]}}),
            ("agent_message_chunk", {"content": {"type": "text", "text": text[40:]}}),
            ("turn_end", {"stop_reason": "end_turn"}),
        ],
    )
    await open_page(page, craft_server, session)
    bubble = page.locator("#transcript .msg.agent .bubble")
    await expect(bubble.locator("strong")).to_have_text("bold")
    await expect(bubble.locator("a")).to_have_attribute("rel", "noopener noreferrer nofollow")
    code = bubble.locator(".code-block code")
    await expect(code).to_have_text("<script>window.pwned = 2</script>\n<p>hi</p>\n")
    await expect(code).to_have_class(re.compile(r"\bhljs\b"))
    await expect(bubble.locator(".code-lang")).to_have_text("html")
    await expect(bubble.locator("table td").first).to_have_text("1")
    await expect(bubble.locator("h3")).to_have_text("A heading")
    # Raw HTML from the agent is shown as text, never made into elements.
    await expect(bubble).to_contain_text('<img src="x" onerror="window.pwned = 1">')
    assert await bubble.locator("img, script, b").count() == 0
    assert await page.evaluate("window.pwned") is None
    await bubble.get_by_role("button", name="Copy html code").click()
    await expect(bubble.get_by_role("button", name="Copy html code")).to_have_text("Copied")
    assert await page.evaluate("navigator.clipboard.readText()") == (
        "<script>window.pwned = 2</script>\n<p>hi</p>\n"
    )
    await snap(page, "markdown")


async def test_long_tool_output_is_collapsed_until_asked(page, craft_server, session):
    output = "".join(f"line {i}\n" for i in range(1, 5001))
    content = [{"type": "content", "content": {"type": "text", "text": output}}]
    await store(
        session.pk,
        [
            ("user_message", {"id": "m", "text": "cat a big file"}),
            ("tool_call", {"toolCallId": "c", "title": "Read big.txt", "kind": "read"}),
            ("tool_call_update", {"toolCallId": "c", "status": "completed", "content": content}),
            ("turn_end", {"stop_reason": "end_turn"}),
        ],
    )
    await open_page(page, craft_server, session)
    card = page.locator("#transcript .tool")
    toggle = card.get_by_role("button", name="Show all")
    await expect(toggle).to_have_attribute("aria-expanded", "false")
    await expect(toggle).to_contain_text("5,000 lines")
    assert await page.evaluate("document.documentElement.scrollHeight") < 3000
    await snap(page, "long-output-collapsed")
    await toggle.click()
    await expect(card.get_by_role("button", name="Show less")).to_have_attribute(
        "aria-expanded", "true"
    )
    await expect(card.locator(".tool-text")).to_contain_text("line 5000")


async def test_people_read_words_not_identifiers_and_never_host_paths(
    page, staff_page, craft_server, session, staff
):
    await open_page(page, craft_server, session)
    await send_prompt(page, "crash")
    error = page.locator("#transcript .agent-error")
    await expect(error).to_contain_text("The agent stopped unexpectedly.")
    await expect(page.locator(TURN_END)).to_have_text("Ended with an error")
    # What the agent wrote to stderr is its own words, for the person too; Craft's own
    # message ("agent exited with code 3") is for staff.
    said = "craft-demo-agent: crash requested; exiting with status 3"
    await expect(error.locator(".error-wrote")).to_have_text(f"Its error output says: {said}")
    details = error.locator("details")
    await details.get_by_text("Details").click()
    await expect(details.locator("pre.stderr")).to_contain_text(said)
    await expect(details).not_to_contain_text("agent exited with code 3")
    await send_prompt(page, "slow 200 0.05")
    await expect(page.locator("#working")).to_be_visible()
    await expect(page.locator("#working")).to_contain_text("Working…")
    await page.click("#stop")
    await expect(page.locator(TURN_END).last).to_have_text("Stopped")
    text = await page.locator("body").inner_text()
    for word in ("in_progress", "end_turn", "Answer:", "Turn ended", "cancelled", "agent_error"):
        assert word not in text
    await snap(page, "crash-and-stop")

    theirs = await db_sync_to_async(open_ready_session)(staff, "Staff session")
    await open_page(staff_page, craft_server, theirs)
    workspace = await staff_page.locator("#session").get_attribute("data-workspace")
    await send_prompt(staff_page, "crash")
    details = staff_page.locator("#transcript .agent-error details")
    await details.get_by_text("Details").click()
    await expect(details.locator("pre").first).to_contain_text("agent exited with code 3")
    await expect(details.locator("pre.stderr")).to_contain_text("crash requested")
    shown = await staff_page.locator("body").inner_text()
    assert workspace not in shown
    assert theirs.sandbox.reference not in shown
    await snap(staff_page, "crash-details-for-staff")


async def test_a_truncated_event_shows_all_on_request(page, craft_server, session):
    full = "".join(f"row {i}\n" for i in range(1, 3001))
    content = [{"type": "content", "content": {"type": "text", "text": full}}]
    await store(
        session.pk,
        [
            ("user_message", {"id": "m", "text": "big output"}),
            ("tool_call", {"toolCallId": "c", "title": "Run dump", "kind": "execute"}),
            ("tool_call_update", {"toolCallId": "c", "status": "completed", "content": content}),
            ("turn_end", {"stop_reason": "end_turn"}),
        ],
    )
    events = await stored(session)
    big = next(e for e in events if e.kind == "tool_call_update")

    # Deliver that event as the server does with an oversized one: marked, data shortened.
    async def shorten(route):
        response = await route.fetch()
        body = await response.json()
        for event in body["events"]:
            if event["seq"] == big.seq:
                event["truncated"] = True
                short = [{"type": "content", "content": {"type": "text", "text": "row 1\n"}}]
                event["data"] = {**event["data"], "content": short}
        await route.fulfill(response=response, body=json.dumps(body))

    await page.route(re.compile(r".*/events/\?after=.*"), shorten)
    await open_page(page, craft_server, session)
    card = page.locator("#transcript .tool")
    await expect(card.locator(".tool-text")).to_have_text("row 1\n")
    await expect(card.locator(".truncated")).to_contain_text("too large")
    await snap(page, "truncated-event")
    await card.get_by_role("button", name="Show all", exact=True).click()
    await expect(card.locator(".truncated")).to_have_count(0)
    await card.get_by_role("button", name="Show all (3,000 lines").click()
    await expect(card.locator(".tool-text")).to_contain_text("row 3000")


async def test_thoughts_fold_away_once_the_agent_answers(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "think about cats")
    await expect(page.locator(TURN_END)).to_have_text("Done")
    thought = page.locator("#transcript details.thought")
    await expect(thought.locator("summary")).to_have_text("Thought")
    assert await thought.get_attribute("open") is None
    await thought.locator("summary").click()
    await expect(thought.locator(".body")).to_have_text("Thinking about: about cats")
    await expect(page.locator("#transcript .msg.agent .bubble")).to_have_text("Done thinking.")
    stamp = page.locator("#transcript .msg.user time")
    assert (await stamp.get_attribute("datetime")).endswith("Z")


async def test_single_line_breaks_in_a_reply_are_kept(page, craft_server, session):
    await open_page(page, craft_server, session)
    await send_prompt(page, "count 10")
    await expect(page.locator(TURN_END)).to_have_count(1)
    reply = page.locator("#transcript .msg.agent .bubble").last
    await expect(reply.locator("p")).to_have_count(1)  # drawn as Markdown
    assert (await reply.inner_text()).strip().split("\n") == [str(n) for n in range(1, 11)]
    await snap(page, "reply-line-breaks")
