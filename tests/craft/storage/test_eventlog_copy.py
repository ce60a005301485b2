"""COPY's text format, as the event writer spells fields for PostgreSQL, read back by PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

from craft.storage.eventlog import _copy_field
from craft.storage.normalise import clean_text

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(connection.vendor != "postgresql", reason="COPY is PostgreSQL's")
@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.text(st.characters(exclude_characters="\x00")), max_size=5))
def test_copy_fields_are_read_back_by_postgresql_as_written(texts):
    # Every text the COPY path could be handed, tabs, line ends and backslashes included (the
    # event log's own fields happen never to hold the first two: JSON escapes them).
    texts = [clean_text(text) for text in texts]
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE IF NOT EXISTS copied (n int, t text)")
        cursor.execute("TRUNCATE copied")
        payload = "".join(f"{n}\t{_copy_field(text)}\n" for n, text in enumerate(texts))
        with cursor.cursor.copy("COPY copied (n, t) FROM STDIN") as copy:
            copy.write(payload)
        cursor.execute("SELECT t FROM copied ORDER BY n")
        assert [row[0] for row in cursor.fetchall()] == texts
