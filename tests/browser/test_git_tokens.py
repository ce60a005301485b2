"""What a person sees of their git tokens on the Keys page: store one, a refused one, delete.

A server of its own whose only git host is a fake Gitea (tests/fake_git_hosts.py).
"""

from __future__ import annotations

import pytest
import pytest_asyncio
from playwright.async_api import expect

from craft.models import GitToken
from craft.storage.db import db_sync_to_async
from tests.fake_git_hosts import FakeHost

from .conftest import assert_accessible, serve, signed_in_page, snap

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

TOKEN = "gitea-token-0123456789-wxyz"


@pytest.fixture(scope="module")
def gitea():
    with FakeHost("gitea") as gitea:
        gitea.add_token(TOKEN, "olivia")
        yield gitea


@pytest.fixture(scope="module")
def hosts_server(django_db_setup, tmp_path_factory, gitea):
    folder = tmp_path_factory.mktemp("git-hosts")
    (folder / "hosts.toml").write_text(gitea.toml())
    with serve({"CRAFT_GIT_HOSTS_FILE": str(folder / "hosts.toml")}, folder / "sandboxes") as s:
        yield s


@pytest_asyncio.fixture
async def page(browser, hosts_server, owner):
    page = await signed_in_page(browser, hosts_server, owner)
    yield page
    await page.context.close()


@db_sync_to_async
def stored_tokens() -> list[tuple[str, str]]:
    return list(GitToken.objects.values_list("host", "hint"))


async def test_a_token_is_refused_plainly_then_stored_then_deleted(page, hosts_server, gitea):
    await page.goto(f"{hosts_server.url}/keys/")
    section = page.locator("section.git-host", has=page.get_by_text(gitea.netloc))
    await expect(section.locator(".key-state")).to_have_text("No token stored.")
    field = section.get_by_label(f"Store your token for {gitea.netloc}")

    await field.fill("not-the-right-token-000")
    await section.get_by_role("button", name="Check and save").click()
    alert = page.locator("section.git-host").get_by_role("alert")
    await expect(alert).to_contain_text(f"{gitea.netloc} refused the token (HTTP 401")
    assert "not-the-right-token" not in await page.content()
    assert await stored_tokens() == []
    await snap(page, "git-tokens-refused")

    await page.locator("section.git-host").get_by_label("Store your token").fill(TOKEN)
    await page.locator("section.git-host").get_by_role("button", name="Check and save").click()
    await expect(page.get_by_role("alert").first).to_contain_text(
        f"Your token for {gitea.netloc} is stored (it belongs to olivia)."
    )
    section = page.locator("section.git-host")
    await expect(section.locator(".key-state")).to_contain_text("(ends in wxyz), for olivia")
    assert TOKEN not in await page.content()
    assert await stored_tokens() == [(gitea.netloc, "wxyz")]
    await assert_accessible(page, "the Keys page with a git token")
    await snap(page, "git-tokens-stored")

    # Deleting asks first: the button is behind a disclosure that says what it costs.
    delete = section.get_by_role("button", name="Delete the token")
    await expect(delete).to_be_hidden()
    await section.get_by_text(f"Delete the token for {gitea.netloc}…").click()
    await expect(section.get_by_text("cannot push or open pull requests")).to_be_visible()
    await delete.click()
    await expect(page.get_by_role("alert").first).to_contain_text(
        f"Your token for {gitea.netloc} is deleted."
    )
    await expect(page.locator("section.git-host .key-state")).to_have_text("No token stored.")
    assert await stored_tokens() == []
