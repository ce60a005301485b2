"""A fork of a big session: 1,000 events and a workspace of 10,000 files, beside git alone.

Run as root in the configuration `make run` has as root (sandbox users and the jail; without
root, sandbox users off). A session gets 100 turns (a prompt, eight chunks of the agent's
answer and its end: 1,000 events) and a workspace of 10,000 files in 100 folders (20 MB),
recorded as the checkpoint after its last turn. Then, in turns:

* git alone: `git archive` of the same tree from a repository of its own, piped into
  `tar -x` in an empty folder, as this process's user, no jail: the floor;
* Craft's fork: `craft.turns.going_back.fork` of the last turn, as the session's runner
  carries it out: the events read and copied, the session's checkpoint store copied into
  the fork's (its objects as hard links) and the checkpoint's files written into the
  fork's workspace by git (one run of the workspace tool, in the jail, as the sandbox's
  user), its rows stored (the events, and the turns with their checkpoints: the fork needs
  no first checkpoint of its own). Target: at most 2 s.

The set-up writes the session's files directly, as the sandbox's user's (untimed; not
Craft's way into a workspace).

Medians of several rounds.

    .venv/bin/python -m bench.fork [--rounds 3]
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from .harness import Figure, Site, median, run_alone

FILES = 10_000
FILE_BYTES = 2_000  # 10,000 of them: 20 MB
TURNS = 100
CHUNKS = 8  # a turn: its prompt, this many chunks of the answer, its end: 10 events


async def run(site: Site, rounds: int = 5) -> list[Figure]:
    from django.conf import settings

    from sandboxes.backends import forget_backends

    if os.geteuid() == 0:
        settings.CRAFT_SANDBOX_UIDS = "on"
    else:
        print("bench.fork: not root: sandbox users off", flush=True)
        settings.CRAFT_SANDBOX_UIDS = "off"
    forget_backends()
    tar = _tar()
    user, _ = await asyncio.to_thread(site.user, f"fork-{uuid.uuid4().hex[:8]}")
    session, seq = await asyncio.to_thread(_big_session, user, tar)
    floors, forks = [], []
    with tempfile.TemporaryDirectory(prefix="craft-bench-fork-") as work:
        repository = await asyncio.to_thread(_repository, Path(work), tar)
        for round_ in range(rounds + 1):  # the first round warms the caches
            floors.append(await asyncio.to_thread(_git_alone, repository, Path(work) / str(round_)))
            forks.append(await _fork(session, seq))
    await asyncio.to_thread(_done, session)
    floor, craft = median(floors[1:]), median(forks[1:])
    return [
        Figure("fork: git archive | tar alone (10,000 files)", floor * 1000, "ms", "reported",
               None, "the floor"),
        Figure("fork: a session of 1,000 events, 10,000 files", craft * 1000, "ms", "≤ 2 s",
               craft <= 2.0, f"{(craft - floor) * 1000:+.0f} ms on git alone"),
    ]  # fmt: skip


def _tar() -> bytes:
    """Return a tar of FILES files of FILE_BYTES bytes each, in 100 folders."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for index in range(FILES):
            data = os.urandom(FILE_BYTES // 2).hex().encode()
            info = tarfile.TarInfo(f"src{index % 100:02d}/file{index:05d}.txt")
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _big_session(user: Any, tar: bytes) -> tuple[Any, int]:
    """Return a session of TURNS turns whose workspace holds the tar's files, recorded as
    the checkpoint after its last turn, and the seq of that turn's prompt."""
    from craft.models import TurnRecord
    from craft.services import open_session
    from craft.storage.eventlog import append_events
    from sandboxes import services

    services.provision_sandbox(user)
    session = open_session(user, "big")
    workspace = services.writable_workspace(session.sandbox, session.pk)
    _unpack(tar, Path(services.workspace_path(session.sandbox, session.pk)))
    commit = workspace.checkpoint("bench: the workspace").commit
    seq = 0
    for turn in range(TURNS):
        prompt = {"id": f"p{turn}", "text": f"turn {turn}"}
        stored = append_events(session.pk, [("user_message", prompt)], client_id=f"p{turn}")
        assert stored is not None
        seq = stored.first_seq
        chunk = {"sessionUpdate": "agent_message_chunk",
                 "content": {"type": "text", "text": f"part of answer {turn}. " * 10}}  # fmt: skip
        append_events(session.pk, [("agent_message_chunk", chunk)] * CHUNKS
                      + [("turn_end", {"stop_reason": "end_turn"})])  # fmt: skip
    TurnRecord.objects.filter(session=session, prompt_seq=seq).update(checkpoint_after=commit)
    return session, seq


def _unpack(tar: bytes, workspace: Path) -> None:
    """Write the tar's files into the workspace, as its owner's (the sandbox's user's): the
    bench's set-up, not Craft's way into a workspace."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(workspace, filter="data")
    owner = workspace.stat()
    for folder, names, files in os.walk(workspace):
        for name in [*names, *files]:
            os.chown(os.path.join(folder, name), owner.st_uid, owner.st_gid)


def _repository(work: Path, tar: bytes) -> Path:
    """Return a git repository of its own holding the same files, committed."""
    tree = work / "tree"
    tree.mkdir()
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(tree, filter="data")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@b"}  # fmt: skip
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "files"]):
        subprocess.run(["git", *argv], cwd=tree, env=env, check=True, capture_output=True)
    return tree


def _git_alone(repository: Path, target: Path) -> float:
    """Return the seconds `git archive HEAD | tar -x` takes into an empty folder."""
    target.mkdir()
    began = time.perf_counter()
    archive = subprocess.Popen(["git", "-C", str(repository), "archive", "HEAD"],
                               stdout=subprocess.PIPE)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(target)], stdin=archive.stdout, check=True)
    assert archive.stdout is not None
    archive.stdout.close()
    archive.wait()
    return time.perf_counter() - began


async def _fork(session: Any, seq: int) -> float:
    """Return the seconds a fork of the session's turn `seq` takes; remove the fork after."""
    from craft.models import Session
    from craft.storage.db import db_sync_to_async
    from craft.turns import going_back
    from sandboxes import services

    new_id = uuid.uuid4()
    began = time.perf_counter()
    await going_back.fork(session.pk, seq, new_id)
    took = time.perf_counter() - began
    fork = await db_sync_to_async(Session.objects.get)(pk=new_id)
    files = await asyncio.to_thread(_count, Path(services.workspace_path(fork.sandbox, fork.pk)))
    assert files == FILES, f"the fork has {files} files"
    await asyncio.to_thread(services.remove_session_workspace, fork.sandbox, fork.pk)
    await db_sync_to_async(fork.delete)()
    return took


def _count(folder: Path) -> int:
    return len(list(folder.rglob("*.txt")))


def _done(session: Any) -> None:
    from sandboxes import services

    services.remove_session_workspace(session.sandbox, session.pk)
    services.terminate_sandbox(session.sandbox)


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, rounds=5)


if __name__ == "__main__":
    main()
