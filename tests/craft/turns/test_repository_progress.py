"""A clone's progress, on its way from the clone's thread to the session's log: at most one
store a second, each phase's last word kept (a phase over within the second is not lost to
the next one), and a set-up's output joined and bounded."""

from __future__ import annotations

import asyncio
import threading

import pytest

from craft.turns import repository
from craft.turns.repository import _Output, _Progress

pytestmark = pytest.mark.asyncio


def step(phase: str, text: str) -> dict:
    return {"phase": phase, "text": text}


async def test_each_phase_keeps_its_last_word_and_stores_come_at_most_every_second(monkeypatch):
    monkeypatch.setattr(repository, "PROGRESS_EVERY_SECONDS", 0.2)
    stored: list[list[dict]] = []

    async def store(items: list[dict]) -> None:
        stored.append(items)

    progress = _Progress(asyncio.get_running_loop(), store)

    def clone() -> None:  # git's lines, from the clone's thread, faster than they are stored
        for n in range(1, 4):
            progress.put(step("receiving", f"Receiving objects: {n}/3"))
        progress.put(step("checkout", "Checking out the files"))

    thread = threading.Thread(target=clone)
    thread.start()
    thread.join()
    await asyncio.sleep(0.4)
    progress.put(step("checkout", "Updating files: 100% (3/3)"))
    await progress.close()
    assert stored == [
        [step("receiving", "Receiving objects: 3/3"), step("checkout", "Checking out the files")],
        [step("checkout", "Updating files: 100% (3/3)")],
    ]


async def test_a_set_ups_output_is_joined_and_bounded(monkeypatch):
    monkeypatch.setattr(repository, "MAX_SETUP_OUTPUT_CHARS", 20)
    stored: list[list[str]] = []

    async def store(items: list[str]) -> None:
        stored.append(items)

    output = _Output(asyncio.get_running_loop(), store)
    for line in ("npm ci", "added 3 packages", "more", "and more"):
        output.put(line)
    await output.close()
    assert stored == [["npm ci\nadded 3 packa… (the rest of the output is not kept here)\n"]]
