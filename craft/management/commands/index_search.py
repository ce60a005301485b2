"""`manage.py index_search`: index every session for search again (craft.storage.search).

A search indexes what is new in the searcher's sessions first; this indexes all of them from
the start (entries there already are kept): after a restore, say. It may run at any time,
while the server runs too.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from craft.models import Session
from craft.storage import search


class Command(BaseCommand):
    help = "Index every session for search again (what is indexed already is kept)."

    def handle(self, *args: Any, **options: Any) -> None:
        sessions = written = 0
        for session_id in Session.objects.values_list("pk", flat=True).iterator():
            written += search.index_session(session_id, after=0)
            sessions += 1
        self.stdout.write(f"Indexed {sessions} session(s): {written} new entries.")
