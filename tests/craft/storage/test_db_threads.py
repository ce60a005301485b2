"""The database threads of event-loop code: a transaction they leave idle for longer than a
lease is ended by PostgreSQL (it may hold a lease row), and the thread goes on."""

from __future__ import annotations

import time

import pytest
from django.db import DatabaseError, connection, transaction

from craft.models import Session
from craft.storage.db import DatabaseThreads

pytestmark = pytest.mark.django_db(transaction=True)


def idle_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        return str(cursor.fetchone()[0])


def pause_inside_a_transaction(seconds: float) -> int:
    with transaction.atomic():
        Session.objects.count()
        time.sleep(seconds)  # a stopped process, a long pause: the transaction idles
        return Session.objects.count()


def test_a_transaction_a_database_thread_leaves_idle_past_a_lease_is_ended(settings):
    settings.CRAFT_SESSION_LEASE_SECONDS = 1.0
    threads = DatabaseThreads("craft-test-db", 1)
    try:
        assert threads.submit(idle_timeout).result(10) == "1s"
        with pytest.raises(DatabaseError, match="idle-in-transaction timeout"):
            threads.submit(pause_inside_a_transaction, 3).result(10)
        assert threads.submit(pause_inside_a_transaction, 0).result(10) == 0, "it goes on"
    finally:
        threads.stop()
    assert idle_timeout() == "0", "the other threads' transactions may idle"
