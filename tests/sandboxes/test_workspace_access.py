"""Craft reads a session's workspace through the backend, confined, with the agent's rights.

The workspaces are real: on the local backend a sandbox with a user of its own (the hostile
agent started once, which creates the workspace), files put there as the agent would leave
them (owned by the sandbox's user), and the workspace tool run as that user; on the
kubernetes backend a pod of the test API server, the tool run through pod exec. Each fault of
the list in docs/workspace.md is injected: links out of the workspace, a folder swapped for a
link between listing and reading, a FIFO, a 2 GiB file, 100,000 files, hostile names, a pod
that vanishes mid-download.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import time
import zipfile
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from craft import services as craft_services
from sandboxes import services
from sandboxes.backends import SandboxError
from sandboxes.backends.kubernetes import pod_name
from sandboxes.in_sandbox.workspace_tool import unescape
from sandboxes.workspace import WorkspaceRefused
from tests.conftest import K8S_NAMESPACE

from .workspaces import Workspaces, open_on, read_all

pytestmark = pytest.mark.django_db(transaction=True)


def names(listing) -> list[str]:
    return [entry["name"] for entry in listing.entries]


def test_a_folder_lists_every_kind_of_entry_sorted_and_never_follows_links(workspace):
    workspace.write("notes.txt", b"hello\n")
    workspace.write("src/app.py", b"print(1)\n")
    workspace.link("passwd", "/etc/passwd")
    workspace.link("etc", "/etc")
    os.mkfifo(workspace.folder / "pipe")
    workspace.own(workspace.folder / "pipe")
    with socket.socket(socket.AF_UNIX) as sock:
        short = Path(f"/tmp/craft-{os.getpid()}.sock")  # a socket's path has ~100 bytes at most
        sock.bind(str(short))
        short.rename(workspace.folder / "sock")
    listing = workspace.craft.list_folder("")
    by_name = {entry["name"]: entry for entry in listing.entries}
    assert names(listing)[0] == "src"  # folders first
    assert by_name["notes.txt"]["type"] == "file"
    assert by_name["notes.txt"]["size"] == 6
    assert by_name["passwd"] == {**by_name["passwd"], "type": "link", "target": "/etc/passwd"}
    assert by_name["etc"]["type"] == "link"
    assert by_name["pipe"]["type"] == "fifo"
    assert by_name["sock"]["type"] == "socket"
    assert listing.total == len(listing.entries)
    assert names(workspace.craft.list_folder("src")) == ["app.py"]


def test_links_are_never_read_through_whether_the_file_or_a_folder_on_the_way(
    local_workspace, stranger
):
    workspace = local_workspace
    other = Workspaces(stranger)
    secret = other.write("secret.txt", b"the stranger's")
    workspace.link("passwd", "/etc/passwd")
    workspace.link("etc", "/etc")
    workspace.link("theirs", secret)
    workspace.link("their-folder", other.folder)
    for path, code in [
        ("passwd", "not_a_file"),
        ("etc/passwd", "is_link"),
        ("theirs", "not_a_file"),
        ("their-folder/secret.txt", "is_link"),
    ]:
        with pytest.raises(WorkspaceRefused) as refused:
            workspace.craft.read(path, 1 << 20)
        assert refused.value.code == code, path
    with pytest.raises(WorkspaceRefused) as refused:
        workspace.craft.list_folder("their-folder")
    assert refused.value.code == "is_link"


def test_a_folder_swapped_for_a_link_between_listing_and_reading_is_not_followed(workspace):
    workspace.write("docs/readme.md", b"# docs\n")
    assert names(workspace.craft.list_folder("docs")) == ["readme.md"]
    (workspace.folder / "docs").rename(workspace.folder / "docs.old")
    workspace.link("docs", "/etc")
    with pytest.raises(WorkspaceRefused) as refused:
        workspace.craft.read("docs/passwd", 1 << 20)
    assert refused.value.code == "is_link"


def test_files_are_read_with_the_agents_rights_not_the_servers(local_workspace):
    """A file the agent cannot read (root's, 0600) is refused: the tool is not root."""
    workspace = local_workspace
    private = workspace.write("root-only.txt", b"root's")
    os.chown(private, 0, 0)
    with pytest.raises(WorkspaceRefused) as refused:
        workspace.craft.read("root-only.txt", 1 << 20)
    assert refused.value.code == "denied"
    workspace.write("agents.txt", b"the agent's")
    assert read_all(workspace.craft, "agents.txt") == b"the agent's"


def test_a_fifo_is_listed_and_never_opened(workspace):
    os.mkfifo(workspace.folder / "pipe")
    workspace.own(workspace.folder / "pipe")
    # Had it been opened, the read would block for good (and the test time out).
    with pytest.raises(WorkspaceRefused) as refused:
        workspace.craft.read("pipe", 1 << 20)
    assert refused.value.code == "not_a_file"


def test_hostile_names_are_escaped_and_each_can_be_read_back(workspace):
    hostile = [b"new\nline", b"-rf", b"bad\xffbyte", b"back\\slash", "caf\u00e9".encode()]
    for index, name in enumerate(hostile):
        workspace.write(name, str(index).encode())
    listing = workspace.craft.list_folder("")
    assert set(names(listing)) == {"new\\x0aline", "-rf", "bad\\xffbyte", "back\\\\slash", "café"}
    for index, name in enumerate(hostile):
        spelled = next(n for n in names(listing) if unescape(n) == name)
        assert read_all(workspace.craft, spelled) == str(index).encode()
    for path in ["..", "../..", "src/../../x", "/etc/passwd/.."]:
        with pytest.raises(WorkspaceRefused) as refused:
            workspace.craft.read(path, 1 << 20)
        assert refused.value.code == "invalid_path", path


def test_a_control_character_in_a_path_is_refused_as_invalid_path_on_every_read(workspace):
    """A name with one is spelled `\\xNN`; as such it is no path Craft gives, and a NUL
    cannot be in the tool's argv at all (a ValueError, "embedded null byte", before)."""
    workspace.write("a.txt", b"one\n")
    commit = workspace.craft.checkpoint("start").commit
    reads = {
        "list": lambda path: workspace.craft.list_folder(path),
        "read": lambda path: workspace.craft.read(path, 1 << 20),
        "diff": lambda path: workspace.craft.diff("", commit, path),
        "revert": lambda path: workspace.craft.revert(commit, commit, path),
    }
    for what, call in reads.items():
        for path in ["a\x00.txt", "a.txt\n", "\x1b[31m", "a\x7f", "a\ud800"]:
            with pytest.raises(WorkspaceRefused) as refused:
                call(path)
            assert refused.value.code == "invalid_path", (what, path)
    assert read_all(workspace.craft, "a.txt") == b"one\n"


def test_a_2_gib_file_is_listed_but_not_read_over_the_limit(workspace, settings):
    big = workspace.write("big.bin")
    os.truncate(big, 2 << 30)  # sparse: 2 GiB without the disk
    [entry] = workspace.craft.list_folder("").entries
    assert entry["size"] == 2 << 30
    started = time.monotonic()
    with pytest.raises(WorkspaceRefused) as refused:
        workspace.craft.read("big.bin", django_settings.CRAFT_ARCHIVE_MAX_BYTES)
    assert refused.value.code == "too_large"
    with pytest.raises(WorkspaceRefused) as refused:
        workspace.craft.archive(django_settings.CRAFT_ARCHIVE_MAX_BYTES)
    assert refused.value.code == "too_large"
    assert time.monotonic() - started < 10  # refused from the sizes, not after reading


def test_100000_files_are_listed_a_page_at_a_time(workspace):
    folder = workspace.folder / "many"
    folder.mkdir()
    workspace.own(folder)
    for index in range(100_000):
        (folder / f"f{index:06d}").touch()
    page = workspace.craft.list_folder("many", offset=99_500, limit=1000)
    assert page.total == 100_000
    assert len(page.entries) == 500
    assert page.entries[0]["name"] == "f099500"


def test_the_archive_holds_files_folders_and_links_as_links_and_nothing_else(workspace):
    workspace.write("notes.txt", b"hello\n")
    workspace.write("src/app.py", b"print(1)\n", mode=0o700)
    workspace.link("passwd", "/etc/passwd")
    os.mkfifo(workspace.folder / "pipe")
    workspace.own(workspace.folder / "pipe")
    download = workspace.craft.archive(1 << 20)
    assert download.header == {"files": 2, "bytes": 15}
    data = io.BytesIO()
    while chunk := download.read():
        data.write(chunk)
    with zipfile.ZipFile(data) as archive:
        members = {info.filename: info for info in archive.infolist()}
        assert set(members) == {"notes.txt", "src/", "src/app.py", "passwd"}
        assert archive.read("notes.txt") == b"hello\n"
        assert archive.read("passwd") == b"/etc/passwd"  # the link's target, not the file
        assert members["passwd"].external_attr >> 16 & 0o170000 == 0o120000
        assert members["src/app.py"].external_attr >> 16 & 0o777 == 0o700


def tools_running() -> list[int]:
    """Return the pids of workspace tools this test process started, however deep (the test
    API server runs a pod's execs here too); another test process's tools are not ours."""
    parents, found = {}, []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                if b"workspace_tool" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
        except OSError:
            continue

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 0)
        return False

    return [pid for pid in found if ours(pid)]


def test_a_download_left_half_read_stops_the_tool(workspace):
    big = workspace.write("big.bin")
    os.truncate(big, 256 << 20)  # more than every buffer on the way holds: the tool waits
    download = workspace.craft.read("big.bin", 512 << 20)
    assert download.read()
    assert tools_running()
    download.close()
    deadline = time.monotonic() + 10
    while tools_running():
        assert time.monotonic() < deadline, "the tool still runs"
        time.sleep(0.05)


def test_a_session_without_a_workspace_yet_and_a_stopped_sandbox_are_refused(workspace, owner):
    fresh = craft_services.open_session(owner, "not started")
    with pytest.raises(WorkspaceRefused) as refused:
        services.session_workspace(fresh.sandbox, fresh.pk).list_folder("")
    assert refused.value.code == "no_workspace"
    services.terminate_sandbox(workspace.sandbox)
    with pytest.raises(SandboxError):
        services.session_workspace(workspace.sandbox, workspace.session.pk)


def test_an_agent_that_deletes_everything_leaves_an_empty_listing(workspace):
    workspace.write("a/b/c.txt", b"x")
    shutil.rmtree(workspace.folder / "a")
    assert workspace.craft.list_folder("").entries == []
    with pytest.raises(WorkspaceRefused) as refused:
        workspace.craft.list_folder("a")
    assert refused.value.code == "not_found"


def test_a_pod_that_vanishes_mid_download_ends_the_download_with_an_error(request, settings, owner):
    workspace = open_on("kubernetes", request, settings, owner)
    for index in range(20):
        workspace.write(f"random-{index}.bin", os.urandom(1 << 20))
    download = workspace.craft.archive(1 << 30)
    assert download.read()
    backend = request.getfixturevalue("kube_backend")
    backend.core.delete_namespaced_pod(pod_name(workspace.sandbox), K8S_NAMESPACE)
    started = time.monotonic()
    with pytest.raises(SandboxError, match="cut short"):
        while download.read():
            assert time.monotonic() - started < 30
