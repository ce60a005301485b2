"""A session on a repository: Craft's clone beside `git clone` alone, and the first answer after it.

Run as root, in the configuration `make run` has as root: sandbox users, the jail, the
sandbox's own network (the git host allowed through CRAFT_SANDBOX_ALLOW) and its budget.
The git host is the tests' (`tests.git_server`: git's own `http-backend` on 127.0.0.1) with
one public repository of 10,000 files, 100 MB of content git cannot compress.

* git clone alone: `git clone` of that URL into a folder, as this process's user, no jail:
  the floor;
* Craft's clone: `Repository.clone` of a new session of a running sandbox (into the session's
  private store with the host's credentials, then into its workspace, its branch checked
  out), the same URL, in the same run; target within 1 s of the floor;
* the first answer after a clone, through daphne and its websocket: a session opened on the
  repository, its clone started (`start_agent`) and waited for, then a prompt to the demo
  agent; beside the same first answer in a session without a repository.

Medians of several rounds.

    .venv/bin/python -m bench.repository [--rounds 3]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from .harness import Client, Figure, Site, median, run_alone

FILES = 10_000
FILE_BYTES = 10_000  # 10,000 of them: 100 MB
REPOSITORY = "team/big.git"


async def run(site: Site, rounds: int = 5) -> list[Figure]:
    if os.geteuid() != 0:
        print("bench.repository: skipped (sandbox users need root)", flush=True)
        return []
    from tests.git_server import GitServer

    root = Path(tempfile.mkdtemp(prefix="craft-bench-git-"))
    try:
        with GitServer(root) as host:
            url = await asyncio.to_thread(_big_repository, host)
            clones = await asyncio.to_thread(_clones, site, host, url, rounds)
            answers = await _first_answers(site, host, url, rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    floor, craft = clones
    with_repo, without, ready = answers
    return [
        Figure("repository: git clone alone (10,000 files, 100 MB)", floor * 1000, "ms",
               "reported", None, "the floor"),
        Figure("repository: Craft's clone, same repository", craft * 1000, "ms",
               "within 1 s of git clone", craft - floor <= 1.0,
               f"{(craft - floor) * 1000:+.0f} ms on git clone alone"),
        Figure("repository: a new session's clone until ready", ready * 1000, "ms", "reported",
               None, "through daphne: the clone and the first checkpoint"),
        Figure("repository: first answer, session without one", without * 1000, "ms",
               "reported", None, "demo agent, cold start"),
        Figure("repository: first answer after its clone", with_repo * 1000, "ms", "reported",
               None, f"{(with_repo - without) * 1000:+.0f} ms on a session without one"),
    ]  # fmt: skip


def _big_repository(host: Any) -> str:
    """Create the public repository: 10,000 files in 100 folders, 100 MB, one commit."""
    from tests.git_server import GIT_ENV

    url = host.create(REPOSITORY, public=True)
    with tempfile.TemporaryDirectory() as work:
        for index in range(FILES):
            folder = Path(work, f"src{index % 100:02d}")
            folder.mkdir(exist_ok=True)
            (folder / f"file{index:05d}.bin").write_bytes(os.urandom(FILE_BYTES))
        env = {**GIT_ENV, "GIT_DIR": str(host.root / REPOSITORY), "GIT_WORK_TREE": work}
        for argv in (["add", "-A"], ["commit", "-qm", "Ten thousand files"]):
            subprocess.run(["git", *argv], env=env, check=True, capture_output=True)
    return url


def _clones(site: Site, host: Any, url: str, rounds: int) -> tuple[float, float]:
    """Return the median seconds of `git clone` alone and of Craft's clone, taken in turns."""
    from django.conf import settings

    from sandboxes import services
    from sandboxes.backends import forget_backends
    from sandboxes.repository import Remote

    _production(settings, host.port)
    forget_backends()
    user, _ = site.user(f"repository-{uuid.uuid4().hex[:8]}")
    sandbox = services.provision_sandbox(user)
    from craft.services import open_session

    floors, crafts = [], []
    for round_ in range(rounds + 1):  # the first round warms the host's and the disk's caches
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            subprocess.run(
                ["git", "clone", "--quiet", url, f"{folder}/clone"],
                check=True, capture_output=True,
                env={"PATH": "/usr/bin:/bin", "HOME": folder, "GIT_CONFIG_NOSYSTEM": "1"},
            )  # fmt: skip
            floors.append(time.perf_counter() - began)
        session = open_session(user, f"clone {round_}")
        repository = services.session_repository(sandbox, session.pk)
        began = time.perf_counter()
        repository.clone(
            Remote(url, allow_http=True), base=None, branch_name=f"craft/bench-{round_}",
            progress=lambda step: None, max_bytes=2 << 30, timeout=600,
        )  # fmt: skip
        crafts.append(time.perf_counter() - began)
        services.remove_session_workspace(sandbox, session.pk)
    services.terminate_sandbox(sandbox)
    return median(floors[1:]), median(crafts[1:])


def _production(settings: Any, port: int) -> None:
    import ipaddress

    settings.CRAFT_SANDBOX_UIDS = "on"
    settings.CRAFT_SANDBOX_NETWORK = "isolated"
    settings.CRAFT_SANDBOX_LIMITS = "on"
    settings.CRAFT_SANDBOX_ALLOW = [(ipaddress.ip_address("127.0.0.1"), port)]


async def _first_answers(
    site: Site, host: Any, url: str, rounds: int
) -> tuple[float, float, float]:
    """Return the median seconds to the first answer after a clone, without one, and from
    the clone's start to its `ready` through the server (the clone, the first checkpoint)."""
    hosts_file = site.workdir / "hosts.toml"
    hosts_file.write_text(
        f'[[hosts]]\nhost = "127.0.0.1:{host.port}"\nkind = "gitea"\n'
        f'api_url = "http://127.0.0.1:{host.port}/api/v1"\nallow_http = true\n'
    )
    from django.conf import settings

    settings.CRAFT_GIT_HOSTS_FILE = str(hosts_file)  # sessions are opened here too
    env = {
        "CRAFT_GIT_HOSTS_FILE": str(hosts_file),
        "CRAFT_SANDBOX_ALLOW": f"127.0.0.1:{host.port}",
        "CRAFT_SANDBOX_UIDS": "on",
        "CRAFT_SANDBOX_NETWORK": "isolated",
        "CRAFT_WARM_AGENTS": "0",
    }
    with site.serve(**env) as server:
        user, cookie = await asyncio.to_thread(site.user, f"answers-{uuid.uuid4().hex[:8]}")
        await asyncio.to_thread(site.session, user, "warm-up")  # the sandbox runs from here
        with_repo, without, readies = [], [], []
        for _ in range(rounds):
            plain = await asyncio.to_thread(_open, user, "")
            client = await Client.open(server, cookie, plain)
            await client.send({"type": "resume", "after": 0})
            without.append(await client.prompt("hello"))
            await client.close()
            cloned = await asyncio.to_thread(_open, user, url)
            client = await Client.open(server, cookie, cloned)
            await client.send({"type": "resume", "after": 0})
            began = time.perf_counter()
            await client.send({"type": "start_agent"})  # as the page does: the clone starts
            while True:
                frame = await client.frame(600)
                if frame.get("kind") == "repository_status" and frame["data"]["status"] in (
                    "ready",
                    "failed",
                ):
                    if frame["data"]["status"] == "failed":
                        raise RuntimeError(f"the clone failed: {frame['data']}")
                    break
            readies.append(time.perf_counter() - began)
            with_repo.append(await client.prompt("hello"))
            await client.close()
    return median(with_repo), median(without), median(readies)


def _open(user: Any, url: str) -> str:
    from craft.services import open_session

    return str(open_session(user, "bench", repository=url).pk)


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, rounds=5)


if __name__ == "__main__":
    main()
