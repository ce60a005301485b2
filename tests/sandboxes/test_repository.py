"""A session on a repository, on the local backend as people run it: as root, sandbox users,
the jail, the sandbox's own network (the git host allowed through CRAFT_SANDBOX_ALLOW) and
its budget, against a real git host (`tests.git_server`)."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sandboxes import services
from sandboxes.backends import containment, forget_backends
from sandboxes.repository import GitRefused, Remote, Repository
from tests.git_server import GitServer, git_server, random_bytes  # noqa: F401

from .hostile import ask, contain, needs_root, open_agent

pytestmark = needs_root

TOKEN = "hosttoken-4f1d2a9c8b7e"
READER = "readonly-7c3b1e0a"
BRANCH = "craft/fix-the-bug-1a2b"


@pytest.fixture
def host(settings, machine, git_server) -> GitServer:  # noqa: F811
    """The git host, reachable from the test's sandboxes (and nothing else of this machine)."""
    contain(settings, "on")
    settings.CRAFT_SANDBOX_NETWORK = "isolated"
    settings.CRAFT_SANDBOX_ALLOW = [(ipaddress.ip_address("127.0.0.1"), git_server.port)]
    forget_backends()
    return git_server


class Session:
    """A session of the owner's, its workspace, and its repository as Craft works it."""

    def __init__(self, owner) -> None:
        self.session, self.agent = open_agent(owner)
        self.sandbox = self.session.sandbox
        self.folder = Path(services.workspace_path(self.sandbox, self.session.pk))
        self.root = self.folder.parent.parent
        for entry in self.folder.iterdir():  # what the agent left: a clone wants it empty
            subprocess.run(["rm", "-rf", str(entry)], check=True)
        self.repository: Repository = services.session_repository(self.sandbox, self.session.pk)

    def write(self, name: str, content: bytes) -> Path:
        """Write a file of the workspace as the agent would (as the sandbox's user)."""
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        uid = self.folder.stat().st_uid
        os.chown(path, uid, uid)
        return path

    def git(self, *args: str) -> str:
        """Run git in the workspace as the agent would (its own configuration and all)."""
        uid = self.folder.stat().st_uid
        done = subprocess.run(
            [*containment.as_user(containment.SandboxUser(uid, uid)), "git", *args],
            cwd=self.folder, capture_output=True, check=True,
            env={"PATH": containment.SYSTEM_PATH, "HOME": str(self.root / "home"),
                 "GIT_CONFIG_NOSYSTEM": "1"},
        )  # fmt: skip
        return done.stdout.decode().strip()

    def clone(self, remote: Remote, progress=None, **options) -> object:
        options = {"base": None, "max_bytes": 50 << 20, "timeout": 60, **options}
        return self.repository.clone(
            remote, branch_name=BRANCH, progress=progress or (lambda step: None), **options
        )


@pytest.fixture
def session(host, owner) -> Session:
    return Session(owner)


def private(host: GitServer, name: str = "team/app.git", **options) -> Remote:
    url = host.create(name, writers=(TOKEN,), readers=(READER,), **options)
    return Remote(url, TOKEN, allow_http=True)


def files_of(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()]


def test_it_clones_a_private_repository_with_the_owners_token(host, session, caplog):
    caplog.set_level(logging.DEBUG)
    remote = private(
        host, files={"app.py": b"print('hi')\n"}, branches={"develop": {"dev.txt": b"dev\n"}}
    )
    steps: list[dict] = []

    cloned = session.clone(remote, steps.append)

    assert cloned.base == "main" and cloned.branch == BRANCH
    assert cloned.commit == host.branches("team/app.git")["main"]
    assert (session.folder / "app.py").read_bytes() == b"print('hi')\n"
    assert {step["phase"] for step in steps} >= {"receiving", "checkout"}
    assert all(step["text"] for step in steps)
    # A normal clone for the agent: its branch, origin without the token, every branch.
    assert session.git("symbolic-ref", "--short", "HEAD") == BRANCH
    assert session.git("remote", "get-url", "origin") == remote.url
    assert "origin/develop" in session.git("branch", "-r")
    assert session.git("rev-parse", "--abbrev-ref", f"{BRANCH}@{{upstream}}") == "origin/main"
    assert TOKEN in host.tokens_seen()
    store = host_stores(session) / str(session.session.pk)
    for path in [*files_of(session.folder), *files_of(session.root), *files_of(store)]:
        assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in caplog.text


def test_it_clones_the_branch_it_is_given(host, session):
    remote = private(host, branches={"develop": {"dev.txt": b"dev\n"}})
    cloned = session.clone(remote, base="develop")
    assert cloned.base == "develop"
    assert (session.folder / "dev.txt").exists()
    assert session.repository.state("develop").behind == 0


def test_a_missing_repository_is_not_found(host, session):
    private(host)
    with pytest.raises(GitRefused) as refused:
        session.clone(Remote(f"{host.url}/team/missing.git", TOKEN, allow_http=True))
    assert refused.value.code == "repository_not_found"
    assert list(session.folder.iterdir()) == []


def test_a_wrong_token_is_refused(host, session):
    remote = private(host)
    for token in ("wrong-token", ""):
        with pytest.raises(GitRefused) as refused:
            session.clone(Remote(remote.url, token, allow_http=True))
        assert refused.value.code == "git_auth_failed"
        assert "access denied" in str(refused.value)
        assert list(session.folder.iterdir()) == []


def test_a_missing_branch_is_said(host, session):
    remote = private(host)
    with pytest.raises(GitRefused) as refused:
        session.clone(remote, base="nope")
    assert refused.value.code == "branch_not_found"
    assert list(session.folder.iterdir()) == []


def test_a_repository_over_the_limit_is_refused_and_leaves_nothing(host, session):
    remote = private(host, files={"big.bin": random_bytes(3 << 20)})
    with pytest.raises(GitRefused) as refused:
        session.clone(remote, max_bytes=1 << 20)
    assert refused.value.code == "repository_too_large"
    assert str(refused.value) == "the repository is larger than 1 MiB"
    assert list(session.folder.iterdir()) == []
    assert not (host_stores(session) / str(session.session.pk)).exists()


def host_stores(session: Session) -> Path:
    return session.root.parent / ".craft" / "git" / str(session.sandbox.id)


def test_a_host_that_stalls_times_out(host, session):
    remote = private(host)
    host.stall_seconds, host.stall_match = 60, "git-upload-pack"
    with pytest.raises(GitRefused) as refused:
        session.clone(remote, timeout=3)
    host.stall_seconds = 0
    assert refused.value.code == "git_timeout"
    assert list(session.folder.iterdir()) == []


def test_a_workspace_that_is_not_empty_is_refused(host, session):
    remote = private(host)
    session.write("notes.txt", b"mine\n")
    with pytest.raises(GitRefused) as refused:
        session.clone(remote)
    assert refused.value.code == "git_failed"
    assert (session.folder / "notes.txt").read_bytes() == b"mine\n"


def test_it_commits_as_the_person_and_says_when_there_is_nothing(host, session):
    session.clone(private(host))
    repository = session.repository
    with pytest.raises(GitRefused) as refused:
        repository.commit("Nothing", name="Olivia", email="olivia@example.com")
    assert refused.value.code == "nothing_to_commit"

    session.write("src/new.py", b"x = 1\n")
    commit = repository.commit("Add new.py", name="Olivia", email="olivia@example.com")

    assert session.git("log", "-1", "--format=%H %an <%ae> %cn %s") == (
        f"{commit} Olivia <olivia@example.com> Olivia Add new.py"
    )
    state = repository.state("main")
    assert (state.branch, state.head, state.ahead, state.behind, state.dirty) == (
        BRANCH, commit, 1, 0, False
    )  # fmt: skip
    session.write("dirty.txt", b"?\n")
    assert repository.state("main").dirty


def test_it_pushes_the_sessions_branch_and_never_forces(host, session):
    remote = private(host)
    session.clone(remote)
    session.write("a.txt", b"one\n")
    first = session.repository.commit("One", name="Olivia", email="olivia@example.com")

    assert session.repository.push(remote, BRANCH, timeout=60) == first
    assert host.branches("team/app.git")[BRANCH] == first
    assert host.read("team/app.git", BRANCH, "a.txt") == b"one\n"

    theirs = host.commit("team/app.git", BRANCH, {"b.txt": b"theirs\n"}, "Someone else")
    session.write("a.txt", b"two\n")
    session.repository.commit("Two", name="Olivia", email="olivia@example.com")
    with pytest.raises(GitRefused) as refused:
        session.repository.push(remote, BRANCH, timeout=60)
    assert refused.value.code == "push_rejected"
    assert host.branches("team/app.git")[BRANCH] == theirs


def test_a_readers_token_cannot_push(host, session):
    remote = private(host)
    session.clone(Remote(remote.url, READER, allow_http=True))
    session.write("a.txt", b"one\n")
    session.repository.commit("One", name="Olivia", email="olivia@example.com")
    with pytest.raises(GitRefused) as refused:
        session.repository.push(Remote(remote.url, READER, allow_http=True), BRANCH, timeout=60)
    assert refused.value.code == "git_auth_failed"


def test_an_update_merges_the_base_and_leaves_conflicts_in_the_worktree(host, session):
    remote = private(host, files={"a.txt": b"base\n", "b.txt": b"b\n"})
    session.clone(remote)
    host.commit("team/app.git", "main", {"c.txt": b"new upstream\n"}, "Upstream adds c")
    assert session.repository.state("main").behind == 0  # not fetched yet

    clean = session.repository.update(remote, "main", timeout=60)
    assert clean.conflicts == []
    assert (session.folder / "c.txt").read_bytes() == b"new upstream\n"
    assert session.repository.state("main").behind == 0

    host.commit("team/app.git", "main", {"a.txt": b"theirs\n"}, "Upstream changes a")
    session.write("a.txt", b"mine\n")
    session.repository.commit("Mine", name="Olivia", email="olivia@example.com")
    updated = session.repository.update(remote, "main", timeout=60)

    assert updated.conflicts == ["a.txt"]
    assert b"<<<<<<<" in (session.folder / "a.txt").read_bytes()
    assert session.repository.state("main").dirty


def test_setup_streams_its_output_and_its_end(host, session):
    session.clone(private(host, files={".craft/setup.sh": b"echo installing\necho done >&2\n"}))
    lines: list[str] = []
    run = session.repository.setup(None, timeout=30, output=lines.append)
    assert (run.ran, run.exit_code, run.timed_out) == (True, 0, False)
    assert lines == ["installing", "done"]

    failed = session.repository.setup(
        "id -u; echo $HOME; echo broken >&2; exit 3", timeout=30, output=lambda line: None
    )
    assert (failed.ran, failed.exit_code, failed.timed_out) == (True, 3, False)
    uid, home, last = failed.tail.split()
    assert int(uid) == session.folder.stat().st_uid  # as the agent runs
    assert home == str(session.root / "home")
    assert last == "broken"

    slow = session.repository.setup("echo started; sleep 60", timeout=2, output=lines.append)
    assert (slow.ran, slow.timed_out, slow.tail) == (True, True, "started\n")


def test_no_setup_is_not_run(host, session):
    session.clone(private(host))
    run = session.repository.setup(None, timeout=30, output=lambda line: None)
    assert run == type(run)(False, None, False, "")


HOSTILE_FILES = {
    ".gitattributes": b"* filter=evil diff=evil\n",
    ".gitmodules": (
        b'[submodule "x"]\n\tpath = x\n\turl = ext::sh -c touch% {marker}\n'
        b'[submodule "y"]\n\tpath = y\n\turl = file:///etc\n'
    ),
    "hooks/post-checkout": b"#!/bin/sh\ntouch {marker}\n",
    ".githooks/post-checkout": b"#!/bin/sh\ntouch {marker}\n",
}


def test_a_repository_cannot_make_crafts_git_run_anything(host, session):
    marker = session.root / "home" / "pwned"
    files = {name: content.replace(b"{marker}", str(marker).encode())
             for name, content in HOSTILE_FILES.items()}  # fmt: skip
    remote = private(host, files=files)
    session.clone(remote)
    session.write("change.txt", b"x\n")
    session.repository.commit("Change", name="Olivia", email="olivia@example.com")
    session.repository.push(remote, BRANCH, timeout=60)
    session.repository.update(remote, "main", timeout=60)
    assert not marker.exists()
    assert not (session.folder / "x").exists() or not any((session.folder / "x").iterdir())


def test_what_the_agent_plants_in_its_git_config_never_gets_the_token(host, session, tmp_path):
    remote = private(host)
    session.clone(remote)
    marker = session.root / "home" / "ran"
    with GitServer(tmp_path / "elsewhere") as elsewhere:
        elsewhere.create("team/app.git", public=True, writers=("x",))
        planted = {
            "core.fsmonitor": f"touch {marker}-fsmonitor; false",
            "credential.helper": f"!touch {marker}-helper; echo password=stolen",
            f"url.{elsewhere.url}/.insteadOf": f"{host.url}/",
            "http.proxy": elsewhere.url,
            "core.hooksPath": ".git/hooks",
            "core.sshCommand": f"touch {marker}-ssh",
        }
        for key, value in planted.items():
            session.git("config", key, value)
        for hook in ("pre-commit", "post-commit", "pre-push", "reference-transaction"):
            session.write(f".git/hooks/{hook}", f"#!/bin/sh\ntouch {marker}-{hook}\n".encode())
            (session.folder / ".git" / "hooks" / hook).chmod(0o755)

        session.write("change.txt", b"x\n")
        session.repository.commit("Change", name="Olivia", email="olivia@example.com")
        session.repository.state("main")
        session.repository.push(remote, BRANCH, timeout=60)
        session.repository.update(remote, "main", timeout=60)

        assert elsewhere.seen == []
    assert BRANCH in host.branches("team/app.git")
    ran = [path.name for path in marker.parent.iterdir() if path.name.startswith("ran")]
    assert ran == []
    assert {seen.token for seen in host.seen if seen.token} == {TOKEN}


def test_the_credential_helper_answers_for_the_remotes_host_only(tmp_path):
    from sandboxes.in_sandbox import git_tool

    url = "https://git.example.com:8443/team/app.git"
    credentials = git_tool.Credentials(url, {"token": TOKEN})
    path = Path(credentials.helper.split()[-1])
    try:
        asked = {
            "protocol=https\nhost=git.example.com:8443\n": True,
            "protocol=https\nhost=GIT.example.com:8443\npath=team/app.git\n": True,
            "protocol=http\nhost=git.example.com:8443\n": False,
            "protocol=https\nhost=git.example.com\n": False,
            "protocol=https\nhost=evil.example.com:8443\n": False,
        }
        for question, answered in asked.items():
            done = subprocess.run(
                [sys.executable, git_tool.__file__, "credential", str(path), "get"],
                input=(question + "\n").encode(), capture_output=True, check=True,
            )  # fmt: skip
            assert (TOKEN.encode() in done.stdout) is answered, question
    finally:
        credentials.remove()
    assert not path.exists()


SCAN = """\
import os, sys
token = sys.argv[1][::-1].encode()
found = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as handle:
                    if token in handle.read():
                        found.append(f"{pid}/{name}")
            except OSError:
                pass
for folder in sys.argv[2:]:
    for parent, _, names in os.walk(folder):
        for name in names:
            try:
                with open(os.path.join(parent, name), "rb") as handle:
                    if token in handle.read():
                        found.append(os.path.join(parent, name))
            except OSError:
                pass
print("processes", len([p for p in os.listdir("/proc") if p.isdigit()]), file=sys.stderr)
print("found", *found, file=sys.stderr)
"""


def test_the_token_is_nowhere_the_agent_can_look_while_git_runs(host, session):
    remote = private(host)
    scan = session.root / "home" / "scan.py"
    scan.write_text(SCAN)
    python = containment.sandbox_python(uids=True)
    look = f"exec {python} {scan} {TOKEN[::-1]} {session.folder} {session.root}"

    def while_stalled(run) -> dict:
        host.stalled.clear()
        host.stall_seconds, host.stall_match = 30, "git-"
        failures: list[BaseException] = []

        def work() -> None:
            try:
                run()
            except BaseException as exc:
                failures.append(exc)

        worker = threading.Thread(target=work)
        worker.start()
        assert host.stalled.wait(30)
        seen = ask(session.agent, look)
        host.stall_seconds = 0
        worker.join(60)
        assert not failures
        return seen

    seen = while_stalled(lambda: session.clone(remote))
    assert seen["code"] == 0 and seen["stderr"].splitlines()[-1] == "found", seen
    session.write("a.txt", b"x\n")
    session.repository.commit("A", name="Olivia", email="olivia@example.com")
    seen = while_stalled(lambda: session.repository.push(remote, BRANCH, timeout=60))
    assert seen["stderr"].splitlines()[-1] == "found", seen
    assert TOKEN in host.tokens_seen()


def test_checkpoints_and_changes_work_on_a_clone(host, session):
    session.clone(private(host, files={"a.txt": b"a\n"}))
    workspace = services.session_workspace(session.sandbox, session.session.pk)
    before = workspace.checkpoint("before the turn")
    session.write("a.txt", b"changed\n")
    session.repository.commit("Change a", name="Olivia", email="olivia@example.com")
    session.write("b.txt", b"new\n")
    after = workspace.checkpoint("after the turn")

    changed = workspace.changes(before.commit, after.commit)
    assert sorted(f["path"] for f in changed["files"]) == ["a.txt", "b.txt"]
    workspace.revert(before.commit, after.commit, "a.txt")
    assert (session.folder / "a.txt").read_bytes() == b"a\n"
    assert json.loads(json.dumps(before.repositories)) == []


def test_the_store_goes_with_the_workspace_and_is_counted(host, session):
    session.clone(private(host, files={"big.bin": random_bytes(2 << 20)}))
    store = host_stores(session) / str(session.session.pk)
    assert (store / "HEAD").exists()
    assert oct(host_stores(session).parent.stat().st_mode & 0o777) == "0o700"
    used = services.get_backend("local").disk_usage(session.sandbox)
    assert used is not None and used > 4 << 20  # the clone and its store
    services.get_backend("local").remove_workspace(session.sandbox, session.session.pk)
    assert not store.exists()
