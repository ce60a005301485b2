"""Uploads as a person makes them in Chromium: with the Files panel's button (its progress seen,
a cancel), files and a folder dropped on the panel, a taken name answered Replace, Keep both
and Skip, a file over CRAFT_UPLOAD_MAX_BYTES refused before it is sent, and a file dropped on
the composer reaching the demo agent as a link. Real daphne, real demo agent; what was written
is read back through the files API."""

from __future__ import annotations

import base64
import os

import pytest
from playwright.async_api import expect

from craft.models import Event
from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from .conftest import assert_accessible, serve, snap
from .test_chat_page import TURN_END, open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

LIMIT = 2 << 20  # CRAFT_UPLOAD_MAX_BYTES of this module's server: 2 MiB
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)
REPLY = "#transcript .msg.agent .bubble"
ROWS = "#upload-list li.upload"

# A drop on `selector` of files made in the page ({name, text, folder?}). Files without a folder
# go in a real DataTransfer, as a drop from the desktop brings them. A page cannot make a real
# dropped folder, so files with one come as the file system entries Chromium gives for a folder
# (webkitGetAsEntry), made of real File objects, read in batches as Chromium reads them.
DROP = """([selector, files]) => {
    const data = new DataTransfer();
    const folders = new Map();
    for (const f of files) {
        const file = new File([f.text], f.name, {type: f.type || "text/plain"});
        if (!f.folder) { data.items.add(file); continue; }
        if (!folders.has(f.folder)) folders.set(f.folder, []);
        folders.get(f.folder).push({name: f.name, isFile: true, isDirectory: false,
            file: (ok) => ok(file)});
    }
    const entryOf = (item) => item.webkitGetAsEntry();
    const items = [...data.items].map((item) => ({kind: "file",
        webkitGetAsEntry: () => entryOf(item), getAsFile: () => item.getAsFile()}));
    for (const [name, children] of folders) {
        const [top, ...rest] = name.split("/");
        let entries = children;
        for (const part of rest.reverse()) entries = [folder(part, entries)];
        items.push({kind: "file", webkitGetAsEntry: () => folder(top, entries)});
    }
    function folder(name, children) {
        return {name, isFile: false, isDirectory: true, createReader() {
            let at = 0;
            return {readEntries(ok) { ok(children.slice(at, at + 1)); at += 1; }};
        }};
    }
    const drop = new DragEvent("drop", {bubbles: true, cancelable: true});
    const given = {types: ["Files"], items, files: data.files};
    Object.defineProperty(drop, "dataTransfer", {value: given});
    document.querySelector(selector).dispatchEvent(drop);
    return drop.defaultPrevented;
}"""


@pytest.fixture(scope="module")
def craft_server(django_db_setup, tmp_path_factory):
    """The app with a small upload limit, so that a file over it is cheap to make."""
    with serve(
        {"CRAFT_UPLOAD_MAX_BYTES": str(LIMIT)}, tmp_path_factory.mktemp("upload-sandboxes")
    ) as server:
        yield server


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Uploads")


async def read(page, server, session, path: str) -> bytes | None:
    """The file `path` of the workspace through the files API (None: not there)."""
    answer = await page.request.get(
        f"{server.url}/api/sessions/{session.pk}/files/raw", params={"path": path}
    )
    return await answer.body() if answer.ok else None


async def throttle(page, bytes_per_second: int) -> None:
    """Send at most this many bytes a second from the page (-1: as fast as it goes)."""
    cdp = await page.context.new_cdp_session(page)
    await cdp.send("Network.enable")
    await cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1,
         "uploadThroughput": bytes_per_second},
    )  # fmt: skip


async def open_files(page, server, session) -> None:
    await open_page(page, server, session)
    await page.click("#workspace-toggle")
    await expect(page.locator("#panel-files")).to_be_visible()


async def test_files_uploaded_with_the_button_show_their_progress_and_are_listed(
    page, craft_server, session
):
    data = os.urandom(1_500_000)
    await open_files(page, craft_server, session)
    await expect(page.locator("#upload-target")).to_have_text(
        "Uploads, and files dropped on the page, go to the top of the workspace."
    )
    await throttle(page, 300_000)
    await page.set_input_files(
        "#upload-input",
        files=[{"name": "data.bin", "mimeType": "application/octet-stream", "buffer": data}],
    )
    row = page.locator(ROWS).filter(has_text="data.bin")
    await expect(row).to_have_attribute("data-state", "sending")
    await page.wait_for_function(
        "() => { const bar = document.querySelector('#upload-list progress');"
        " return bar && bar.value > 0 && bar.value < bar.max; }"
    )
    await snap(page, "uploads-progress")
    await throttle(page, -1)
    # Chromium keeps a request's emulated conditions to its end: the file goes on at
    # 300 kB/s, about 5 s in all.
    await expect(row.locator(".upload-state")).to_have_text("Done", timeout=20_000)
    await expect(page.locator("#file-tree").get_by_role("button", name="data.bin")).to_be_visible()
    await page.locator("#file-tree").get_by_role("button", name="data.bin").click()
    href = await page.locator("#file-preview a.download").get_attribute("href")
    assert await (await page.request.get(f"{craft_server.url}{href}")).body() == data
    await assert_accessible(page, "the Files panel after an upload")
    await snap(page, "uploads-done")
    # Cancelled while it goes: nothing is written.
    await throttle(page, 100_000)
    await page.set_input_files(
        "#upload-input", files=[{"name": "slow.bin", "mimeType": "", "buffer": data}]
    )
    slow = page.locator(ROWS).filter(has_text="slow.bin")
    await expect(slow).to_have_attribute("data-state", "sending")
    await slow.get_by_role("button", name="Cancel the upload of slow.bin").click()
    await expect(slow.locator(".upload-state")).to_have_text("Cancelled")
    await throttle(page, -1)
    assert await read(page, craft_server, session, "slow.bin") is None


async def test_files_and_a_folder_dropped_on_the_panel_land_in_the_folder_it_shows(
    page, craft_server, session
):
    await open_files(page, craft_server, session)
    files = [
        {"name": "one.txt", "text": "first"},
        {"name": "two.md", "text": "# second"},
        {"name": "index.html", "text": "<p>hi</p>", "folder": "site"},
        {"name": "logo.svg", "text": "<svg/>", "folder": "site/img"},
    ]
    taken = await page.evaluate(DROP, ["#file-tree", files])
    assert taken
    await expect(page.locator(ROWS).locator(".upload-state")).to_have_text(["Done"] * 4)
    for path, text in [
        ("one.txt", b"first"),
        ("two.md", b"# second"),
        ("site/index.html", b"<p>hi</p>"),
        ("site/img/logo.svg", b"<svg/>"),
    ]:
        assert await read(page, craft_server, session, path) == text, path
    tree = page.locator("#file-tree")
    await expect(tree.get_by_role("button", name="site/")).to_be_visible()
    # Into a folder the tree shows: opened, it is where drops go.
    await tree.get_by_role("button", name="site/").click()
    await expect(page.locator("#upload-target")).to_have_text(
        "Uploads, and files dropped on the page, go to site/."
    )
    await page.evaluate(DROP, ["#transcript", [{"name": "more.txt", "text": "more"}]])
    await expect(page.locator(ROWS).filter(has_text="site/more.txt")).to_have_attribute(
        "data-state", "done"
    )
    assert await read(page, craft_server, session, "site/more.txt") == b"more"
    await expect(tree.get_by_role("button", name="more.txt")).to_be_visible()
    await snap(page, "uploads-dropped")


async def test_a_taken_name_is_asked_about_replace_keep_both_or_skip(page, craft_server, session):
    await open_files(page, craft_server, session)

    async def upload(*names_and_bodies):
        await page.set_input_files(
            "#upload-input",
            files=[{"name": n, "mimeType": "text/plain", "buffer": b} for n, b in names_and_bodies],
        )

    await upload(("notes.txt", b"one"))
    await expect(page.locator(ROWS).last).to_have_attribute("data-state", "done")
    await upload(("notes.txt", b"two"))
    clash = page.locator(ROWS).last.locator(".clash")
    await expect(clash).to_contain_text("notes.txt is already there.")
    await expect(clash.locator(".clash-all")).to_have_count(0)  # one file: no "rest"
    await assert_accessible(page, "a name clash asked")
    await snap(page, "uploads-clash")
    await clash.get_by_role("button", name="Replace").click()
    await expect(page.locator(ROWS).last.locator(".upload-state")).to_have_text("Done")
    assert await read(page, craft_server, session, "notes.txt") == b"two"
    await upload(("notes.txt", b"three"))
    await page.locator(ROWS).last.get_by_role("button", name="Keep both").click()
    await expect(page.locator(ROWS).last.locator(".upload-state")).to_have_text(
        "Done, as notes (1).txt"
    )
    assert await read(page, craft_server, session, "notes.txt") == b"two"
    assert await read(page, craft_server, session, "notes (1).txt") == b"three"
    # Two taken names: "for the rest too" answers both.
    await upload(("notes.txt", b"four"), ("notes (1).txt", b"five"))
    # Answered on the batch's first row, whichever of the two was asked first: the other's
    # question is then open already or comes later, and is answered either way. (A locator
    # of "the first row asking" could move to the other row between the check and the click.)
    first = page.locator(ROWS).nth(-2)
    await first.get_by_label("for the rest too").check()
    await first.get_by_role("button", name="Skip").click()
    await expect(page.locator(ROWS).nth(-1).locator(".upload-state")).to_have_text("Skipped")
    await expect(page.locator(ROWS).nth(-2).locator(".upload-state")).to_have_text("Skipped")
    assert await read(page, craft_server, session, "notes.txt") == b"two"
    assert await read(page, craft_server, session, "notes (1).txt") == b"three"


async def test_a_file_over_the_limit_is_refused_before_it_is_sent(page, craft_server, session):
    await open_files(page, craft_server, session)
    sent = []
    page.on("request", lambda request: sent.append(request) if request.method == "PUT" else None)
    await page.set_input_files(
        "#upload-input",
        files=[
            {"name": "huge.bin", "mimeType": "", "buffer": b"x" * (LIMIT + 1)},
            {"name": "small.txt", "mimeType": "text/plain", "buffer": b"fits"},
        ],
    )
    huge = page.locator(ROWS).filter(has_text="huge.bin")
    await expect(huge.locator(".upload-state")).to_have_text(
        "Not uploaded: larger than 2 MiB: not sent"
    )
    await expect(page.locator(ROWS).filter(has_text="small.txt")).to_have_attribute(
        "data-state", "done"
    )
    assert [r.url for r in sent if "huge.bin" in r.url] == []
    assert await read(page, craft_server, session, "huge.bin") is None
    await snap(page, "uploads-too-large")


@db_sync_to_async
def stored_attachments(session) -> list:
    event = Event.objects.filter(session=session, kind="user_message").order_by("-seq").first()
    return event.data.get("attachments", []) if event else []


async def test_a_file_dropped_on_the_composer_goes_to_the_agent_as_a_link(
    page, craft_server, session
):
    await open_page(page, craft_server, session)
    await send_prompt(page, "hello")
    await expect(page.locator(TURN_END)).to_have_count(1)
    taken = await page.evaluate(
        DROP,
        ["#prompt", [
            {"name": "table.csv", "text": "a,b\n1,2", "type": "text/csv"},
            {"name": "data.json", "text": "{}", "folder": "more"},
        ]],
    )  # fmt: skip
    assert taken
    chips = page.locator("#attachments li")
    await expect(chips).to_have_count(2)
    await expect(chips.nth(0)).to_contain_text("uploads/table.csv")
    await expect(chips.nth(1)).to_contain_text("uploads/more/data.json")
    await snap(page, "uploads-composer")
    await send_prompt(page, "look at these")
    await expect(page.locator(TURN_END)).to_have_count(2)
    await expect(page.locator(REPLY).last).to_contain_text("I received 2 attachment(s)")
    await expect(page.locator(REPLY).last).to_contain_text("link to table.csv")
    assert await stored_attachments(session) == [
        {"type": "file", "path": "uploads/table.csv"},
        {"type": "file", "path": "uploads/more/data.json"},
    ]
    await expect(chips).to_have_count(0)
    assert await read(page, craft_server, session, "uploads/table.csv") == b"a,b\n1,2"
    # The same name again is kept beside it; an image the agent takes stays an image.
    await page.evaluate(
        DROP, ["#prompt", [{"name": "table.csv", "text": "c,d", "type": "text/csv"}]]
    )
    await expect(chips).to_contain_text(["uploads/table (1).csv"])
    png = list(PIXEL)
    await page.evaluate(
        """(bytes) => {
            const data = new DataTransfer();
            data.items.add(new File([new Uint8Array(bytes)], "dot.png", {type: "image/png"}));
            const drop = new DragEvent(
                "drop", {dataTransfer: data, bubbles: true, cancelable: true});
            document.getElementById("prompt").dispatchEvent(drop);
        }""",
        png,
    )
    await expect(chips).to_have_count(2)
    await expect(chips.nth(0)).to_contain_text("dot.png")
    await send_prompt(page, "and these")
    await expect(page.locator(TURN_END)).to_have_count(3)
    await expect(page.locator(REPLY).last).to_contain_text("link to table (1).csv")
    await expect(page.locator(REPLY).last).to_contain_text("image image/png")
    assert await read(page, craft_server, session, "uploads/table (1).csv") == b"c,d"


async def test_a_folder_chosen_with_the_folder_picker_keeps_its_structure(
    page, craft_server, session, tmp_path
):
    chosen = tmp_path / "project"
    (chosen / "src").mkdir(parents=True)
    (chosen / "README.md").write_text("# Project")
    (chosen / "src" / "app.py").write_text("print(1)")
    await open_files(page, craft_server, session)
    await page.set_input_files("#upload-folder-input", chosen)
    await expect(page.locator(ROWS).locator(".upload-state")).to_have_text(["Done"] * 2)
    assert await read(page, craft_server, session, "project/README.md") == b"# Project"
    assert await read(page, craft_server, session, "project/src/app.py") == b"print(1)"
    await expect(page.locator("#file-tree").get_by_role("button", name="project/")).to_be_visible()
