"""The workspace's watchdogs: one thread rings every request's alarm (`sandboxes.workspace`)."""

from __future__ import annotations

import threading
import time

from sandboxes.workspace import Alarms


def test_an_alarm_set_after_a_later_one_rings_first_and_a_cancelled_one_never():
    alarms = Alarms()
    rung: list[str] = []
    first_rang, short_rang = threading.Event(), threading.Event()
    late = alarms.after(600, lambda: rung.append("late"))
    alarms.after(0, first_rang.set)
    assert first_rang.wait(30)
    time.sleep(0.2)  # the thread now sleeps until the late alarm
    cancelled = alarms.after(0.05, lambda: rung.append("cancelled"))
    cancelled.cancel()
    short = alarms.after(0.1, lambda: (rung.append("short"), short_rang.set()))
    assert short_rang.wait(30), "the thread slept on towards the later alarm"
    assert rung == ["short"]
    assert short.rang and not cancelled.rang and not late.rang
    late.cancel()
