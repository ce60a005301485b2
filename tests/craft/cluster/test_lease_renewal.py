"""A worker renews all the leases it holds in a few statements, and still hears which it lost.

A worker with hundreds of sessions renews their leases every housekeeping tick; one write per
lease made the event writer wait for the database's write lock each time. Renewals now go
in batches; a batch that renews fewer leases than it holds (another worker took one over)
is done again lease by lease, so that the lost ones are named and stopped.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from craft.cluster import leases
from craft.models import Lease
from tests.ready import open_ready_session

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sessions(owner):
    return [open_ready_session(owner, f"leased {n}") for n in range(5)]


def held_leases(sessions) -> dict:
    return {s.pk: leases.acquire(s.pk).token for s in sessions}


def test_it_renews_every_lease_it_holds_in_one_update_per_batch(sessions, monkeypatch):
    monkeypatch.setattr(leases, "RENEW_BATCH", 2)
    held = held_leases(sessions)
    before = dict(Lease.objects.values_list("session_id", "expires_at"))
    with CaptureQueriesContext(connection) as queries:
        lost = leases.renew(held)
    assert lost == set()
    updates = [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 3  # 5 leases in batches of 2
    after = dict(Lease.objects.values_list("session_id", "expires_at"))
    assert all(after[s] >= before[s] for s in held)


def test_it_names_the_lease_another_worker_took_over_and_renews_the_others(sessions, monkeypatch):
    monkeypatch.setattr(leases, "RENEW_BATCH", 2)
    held = held_leases(sessions)
    taken = sessions[3].pk
    Lease.objects.filter(session_id=taken).update(owner="another-worker", token=held[taken] + 1)
    lost = leases.renew(held)
    assert lost == {taken}
    lease = Lease.objects.get(session_id=taken)
    assert (lease.owner, lease.token) == ("another-worker", held[taken] + 1)
    ours = Lease.objects.exclude(session_id=taken).filter(owner=leases.workers.me().key)
    assert ours.count() == 4


def test_a_renewal_and_the_writer_holding_leases_never_deadlock(owner):
    """The event writer's transaction holds one lease (its fence read) and then reads the
    next, in session order; a renewal that locked the leases in another order waited for the
    first while holding the second: PostgreSQL found a deadlock and failed one of them."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    first, second = sorted((open_ready_session(owner, f"lock {n}") for n in range(2)),
                           key=lambda s: str(s.pk))  # fmt: skip
    held = {s.pk: leases.acquire(s.pk).token for s in (second, first)}  # stored in that order
    fence_read = f"SELECT owner, token FROM {Lease._meta.db_table} WHERE session_id = %s FOR SHARE"
    failures: list[BaseException] = []
    renewing_waits, lost = threading.Event(), []

    def renewal() -> None:
        try:
            lost.extend(leases.renew(held))
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    # The writer's transaction, on this thread.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(fence_read, [first.pk])
        renewer = threading.Thread(target=renewal)
        renewer.start()
        deadline = time.monotonic() + 30
        while not renewing_waits.is_set() and time.monotonic() < deadline:
            cursor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            if cursor.fetchone():
                renewing_waits.set()
            time.sleep(0.05)
        assert renewing_waits.is_set(), "the renewal never waited for the writer's lease"
        cursor.execute(fence_read, [second.pk])  # the writer's next session
    renewer.join(30)
    assert failures == [] and lost == []
