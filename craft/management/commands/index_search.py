"""`manage.py index_search`: index for search what is not indexed yet (craft.storage.search).

Sessions from before search, and a turn whose indexing was lost (the server stopped right
after it), are indexed; what is indexed already is kept. It may run at any time, while the
server runs too.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Exists, OuterRef

from craft.models import Event, SearchEntry
from craft.storage import search


class Command(BaseCommand):
    help = "Index for search the turns that are not indexed yet."

    def handle(self, *args: Any, **options: Any) -> None:
        entries = SearchEntry.objects.filter(session_id=OuterRef("session_id"), seq=OuterRef("seq"))
        prompts = (
            Event.objects.filter(kind="user_message")
            .annotate(indexed=Exists(entries))
            .filter(indexed=False)
            .order_by("session_id", "seq")
            .values_list("session_id", "seq")
        )
        turns = written = 0
        for session_id, seq in prompts.iterator(chunk_size=500):
            written += search.index_turn(session_id, seq)
            turns += 1
        self.stdout.write(f"Indexed {turns} turn(s): {written} entries.")
