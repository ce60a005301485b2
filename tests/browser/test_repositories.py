"""Sessions on a repository as a person uses them in Chromium: a token stored on the Keys page,
a session opened from the home page's form, its clone followed in the header, the demo agent's
edit committed, pushed and offered as a pull request, the pull request merged on the host and
shown so. Real daphne, a real git host (`git http-backend`, tests/git_server.py) reached from
the sandbox through CRAFT_SANDBOX_ALLOW, and a fake GitHub API (tests/fake_git_hosts.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import pytest_asyncio
from django.utils import timezone
from playwright.async_api import expect

from craft.models import Event, Session, SessionRepository
from craft.storage.db import db_sync_to_async
from tests.fake_git_hosts import FakeHost
from tests.git_server import GitServer

from .conftest import assert_accessible, serve, signed_in_page, snap
from .test_chat_page import TURN_END, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

TOKEN = "ghp-browser-0123456789-abcd"
REPOSITORY = "team/app.git"
# git's progress, seen in the header: a file git cannot compress makes a pack worth receiving.
BIG_FILE = bytes(range(256)) * 8192


@pytest.fixture(scope="module")
def git_host(tmp_path_factory):
    with GitServer(tmp_path_factory.mktemp("git-host")) as server:
        yield server


@pytest.fixture(scope="module")
def github(git_host):
    with FakeHost("github") as api:
        yield api


@pytest.fixture(scope="module")
def repository_server(django_db_setup, tmp_path_factory, git_host, github):
    """The app, with the git host as a GitHub whose API is the fake's, reachable from the
    sandbox (the only loopback port it may reach)."""
    folder = tmp_path_factory.mktemp("repositories")
    (folder / "hosts.toml").write_text(github.toml(host=f"127.0.0.1:{git_host.port}"))
    env = {
        "CRAFT_GIT_HOSTS_FILE": str(folder / "hosts.toml"),
        "CRAFT_SANDBOX_ALLOW": f"127.0.0.1:{git_host.port}",
    }
    with serve(env, folder / "sandboxes") as server:
        yield server


@pytest_asyncio.fixture
async def page(browser, repository_server, owner):
    page = await signed_in_page(browser, repository_server, owner)
    # Every progress line the header shows, however briefly (a small clone is quick).
    await page.add_init_script(
        """window.craftProgress = [];
        new MutationObserver(() => {
          const text = document.getElementById("repo-progress-text");
          if (text && text.textContent && !text.closest("[hidden]")) {
            window.craftProgress.push(text.textContent);
          }
        }).observe(document,
          {subtree: true, childList: true, characterData: true, attributes: true});"""
    )
    yield page
    await page.context.close()


async def store_token(page, server, host: str) -> None:
    await page.goto(f"{server.url}/keys/")
    section = page.locator("section.git-host").filter(has_text=host)
    await section.get_by_label(re.compile("your token for")).fill(TOKEN)
    await section.locator("form.key-form button[type=submit]").click()
    await expect(page.locator("section.git-host").filter(has_text=host)).to_contain_text("abcd")


async def open_on(page, server, url: str, branch: str = "") -> str:
    """Open a session on `url` from the home page's form; return its id."""
    await page.goto(f"{server.url}/")
    await page.get_by_label(re.compile("^Repository")).fill(url)
    if branch:
        await page.get_by_label(re.compile("^Branch")).fill(branch)
    await page.get_by_role("button", name="Start a new session").click()
    await expect(page).to_have_url(re.compile(r"/sessions/[0-9a-f-]{36}/$"))
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    return page.url.rstrip("/").rsplit("/", 1)[1]


@db_sync_to_async
def pull_request_read_long_ago(session_id: str) -> None:
    """As if its state was last read from the host minutes ago (it is read at most every 30 s)."""
    SessionRepository.objects.filter(session_id=session_id).update(
        pull_request_checked_at=timezone.now() - timedelta(minutes=5)
    )


async def test_a_private_repository_from_token_to_merged_pull_request(
    page, repository_server, git_host, github
):
    url = git_host.create(
        REPOSITORY, {"README.md": b"# App\n", "big.bin": BIG_FILE}, writers=(TOKEN,)
    )
    github.add_token(TOKEN, "olivia")
    github.add_repository("team/app")
    host = f"127.0.0.1:{git_host.port}"
    await store_token(page, repository_server, host)

    # The pack is held until the queued prompt said it waits (released below, whatever the
    # machine's load): the first prompt, sent while it clones, says it waits.
    git_host.stall_match, git_host.stall_seconds = "git-upload-pack", 60.0
    session_id = await open_on(page, repository_server, url)
    head = page.locator("#repo-line")
    await expect(head.locator("#repo-link")).to_have_text("team/app")
    await expect(head.locator("#repo-link")).to_have_attribute("href", url)
    await expect(head.locator("#repo-branch")).to_have_text(
        re.compile(r"^craft/session-[0-9a-f]{8}$")
    )
    await send_prompt(page, "write notes.txt hello from the agent")
    await expect(page.locator("#queue-why")).to_contain_text("waiting for the repository")
    await snap(page, "repository-cloning")
    git_host.stall_seconds = 0.0

    await expect(head.locator("#repo-status")).to_have_text(re.compile(r"^Ready at [0-9a-f]{7}$"))
    assert any("objects" in line for line in await page.evaluate("window.craftProgress"))
    await (
        page.locator("#transcript .permission .options button:not([disabled])")
        .filter(has_text="Allow")
        .click()
    )
    await expect(page.locator(TURN_END)).to_have_count(1)
    assert await db_sync_to_async(
        Event.objects.filter(
            session_id=session_id, kind="repository_status", data__progress__isnull=False
        ).exists
    )()

    # Commit, with the drafted message edited.
    await page.locator("#workspace-toggle").click()
    await page.locator("#tab-changes").click()
    panel = page.locator("#repo-panel")
    await expect(panel.locator("#repo-state")).to_contain_text("uncommitted changes")
    await panel.get_by_role("button", name="Commit", exact=True).click()
    message = panel.get_by_label("Commit message")
    await expect(message).not_to_have_value("")
    drafted = await message.input_value()
    assert "write notes.txt" in drafted
    await message.fill(f"Add the agent's notes\n\n{drafted}")
    await assert_accessible(page, "the Repository section, committing")
    await panel.get_by_role("button", name="Commit all changes").click()
    await expect(panel.locator("#repo-result")).to_contain_text(
        re.compile(r"Committed [0-9a-f]{7}")
    )
    await expect(
        page.locator("#transcript .repo-card[data-action=repository_committed]")
    ).to_contain_text("Add the agent's notes")
    await expect(panel.locator("#repo-state")).to_contain_text("1 ahead")
    await expect(panel.locator("#repo-state")).to_contain_text("nothing uncommitted")

    # Nothing more to commit: said plainly.
    await panel.get_by_role("button", name="Commit", exact=True).click()
    await panel.get_by_role("button", name="Commit all changes").click()
    await expect(panel.locator("#repo-error")).to_have_text(re.compile("^Nothing to commit"))
    await panel.get_by_role("button", name="Cancel").first.click()

    # Push: the branch is on the host, with the commit.
    await panel.get_by_role("button", name="Push").click()
    await expect(panel.locator("#repo-result")).to_contain_text("Pushed craft/session-")
    branch = await head.locator("#repo-branch").text_content()
    assert branch in git_host.branches(REPOSITORY)
    assert git_host.read(REPOSITORY, branch, "notes.txt").startswith(b"hello from the agent")
    assert git_host.log(REPOSITORY, branch, "%s")[0] == "Add the agent's notes"

    # Open the pull request, its title edited; its link is shown.
    await panel.get_by_role("button", name="Open pull request").click()
    title = panel.get_by_label("Title")
    await expect(title).not_to_have_value("")
    await expect(panel.get_by_label("Description")).to_have_value(re.compile(session_id))
    await title.fill("Notes from the agent")
    await panel.get_by_role("button", name="Open the pull request").click()
    link = panel.locator("#repo-panel-pr a")
    await expect(link).to_have_text(re.compile(r"^Pull request #\d+$"))
    (pull,) = github.pulls("team/app")
    assert (pull.title, pull.head, pull.base) == ("Notes from the agent", branch, "main")
    await expect(link).to_have_text(f"Pull request #{pull.number}")
    await expect(link).to_have_attribute("href", re.compile(rf"/team/app/pull/{pull.number}$"))
    await expect(panel.locator("#repo-panel-pr .pr-state")).to_have_text("Open")
    await expect(head.locator("#repo-pr .pr-state")).to_have_text("Open")
    item = page.locator(f"#session-{session_id}")
    await expect(item.locator(".session-repo")).to_contain_text("team/app")
    await expect(item.locator(".session-state.pr")).to_have_text("PR open")
    await snap(page, "repository-pull-request")

    # Merged on the host: the panel's next look shows it, and so do the header and the list.
    github.merge("team/app", pull.number)
    await pull_request_read_long_ago(session_id)
    await page.locator("#tab-files").click()
    await page.locator("#tab-changes").click()
    await expect(panel.locator("#repo-panel-pr .pr-state")).to_have_text("Merged")
    await expect(head.locator("#repo-pr .pr-state")).to_have_text("Merged")
    await expect(item.locator(".session-state.pr")).to_have_text("PR merged")
    await expect(
        page.locator("#transcript .repo-card[data-action=pull_request_updated]")
    ).to_contain_text(f"Pull request #{pull.number} is now merged")


async def test_a_missing_repository_fails_with_the_plain_reason(page, repository_server, git_host):
    url = f"{git_host.url}/team/nowhere.git"
    session_id = await open_on(page, repository_server, url)
    status = page.locator("#repo-status")
    await expect(status).to_have_text(re.compile(r"^Clone failed: \S"))
    reason = await status.text_content()
    assert "Traceback" not in reason and "fatal:" not in reason
    await expect(page.locator("#repo-line")).to_have_attribute("data-status", "failed")
    await expect(page.locator(f"#session-{session_id} .session-state.failed")).to_have_text(
        "Clone failed"
    )
    await page.locator("#workspace-toggle").click()
    await page.locator("#tab-changes").click()
    await expect(page.locator("#repo-commit")).to_be_disabled()
    # The page, loaded again, says the same from what the server stored.
    await page.reload()
    await expect(page.locator("#repo-status")).to_have_text(reason)


async def test_a_host_the_server_does_not_know_is_refused_in_the_form(
    page, repository_server, owner
):
    await page.goto(f"{repository_server.url}/")
    await page.get_by_label(re.compile("^Repository")).fill("https://elsewhere.example/team/app")
    await page.get_by_role("button", name="Start a new session").click()
    error = page.locator("#new-session-error")
    await expect(error).to_contain_text("No session was opened")
    await expect(page.get_by_label(re.compile("^Repository"))).to_have_value(
        "https://elsewhere.example/team/app"
    )
    await expect(page).to_have_url(f"{repository_server.url}/")
    assert not await db_sync_to_async(Session.objects.filter(owner=owner).exists)()


async def test_another_persons_session_on_a_repository_is_not_found(
    browser, page, repository_server, git_host, stranger
):
    url = git_host.create("team/public.git", public=True)
    session_id = await open_on(page, repository_server, url)
    await expect(page.locator("#repo-status")).to_have_text(re.compile("^Ready"))
    other = await signed_in_page(browser, repository_server, stranger)
    try:
        answer = await other.goto(f"{repository_server.url}/sessions/{session_id}/")
        assert answer is not None and answer.status == 404
        await other.goto(f"{repository_server.url}/")
        token = await other.locator("input[name=csrfmiddlewaretoken]").first.input_value()
        for path in ("", "commit/", "push/", "pull-request/", "update/"):
            api = f"{repository_server.url}/api/sessions/{session_id}/repository/{path}"
            if path:
                response = await other.request.post(api, headers={"X-CSRFToken": token}, data={})
            else:
                response = await other.request.get(api)
            assert response.status == 404, (path, response.status)
            assert (await response.json())["error"]["code"] == "not_found"
    finally:
        await other.context.close()


async def test_an_update_with_conflicts_lists_each_file_and_opens_it(
    page, repository_server, git_host
):
    url = git_host.create("team/clash.git", {"notes.txt": b"ours and theirs\n"}, public=True)
    await open_on(page, repository_server, url)
    await expect(page.locator("#repo-status")).to_have_text(re.compile("^Ready"))
    await send_prompt(page, "write notes.txt mine")
    await page.locator("#transcript .permission .options button").filter(has_text="Allow").click()
    await expect(page.locator(TURN_END)).to_have_count(1)
    await page.locator("#workspace-toggle").click()
    await page.locator("#tab-changes").click()
    panel = page.locator("#repo-panel")
    await panel.get_by_role("button", name="Commit", exact=True).click()
    await panel.get_by_role("button", name="Commit all changes").click()
    await expect(panel.locator("#repo-result")).to_contain_text("Committed")
    git_host.commit("team/clash.git", "main", {"notes.txt": b"theirs\n"}, "Theirs")

    await panel.get_by_role("button", name="Update from remote").click()
    await expect(panel.locator("#repo-result")).to_contain_text("1 file is in conflict")
    # A merge left in conflict is not made yet: the files wait, uncommitted.
    await expect(panel.locator("#repo-state")).to_contain_text("uncommitted changes")
    card = page.locator("#transcript .repo-card[data-action=repository_updated]")
    await expect(card).to_contain_text("Updated from main: 1 file is in conflict")
    await card.get_by_role("button", name="Open notes.txt (in conflict)").click()
    await expect(page.locator("#tab-files")).to_have_attribute("aria-selected", "true")
    await expect(page.locator("#file-preview .preview-path")).to_have_text("notes.txt")
    await expect(page.locator("#file-preview pre")).to_contain_text("<<<<<<<")

    # The repository is offered again on the home page: one click opens a new session on it.
    await page.goto(f"{repository_server.url}/")
    await page.get_by_role("button", name="team/clash").click()
    await expect(page).to_have_url(re.compile(r"/sessions/[0-9a-f-]{36}/$"))
    await expect(page.locator("#repo-link")).to_have_text("team/clash")


async def test_a_failed_set_up_is_said_with_its_output_and_the_session_goes_on(
    page, repository_server, git_host
):
    script = b"#!/bin/sh\necho installing the dependencies\nexit 3\n"
    url = git_host.create("team/setup.git", {".craft/setup.sh": script}, public=True)
    await open_on(page, repository_server, url)
    status = page.locator("#repo-status")
    await expect(status).to_have_text(
        re.compile(r"^Ready at [0-9a-f]{7} · its set-up failed \(exit 3\)")
    )
    setup = page.locator("#repo-setup")
    await setup.locator("summary").click()
    await expect(setup.locator("pre")).to_contain_text("installing the dependencies")
    await send_prompt(page, "hello")
    await expect(page.locator(TURN_END)).to_have_count(1)
