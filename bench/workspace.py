"""The workspace: a 10,000-entry listing, a checkpoint, and a diff, each beside its floor.

One session's workspace holds a folder of 10,000 files of 10 KB (100 MB). Measured, as
medians of several rounds, each beside the same work done without Craft in the same run:

* listing that folder through the files API (daphne, the workspace tool as the sandbox's
  user): its first page as the page asks for it (500 entries), against `os.scandir`, a sort
  and `lstat` of those 500 in this process; and all 10,000 entries in one request, against
  `os.scandir` and `lstat` of every entry;
* a checkpoint after 3 files changed (the tool in its jail: git add and commit) against the
  same git commands run directly on a store of their own;
* the first byte of the diff of 50 changed files against `git diff` run directly.

    .venv/bin/python -m bench.workspace [--rounds 7]
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from .harness import Figure, Site, median, run_alone

FILES = 10_000
PAGE = 500  # what the page asks for at once (static/craft/session/workspace.mjs)
FILE_BYTES = 10 * 1024
LIST_TARGET_MS = 100.0
CHECKPOINT_TARGET_MS = 200.0
DIFF_TARGET_MS = 150.0
GIT = ["git", "-c", "core.hooksPath=/dev/null", "-c", "gc.auto=0"]
GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "floor",
    "GIT_AUTHOR_EMAIL": "floor@localhost",
    "GIT_COMMITTER_NAME": "floor",
    "GIT_COMMITTER_EMAIL": "floor@localhost",
}


async def run(site: Site, rounds: int = 7) -> list[Figure]:
    return await asyncio.to_thread(_run, site, rounds)


def _run(site: Site, rounds: int) -> list[Figure]:
    from craft.models import Session
    from sandboxes import services

    user, cookie = site.user(f"workspace-{uuid.uuid4().hex[:6]}")
    session = Session.objects.select_related("sandbox").get(pk=site.session(user))
    services.connect_agent(session.sandbox, session.pk)  # makes the workspace
    services.stop_all_agents()
    folder = Path(services.workspace_path(session.sandbox, session.pk))
    flat = folder / "flat"
    flat.mkdir()
    content = os.urandom(FILE_BYTES // 2).hex().encode()
    for index in range(FILES):
        (flat / f"file-{index:05d}.txt").write_bytes(content)
    owner = folder.stat()
    for path in [flat, *flat.iterdir()]:
        os.chown(path, owner.st_uid, owner.st_gid)
    workspace = services.session_workspace(session.sandbox, session.pk)

    with site.serve() as server:
        url = f"{server.url}/api/sessions/{session.pk}/files/?path=flat"
        paged, floor_paged, listed, floor_listed = [], [], [], []
        for _ in range(rounds):
            paged.append(_get(f"{url}&limit={PAGE}", cookie))
            started = time.perf_counter()
            with os.scandir(flat) as entries:
                first = sorted(entry.name for entry in entries)[:PAGE]
            sizes = [os.lstat(flat / name).st_size for name in first]
            assert len(sizes) == PAGE
            floor_paged.append(time.perf_counter() - started)
            listed.append(_get(f"{url}&limit={FILES}", cookie))
            started = time.perf_counter()
            with os.scandir(flat) as entries:
                sizes = [entry.stat(follow_symlinks=False).st_size for entry in entries]
            assert len(sizes) == FILES
            floor_listed.append(time.perf_counter() - started)

    floor_store = Path(tempfile.mkdtemp(prefix="craft-bench-floor-")) / "store"
    _git(floor_store, folder, "init", "-q", "--bare", str(floor_store), bare=True)
    workspace.checkpoint("base")
    _floor_checkpoint(floor_store, folder)
    checkpoints, floor_checkpoints = [], []
    for round_ in range(rounds):
        for index in range(3):
            (flat / f"file-{round_ * 3 + index:05d}.txt").write_bytes(b"changed %d\n" % round_)
        started = time.perf_counter()
        workspace.checkpoint(f"round {round_}")
        checkpoints.append(time.perf_counter() - started)
        started = time.perf_counter()
        _floor_checkpoint(floor_store, folder)
        floor_checkpoints.append(time.perf_counter() - started)

    before = workspace.checkpoint("before the diff").commit
    floor_before = _git(floor_store, folder, "rev-parse", "HEAD").strip()
    for index in range(50):
        (flat / f"file-{index:05d}.txt").write_bytes(b"line\n" * 100 + b"%d\n" % index)
    after = workspace.checkpoint("after the diff").commit
    _floor_checkpoint(floor_store, folder)
    diffs, floor_diffs = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        download = workspace.diff(before, after)
        assert download.read()
        diffs.append(time.perf_counter() - started)
        download.close()
        started = time.perf_counter()
        process = subprocess.Popen(
            [*GIT, f"--git-dir={floor_store}", "diff", floor_before.decode(), "HEAD"],
            env=GIT_ENV, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert process.stdout is not None and process.stdout.read(1)
        floor_diffs.append(time.perf_counter() - started)
        process.kill()
        process.wait()
        process.stdout.close()

    def figure(name: str, times: list[float], floors: list[float], target: float) -> Figure:
        value = median(times) * 1000
        return Figure(
            name, value, "ms", f"<= {target:g} ms", value <= target,
            f"floor {median(floors) * 1000:.1f} ms; {rounds} rounds",
        )  # fmt: skip

    return [
        figure("list 10,000 entries: the first page (API)", paged, floor_paged, LIST_TARGET_MS),
        figure("list 10,000 entries: all at once (API)", listed, floor_listed, LIST_TARGET_MS),
        figure("checkpoint: 3 files of 10,000 (100 MB)", checkpoints, floor_checkpoints,
               CHECKPOINT_TARGET_MS),
        figure("diff of 50 files: first byte", diffs, floor_diffs, DIFF_TARGET_MS),
    ]  # fmt: skip


def _get(url: str, cookie: str) -> float:
    """GET a listing of the 10,000-entry folder; return how long it took, in seconds."""
    started = time.perf_counter()
    with urllib.request.urlopen(
        urllib.request.Request(url, headers={"Cookie": cookie}), timeout=60
    ) as answer:
        assert b'"total": 10000' in answer.read()
    return time.perf_counter() - started


def _git(store: Path, work_tree: Path, *args: str, bare: bool = False) -> bytes:
    where = [] if bare else [f"--git-dir={store}", f"--work-tree={work_tree}"]
    return subprocess.run(
        [*GIT, *where, *args], env=GIT_ENV, capture_output=True, check=True
    ).stdout


def _floor_checkpoint(store: Path, work_tree: Path) -> None:
    _git(store, work_tree, "add", "--all")
    _git(store, work_tree, "commit", "-q", "--allow-empty", "-m", "floor")


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, rounds=7)


if __name__ == "__main__":
    main()
