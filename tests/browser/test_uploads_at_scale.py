"""Uploads at the sizes the workbench promises, in Chromium, on a server with the default
CRAFT_UPLOAD_MAX_BYTES (100 MiB): a folder of 1,000 files chosen with the folder picker lands
whole, and a 150 MiB file is refused with nothing written, whether the page refuses it before
sending or a client sends it anyway (the server cuts it off at the limit)."""

from __future__ import annotations

import asyncio
import http.client
import json
from pathlib import Path
from urllib.parse import urlparse

import pytest
from playwright.async_api import expect

from tests.ready import open_ready_session

from .conftest import snap
from .test_uploads import ROWS, open_files, read

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

MiB = 1 << 20


def put_file(url: str, session_id, path: Path, cookies: dict[str, str]) -> tuple[int, bytes]:
    """PUT the file at `path` as the page's user would, streamed from disk (not through the
    page, which refuses it before sending)."""
    where = urlparse(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=120)
    try:
        with path.open("rb") as body:
            connection.request(
                "PUT", f"/api/sessions/{session_id}/files/raw?path={path.name}", body=body,
                headers={"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()),
                         "X-CSRFToken": cookies["csrftoken"], "Origin": url,
                         "Content-Length": str(path.stat().st_size)},
            )  # fmt: skip
            answer = connection.getresponse()
            return answer.status, answer.read()
    finally:
        connection.close()


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Uploads at scale")


async def test_a_folder_of_a_thousand_files_lands_whole(page, craft_server, session, tmp_path):
    chosen = tmp_path / "corpus"
    for n in range(1000):
        folder = chosen / f"part-{n // 100:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"file-{n:04d}.txt").write_text(f"file {n}\n")
    await open_files(page, craft_server, session)
    await page.set_input_files("#upload-folder-input", chosen)
    rows = page.locator(ROWS)
    await expect(rows).to_have_count(1000)
    await expect(page.locator(f"{ROWS}[data-state=done]")).to_have_count(1000, timeout=300_000)
    await expect(page.locator(f"{ROWS}:not([data-state=done])")).to_have_count(0)
    for n in (0, 499, 999):
        path = f"corpus/part-{n // 100:02d}/file-{n:04d}.txt"
        assert await read(page, craft_server, session, path) == f"file {n}\n".encode(), path
    listing = await page.request.get(
        f"{craft_server.url}/api/sessions/{session.pk}/files/",
        params={"path": "corpus/part-07"},
    )
    assert listing.ok
    names = sorted(entry["name"] for entry in (await listing.json())["entries"])
    assert names == [f"file-{n:04d}.txt" for n in range(700, 800)]
    await snap(page, "uploads-thousand-files")


async def test_a_file_of_150_mib_is_refused_and_nothing_is_written(
    page, craft_server, session, tmp_path
):
    huge = tmp_path / "video.bin"
    with huge.open("wb") as out:  # sparse: 150 MiB to whoever reads it
        out.truncate(150 * MiB)
    await open_files(page, craft_server, session)
    sent = []
    page.on("request", lambda request: sent.append(request.url) if request.method == "PUT" else 0)
    await page.set_input_files("#upload-input", huge)
    row = page.locator(ROWS).filter(has_text="video.bin")
    await expect(row.locator(".upload-state")).to_have_text(
        "Not uploaded: larger than 100 MiB: not sent"
    )
    assert sent == []
    # A client that sends it anyway is cut off at the limit, and nothing is written.
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    status, body = await asyncio.to_thread(put_file, craft_server.url, session.pk, huge, cookies)
    assert status == 413
    assert json.loads(body)["error"]["code"] == "too_large"
    assert await read(page, craft_server, session, "video.bin") is None
    # The next upload goes through as usual.
    await page.set_input_files(
        "#upload-input", files=[{"name": "small.txt", "mimeType": "text/plain", "buffer": b"ok"}]
    )
    await expect(page.locator(ROWS).filter(has_text="small.txt")).to_have_attribute(
        "data-state", "done"
    )
    assert await read(page, craft_server, session, "small.txt") == b"ok"
    await snap(page, "uploads-150-mib-refused")
