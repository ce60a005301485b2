"""The workspace panel as a person uses it in Chromium: the files the agent made (tree, preview,
download), each turn's changes from its chip, hunks and files and turns reverted, "@" from the
real files, and a permission's diff shown once. Real daphne, real demo agent, real git."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from playwright.async_api import expect

from sandboxes import services as sandbox_services
from tests.ready import open_ready_session

from .conftest import assert_accessible, snap
from .test_chat_page import TURN_END, open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)
CHIP = "#transcript .changes-chip"


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Workspace")


def folder_of(session) -> Path:
    return Path(sandbox_services.workspace_path(session.sandbox, session.pk))


async def accessible_unclipped(page, what: str) -> None:
    """axe on a page tall enough that the panel cuts no button at its edge (axe counts a cut
    button as too small to touch, wherever the panel happens to be scrolled)."""
    size = page.viewport_size
    await page.set_viewport_size({"width": size["width"], "height": 3000})
    try:
        await assert_accessible(page, what)
    finally:
        await page.set_viewport_size(size)


async def allowed_turn(page, text: str, turns: int) -> None:
    """Send a prompt, allow what it asks, wait until it is the `turns`th to end."""
    await send_prompt(page, text)
    await (
        page.locator("#transcript .permission .options button:not([disabled])")
        .filter(has_text="Allow")
        .click()
    )
    await expect(page.locator(TURN_END)).to_have_count(turns)


async def test_the_files_the_agent_made_are_seen_previewed_and_downloaded(
    page, craft_server, session
):
    await open_page(page, craft_server, session)
    await allowed_turn(page, "write docs/README.md # Notes\n\nSome *text*.", 1)
    await allowed_turn(page, "write app.py print('hello')", 2)
    # The turn's changes come just after its end, and reload an open tree: the clicks below
    # would race that reload.
    await expect(page.locator(CHIP)).to_have_count(2)
    (folder_of(session) / "dot.png").write_bytes(PIXEL)
    await page.click("#workspace-toggle")
    tree = page.locator("#file-tree")
    await expect(tree.locator(":scope > li > .name")).to_have_text(
        [".craft-demo-agent/", "docs/", "app.py", "dot.png"]
    )
    await tree.get_by_role("button", name="docs/").click()
    await tree.get_by_role("button", name="README.md").click()
    await expect(page.locator("#file-preview .preview-body h3")).to_have_text("Notes")
    await expect(page.locator("#file-preview .preview-body em")).to_have_text("text")
    await tree.get_by_role("button", name="app.py").click()
    await expect(page.locator("#file-preview code")).to_have_text("print('hello')")
    download = page.locator("#file-preview a.download")
    href = await download.get_attribute("href")
    answer = await page.request.get(f"{craft_server.url}{href}")  # the page's cookies
    assert await answer.body() == b"print('hello')"
    assert answer.headers["content-disposition"].startswith("attachment")
    await tree.get_by_role("button", name="dot.png").click()
    await expect(page.locator("#file-preview img")).to_have_attribute("alt", "dot.png")
    loaded = "img => img.decode().then(() => img.naturalWidth, () => 'not an image')"
    assert await page.locator("#file-preview img").evaluate(loaded) == 1
    await expect(page.locator("#download-all")).to_have_attribute(
        "href", f"/api/sessions/{session.pk}/archive"
    )
    await accessible_unclipped(page, "the workspace panel's files")
    await snap(page, "workspace-files")
    # A new file from the next turn shows without reloading the page.
    await allowed_turn(page, "write later.txt new", 3)
    await expect(tree.get_by_role("button", name="later.txt")).to_be_visible()
    # Esc closes the panel, and does not stop anything.
    await tree.get_by_role("button", name="later.txt").focus()
    await page.keyboard.press("Escape")
    await expect(page.locator("#workspace")).to_be_hidden()


async def test_a_turns_changes_are_reviewed_and_reverted_by_hunk_file_and_turn(
    page, craft_server, session
):
    folder = folder_of(session)
    lines = [str(n) for n in range(1, 31)]
    await open_page(page, craft_server, session)
    await allowed_turn(page, "write f.txt " + "\n".join(lines) + "\n", 1)
    lines[2], lines[24] = "three", "twenty-five"
    await allowed_turn(page, "write f.txt " + "\n".join(lines) + "\n", 2)
    await allowed_turn(page, "write g.txt gee", 3)
    chips = page.locator(CHIP)
    await expect(chips).to_have_text(["1 file changed"] * 3)
    # Exactly one diff per write: the tool card's, not the permission card's too.
    await expect(page.locator("#transcript .diff")).to_have_count(3)
    await chips.nth(1).click()
    await expect(page.locator("#panel-changes")).to_be_visible()
    change = page.locator("#change-list li.change[data-change]").nth(1)
    await expect(change.locator(".change-title")).to_contain_text("Turn: write f.txt")
    hunks = change.locator(".hunk")
    await expect(hunks).to_have_count(2)
    await expect(hunks.nth(1).locator(".add")).to_have_text("twenty-five")
    await snap(page, "workspace-changes")
    await accessible_unclipped(page, "the workspace panel's changes")
    # Revert the second hunk: a first click arms it, the second reverts.
    revert_hunk = hunks.nth(1).get_by_role("button", name="Revert hunk")
    await revert_hunk.click()
    await expect(hunks.nth(1).get_by_role("button", name="Confirm: revert hunk")).to_be_visible()
    assert "twenty-five" in (folder / "f.txt").read_text()  # not yet
    await hunks.nth(1).get_by_role("button", name="Confirm: revert hunk").click()
    await expect(chips.last).to_have_text(
        "Reverted a change to f.txt to before a turn: 1 file changed"
    )
    text = (folder / "f.txt").read_text()
    assert "three" in text and "twenty-five" not in text
    await expect(page.locator("#revert-note")).to_be_visible()
    await page.get_by_role("button", name="Tell the agent").click()
    await expect(page.locator("#prompt")).to_have_value(
        "I reverted f.txt in the workspace; the files are not as you left them. "
        "Look again before you go on."
    )
    await page.fill("#prompt", "")
    # Revert the first turn's whole change: the file did not exist before it, nor does
    # anything a later turn wrote.
    first = page.locator("#change-list li.change").first
    await first.get_by_role("button", name="Revert turn").click()
    await first.get_by_role("button", name="Confirm: revert turn").click()
    await expect(chips).to_have_count(5)
    assert not (folder / "f.txt").exists() and not (folder / "g.txt").exists()
    # What is reverted offers no revert of it again.
    await expect(first.locator(".change-reverted")).to_have_text("Reverted")
    await expect(first.get_by_role("button", name="Revert turn")).to_have_count(0)
    # And undo that revert from its own entry: the turn is revertable again.
    undo = page.locator("#change-list li.change").nth(4)
    await undo.get_by_role("button", name="Undo this revert").click()
    await undo.get_by_role("button", name="Confirm: undo this revert").click()
    await expect(chips).to_have_count(6)
    assert (folder / "g.txt").read_text() == "gee"
    await expect(undo.locator(".change-reverted")).to_have_text("Undone")
    await expect(first.get_by_role("button", name="Revert turn")).to_be_visible()
    # Revert one file of a turn while other files stay; the file offers no second revert.
    third = page.locator("#change-list li.change").nth(2)
    await third.locator("summary").first.click()
    await third.get_by_role("button", name="Revert file").click()
    await third.get_by_role("button", name="Confirm: revert file").click()
    await expect(chips).to_have_count(7)
    assert not (folder / "g.txt").exists() and (folder / "f.txt").exists()
    third = page.locator("#change-list li.change").nth(2)
    await expect(third.locator(".file-reverted")).to_have_text("reverted")
    await expect(third.locator(".change-reverted")).to_have_text("Reverted")  # its one file
    await third.locator("summary").first.click()
    await expect(third.locator(".file-diff")).to_be_visible()
    await expect(third.get_by_role("button", name="Revert file")).to_have_count(0)
    await expect(third.get_by_role("button", name="Revert hunk")).to_have_count(0)
    await snap(page, "workspace-reverted-file")


async def test_a_revert_while_the_agent_works_is_refused_and_says_why(page, craft_server, session):
    await open_page(page, craft_server, session)
    await allowed_turn(page, "write notes.txt hello", 1)
    await send_prompt(page, "write notes.txt again")
    await expect(
        page.locator("#transcript .permission .options button:not([disabled])")
    ).to_have_count(2)
    await page.locator(CHIP).click()
    first = page.locator("#change-list li.change").first
    await first.get_by_role("button", name="Revert turn").click()
    await first.get_by_role("button", name="Confirm: revert turn").click()
    await expect(page.locator("#workspace-error")).to_have_text(
        "Not reverted: The agent is working: revert once its turn ends."
    )
    assert (folder_of(session) / "notes.txt").read_text() == "hello"
    # The turn ends here: one left waiting would hold the module's server up at its stop.
    await (
        page.locator("#transcript .permission .options button:not([disabled])")
        .filter(has_text="Allow")
        .click()
    )
    await expect(page.locator(TURN_END)).to_have_count(2)


async def test_at_completes_files_of_the_workspace_never_mentioned(page, craft_server, session):
    await open_page(page, craft_server, session)
    await allowed_turn(page, "write src/module.py x = 1", 1)
    (folder_of(session) / "src" / "other.py").write_text("y = 2\n")  # never mentioned
    options = page.locator("#palette [role=option] .name")
    await page.fill("#prompt", "look at @sr")
    await expect(options.first).to_have_text("@src/")
    await page.press("#prompt", "Tab")
    await expect(page.locator("#prompt")).to_have_value("look at @src/")
    await expect(options).to_have_text(["@src/module.py", "@src/other.py"])
    await page.keyboard.type("ot")
    await expect(options).to_have_text(["@src/other.py"])
    await page.press("#prompt", "Tab")
    await expect(page.locator("#prompt")).to_have_value("look at @src/other.py ")


async def test_the_tool_card_and_the_changes_panel_count_an_edit_alike(page, craft_server, session):
    """An edit that adds lines after a last line with no newline: git counts that line as
    changed, and so does the tool card."""
    await open_page(page, craft_server, session)
    await allowed_turn(page, "write h.txt one\ntwo", 1)
    await allowed_turn(page, "write h.txt one\ntwo\nthree\nfour", 2)
    card = page.locator("#transcript .tool .diff-stat").last
    await expect(card).to_have_text(" · 1 line removed, 3 added")
    await page.locator(CHIP).nth(1).click()
    change = page.locator("#change-list li.change[data-change]").nth(1)
    await expect(change.locator(".counts").first).to_have_text("+3 \u22121")
    await snap(page, "workspace-counts-alike")
