"""The checkpoints a fork gives the turns it copies, read at once (`latest_checkpoints`): for
each change, what `latest_checkpoint` finds before it, over turns with and without
checkpoints, a first turn's state before it, and reverts in between."""

from __future__ import annotations

import pytest

from craft.models import Session, TurnRecord, WorkspaceRevert
from craft.turns.checkpoints import latest_checkpoint, latest_checkpoints
from sandboxes.models import Sandbox

pytestmark = pytest.mark.django_db


def test_read_at_once_they_are_what_latest_checkpoint_finds_before_each_change(owner):
    sandbox = Sandbox.objects.create(owner=owner, status=Sandbox.Status.RUNNING)
    session = Session.objects.create(owner=owner, sandbox=sandbox, title="history")
    turns = {1: ("start", "one"), 5: ("", ""), 9: ("", "nine"), 14: ("", "fourteen"),
             20: ("", "")}  # fmt: skip
    for seq, (before, after) in turns.items():
        TurnRecord.objects.create(
            session=session, prompt_seq=seq, worker="w", state=TurnRecord.State.ENDED,
            checkpoint_before=before, checkpoint_after=after,
        )  # fmt: skip
    for seq, after in ((12, "reverted"), (13, "reverted again"), (18, "late")):
        WorkspaceRevert.objects.create(
            session=session, seq=seq, checkpoint_before="x", checkpoint_after=after
        )
    asked: list[int | None] = [None, *range(0, 24)]
    found = latest_checkpoints(session.pk, asked)
    assert found == [latest_checkpoint(session.pk, before=each) for each in asked]
    assert found[:4] == ["late", "", "start", "one"]  # now; before 0, 1 and 2
