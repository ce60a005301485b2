"""Settings for the test suite: the real settings module, fed a test environment."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("DJANGO_SECRET_KEY", "test-secret-key-not-used-anywhere-else")
os.environ.setdefault("DJANGO_SECURE_COOKIES", "0")
# Tests (and the daphne the browser tests start) speak plain HTTP on loopback.
os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "0")
# Most tests are about Craft, not the sandbox, and run their agents from the checkout with the
# virtualenv's Python, which sandbox users may not be able to run (pyenv under /root, say):
# they run with sandbox users off. The tests of what runs in a sandbox (tests/sandboxes'
# isolation and containment, the embedded server's, every real agent's) turn them on, with
# the jail, the sandbox's network and its budget, as `make run` as root has them.
os.environ.setdefault("CRAFT_SANDBOX_UIDS", "off")
# A fixed key for the credentials people store (docs/agents.md), used by tests only.
# No warm agents unless a test asks for them (tests/sandboxes/test_warm_agents.py): the rest
# of the suite counts agent processes and limits as they were before warm agents.
os.environ.setdefault("CRAFT_WARM_AGENTS", "0")
os.environ.setdefault("CRAFT_SECRETS_KEY", "6Ijl_GdANX76rs7fpuqxpj0MAJSXQd_PfPTn58A-i4c=")
# The suite runs on PostgreSQL: several tests are about concurrent writers and a second
# process (daphne) sharing the database. CRAFT_TEST_DATABASE_URL points it elsewhere.
os.environ.setdefault(
    "DATABASE_URL",
    os.environ.get("CRAFT_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
)

from craft.settings import *  # noqa: F403

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    # A file, not SQLite's default in-memory test database: the event writer and the database
    # threads use connections of their own, and so does a daphne under test.
    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": str(Path(tempfile.mkdtemp(prefix="craft-test-db-")) / "test.sqlite3")
    }

# Hashing passwords slowly is the point in production and a waste of seconds here.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# WhiteNoise warns when STATIC_ROOT is missing; tests serve static files from the finders.
# The first process of a run that reads these settings makes it and removes it when it exits;
# the processes it starts (xdist workers, each daphne under test, killed ones too) share it.
if os.environ.get("CRAFT_TEST_STATIC_ROOT"):
    STATIC_ROOT = Path(os.environ["CRAFT_TEST_STATIC_ROOT"])
else:
    STATIC_ROOT = Path(tempfile.mkdtemp(prefix="craft-static-"))
    os.environ["CRAFT_TEST_STATIC_ROOT"] = str(STATIC_ROOT)
    atexit.register(shutil.rmtree, STATIC_ROOT, ignore_errors=True)
