"""The workspace tool's `import` (a fork's files): a tar written into an empty workspace,
following no link and writing nothing outside it, whatever the tar holds."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

from sandboxes import workspace_tool

TOOL = Path(workspace_tool.__file__)


def a_tar(*members: tuple[str, str, bytes | str]) -> bytes:
    """A tar of (kind, name, content) members: kind `file`, `link` (content: its target),
    `folder` or `fifo`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for kind, name, content in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = content if isinstance(content, bytes) else content.encode()
                info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
                archive.addfile(info, io.BytesIO(data))
                continue
            info.type = {"link": tarfile.SYMTYPE, "folder": tarfile.DIRTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]  # fmt: skip
            info.linkname = str(content)
            archive.addfile(info)
    return out.getvalue()


def run_import(sandbox: Path, tar: bytes, limit: int = 1 << 20) -> dict:
    done = subprocess.run(
        [sys.executable, str(TOOL), str(sandbox), "sessions/s", "import", str(limit)],
        input=tar, capture_output=True, check=False,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[0])


def a_sandbox(tmp_path: Path) -> tuple[Path, Path]:
    workspace = tmp_path / "sandbox" / "sessions" / "s"
    workspace.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return tmp_path / "sandbox", workspace


def test_it_writes_folders_files_and_links_as_links(tmp_path):
    sandbox, workspace = a_sandbox(tmp_path)
    tar = a_tar(
        ("folder", "src", ""), ("file", "src/app.py", "print(1)\n"),
        ("file", "run.sh", "#!/bin/sh\n"), ("file", "deep/er/x.txt", "x"),
        ("link", "config", "/etc/passwd"), ("fifo", "pipe", ""),
    )  # fmt: skip
    assert run_import(sandbox, tar) == {"files": 3, "bytes": 20}
    assert (workspace / "src/app.py").read_text() == "print(1)\n"
    assert (workspace / "deep/er/x.txt").read_text() == "x"
    assert (workspace / "run.sh").stat().st_mode & 0o100
    assert not (workspace / "src/app.py").stat().st_mode & 0o100
    assert (workspace / "config").is_symlink()
    assert not (workspace / "pipe").exists()  # git keeps no FIFO: nor does a fork


def test_it_never_writes_through_a_link_or_outside_the_workspace(tmp_path):
    sandbox, _ = a_sandbox(tmp_path)
    outside = tmp_path / "outside"
    through_link = a_tar(("link", "away", str(outside)), ("file", "away/x.txt", "x"))
    assert run_import(sandbox, through_link)["error"]["code"] == "is_link"
    assert list(outside.iterdir()) == []
    for name in ("../outside/y.txt", "/tmp/y.txt", "a/../../outside/y.txt"):
        sandbox, _ = a_sandbox(tmp_path / name.replace("/", "_"))
        assert run_import(sandbox, a_tar(("file", name, "y")))["error"]["code"] == "bad_archive"
    assert list(outside.iterdir()) == []
    # A link made first, then a file of that very name: the link is not written through.
    sandbox, _ = a_sandbox(tmp_path / "again")
    twice = a_tar(
        ("link", "x.txt", str(tmp_path / "again" / "outside" / "x.txt")), ("file", "x.txt", "x")
    )
    assert run_import(sandbox, twice)["error"]["code"] == "bad_archive"
    assert list((tmp_path / "again" / "outside").iterdir()) == []


def test_nothing_comes_for_a_checkpoint_without_files_and_nothing_is_written(tmp_path):
    sandbox, workspace = a_sandbox(tmp_path)
    assert run_import(sandbox, b"") == {"files": 0, "bytes": 0}
    assert list(workspace.iterdir()) == []


def test_it_refuses_a_workspace_that_holds_files_and_more_bytes_than_allowed(tmp_path):
    sandbox, workspace = a_sandbox(tmp_path)
    (workspace / "mine.txt").write_text("mine")
    assert run_import(sandbox, a_tar(("file", "a.txt", "a")))["error"]["code"] == "not_empty"
    (workspace / "mine.txt").unlink()
    tar = a_tar(("file", "a.txt", "a" * 100), ("file", "b.txt", "b" * 100))
    assert run_import(sandbox, tar, limit=150)["error"]["code"] == "too_large"
