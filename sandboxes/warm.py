"""Warm sandboxes: pods started before anyone owns them, that new users' sandboxes claim.

With CRAFT_K8S_WARM_SANDBOXES = N, the pool keeps N sandboxes' resources ready with no owner
(on backends that can, `backends.WarmPool`). Each is a `WarmSandbox` row in a slot 0..N-1
whose id is the id the claiming sandbox will have, so the pod, its Service and its Secret
need no renaming.

* `take` (in the transaction that creates a new sandbox's row) takes a ready row with
  `SELECT ... FOR UPDATE SKIP LOCKED` and deletes it; the sandbox's row gets its id. Two
  workers never take one row: the second skips the locked row (PostgreSQL), and the delete
  must remove exactly one row either way. The backend then checks that the pod is Ready and
  relabels it with a test of its warm label (`claim_warm`); an unusable one is dropped and
  the sandbox gets a fresh pod.
* `tend` (the reaper thread of every server process, every few seconds; never a request)
  promotes warming rows whose pod became Ready, drops rows whose pod is gone, failed or
  never became Ready, drops surplus rows (a slot at or past N, after the setting was
  lowered), and fills empty slots (an insert into a taken slot fails, so workers tending at
  once never overfill the pool).

A row is deleted before its resources, with a delete conditional on what was read: a row
claimed meanwhile is left to its sandbox. Resources whose row is gone (a process stopped in
between) have no live sandbox either: the reaper's sweep removes them as orphans.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from .backends import SandboxError, WarmPool, get_backend, warm_pool
from .models import WarmSandbox

logger = logging.getLogger(__name__)

Status = WarmSandbox.Status


def take(backend_name: str) -> UUID | None:
    """Take a ready warm sandbox of the backend for a new sandbox; return its id, or None.

    Call it inside the transaction that creates the sandbox's row with that id: if that
    transaction rolls back, the warm row is back in the pool.
    """
    pool = warm_pool(get_backend(backend_name))
    target = pool.warm_target() if pool is not None else 0
    if target == 0:
        return None
    for _ in range(3):
        warm = (
            WarmSandbox.objects.select_for_update(skip_locked=True)
            .filter(backend=backend_name, status=Status.READY, slot__lt=target)
            .order_by("slot")
            .first()
        )
        if warm is None:
            return None
        # Without row locks (SQLite) this conditional delete is what makes the take ours.
        if WarmSandbox.objects.filter(pk=warm.pk, status=Status.READY).delete()[0] == 1:
            return warm.pk
    return None


def tend() -> list[str]:
    """Bring the configured backend's pool to its target; return what it did, in words."""
    backend = get_backend()
    pool = warm_pool(backend)
    if pool is None:
        return []
    target = pool.warm_target()
    rows = WarmSandbox.objects.filter(backend=backend.name)
    done = []
    for row in rows.filter(slot__gte=target):
        done += _drop(pool, row, "surplus")
    if target == 0:
        return done
    states = pool.warm_states()
    now = timezone.now()
    too_old = now - timedelta(seconds=settings.CRAFT_K8S_READY_TIMEOUT)
    for row in rows.filter(slot__lt=target):
        state = states.get(row.pk)
        if row.status == Status.READY:
            if state is None or not state.ready:
                done += _drop(pool, row, "its pod is gone or not Ready")
        elif state is not None and state.ready:
            if WarmSandbox.objects.filter(pk=row.pk, status=Status.WARMING).update(
                status=Status.READY
            ):
                done.append(f"warm sandbox {row.slot} is ready")
        elif state is not None and state.failure:
            done += _drop(pool, row, state.failure)
        elif row.created_at < too_old:
            done += _drop(pool, row, "its pod did not become Ready in time")
    taken = set(rows.values_list("slot", flat=True))
    for slot in range(target):
        if slot in taken:
            continue
        try:
            with transaction.atomic():
                row = WarmSandbox.objects.create(backend=backend.name, slot=slot)
        except IntegrityError:
            continue  # another worker filled it
        try:
            pool.create_warm(row.pk)
        except SandboxError as exc:
            logger.warning("cannot start warm sandbox %s: %s", slot, exc)
            done += _drop(pool, row, f"cannot start it: {exc}")
            break  # the API is failing: try again next pass
        done.append(f"started warm sandbox {slot}")
    return done


def _drop(pool: WarmPool, row: WarmSandbox, why: str) -> list[str]:
    if not WarmSandbox.objects.filter(pk=row.pk, status=row.status).delete()[0]:
        return []  # claimed (or changed) meanwhile: not ours to drop
    logger.info("dropping warm sandbox %s (%s): %s", row.slot, row.pk, why)
    try:
        pool.remove_warm(row.pk)
    except SandboxError as exc:
        logger.warning("cannot remove warm sandbox %s: %s (the reaper will)", row.pk, exc)
    return [f"dropped warm sandbox {row.slot}: {why}"]


def warm_ids() -> set[UUID]:
    """Return the ids of every warm sandbox (their resources belong to the pool)."""
    return set(WarmSandbox.objects.values_list("pk", flat=True))
