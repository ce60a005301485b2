"""The inbox's own timeout (`Inbox.take(limit, timeout)`), fed from a real thread as an agent's
reader feeds it. The turn's idle limit rests on it (tests/craft/turns/test_turn_failures.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from craft.turns.inbox import Inbox

pytestmark = pytest.mark.asyncio


def _inbox() -> Inbox:
    return Inbox(asyncio.get_running_loop(), on_idle=lambda: None)


async def test_nothing_within_the_timeout_raises():
    inbox = _inbox()
    with inbox, pytest.raises(TimeoutError):
        await inbox.take(10, timeout=0.05)


async def test_items_from_another_thread_end_the_wait_and_the_timer_with_it():
    inbox = _inbox()
    with inbox:
        threading.Timer(0.05, inbox.put, args=("first",)).start()
        assert await inbox.take(10, timeout=0.3) == ["first"]
        # The first take's timer is gone: the second waits past the first's 0.3 s, on its own.
        threading.Timer(0.5, inbox.put, args=("second",)).start()
        assert await inbox.take(10, timeout=5) == ["second"]


async def test_items_already_there_are_taken_even_with_no_time_left():
    inbox = _inbox()
    inbox.put("waiting")
    with inbox:
        assert await inbox.take(10, timeout=0) == ["waiting"]


async def test_a_timeout_that_fired_does_not_end_the_next_wait():
    inbox = _inbox()
    with inbox:
        with pytest.raises(TimeoutError):
            await inbox.take(10, timeout=0.01)
        threading.Timer(0.1, inbox.put, args=("later",)).start()
        assert await inbox.take(10, timeout=5) == ["later"]
