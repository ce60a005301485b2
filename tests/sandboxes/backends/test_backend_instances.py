"""One backend instance per process, and tools installed by several threads at once.

A backend instance holds the process's limits and locks (the local backend's agent start
slots, the lock around installing its tools). Two threads that each made an instance at a
server's start installed the tools at the same time, and one agent start failed with "No such
file or directory" for the other's staging file.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandboxes.backends import containment, forget_backends, get_backend

THREADS = 8


class SlowToMake:
    """A backend that takes a while to make, as the local one does (it checks its jail's tools
    and puts its network rule in place)."""

    made = 0

    def __init__(self) -> None:
        type(self).made += 1
        time.sleep(0.2)


def test_threads_that_ask_for_a_backend_at_once_share_one_instance(settings):
    settings.CRAFT_SANDBOX_BACKENDS = {
        **settings.CRAFT_SANDBOX_BACKENDS,
        "slow": f"{__name__}.SlowToMake",
    }
    settings.CRAFT_SANDBOX_BACKEND = "slow"
    forget_backends()
    SlowToMake.made = 0
    start = threading.Barrier(THREADS)

    def ask(i: int) -> object:
        start.wait()
        # Half ask for the default, half for it by name: the same backend.
        return get_backend() if i % 2 else get_backend("slow")

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            backends = list(pool.map(ask, range(THREADS)))
        assert SlowToMake.made == 1
        assert all(backend is backends[0] for backend in backends)
    finally:
        forget_backends()


def install_at_once(tools: Path) -> None:
    """Install the tools in `tools` from THREADS threads at once."""
    start = threading.Barrier(THREADS)

    def install(_: int) -> None:
        start.wait()
        containment.install_workspace_tool(tools, sys.executable)
        containment.install_demo_agent(tools, sys.executable)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(install, range(THREADS)))  # raises what a thread raised


def test_tools_installed_by_several_threads_at_once_are_whole(tmp_path):
    """Each thread's staging file is its own: none renames another's away."""
    source = Path(containment.__file__).resolve().parent.parent / "in_sandbox" / "workspace_tool.py"
    for round_ in range(20):
        tools = tmp_path / f"tools-{round_}"
        install_at_once(tools)
        assert (tools / "workspace_tool.py").read_bytes() == source.read_bytes()
        assert not [p.name for p in tools.iterdir() if p.name.startswith(".")]
