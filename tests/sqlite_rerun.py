"""Run a test module again with SQLite as the database.

The suite runs on PostgreSQL; a module whose behaviour differs on SQLite (`make run`'s
database) gets one test, skipped in the SQLite run itself, that runs the module again in a
pytest of its own with `CRAFT_TEST_DATABASE_URL` and `DATABASE_URL` pointing at a fresh
SQLite file (tests/settings.py reads them at start-up).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

ON_SQLITE = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"

# The test that runs its module again: skipped there, where it would run itself again.
runs_the_module_on_sqlite = pytest.mark.skipif(ON_SQLITE, reason="this is the run on SQLite")


def run_again_on_sqlite(
    module: str, tmp_path: Path, *, deselect: str, env: dict[str, str] | None = None,
    timeout: float = 600,
) -> str:  # fmt: skip
    """Run the test module `module` (its `__file__`) again on SQLite, without the tests that
    `deselect` (a `-k` expression) names; fail unless it passed; return its output."""
    database = f"sqlite:///{tmp_path / 'again.sqlite3'}"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module,
         "-k", f"not ({deselect})"],
        env={**os.environ, "CRAFT_TEST_DATABASE_URL": database, "DATABASE_URL": database,
             **(env or {})},
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result.stdout
