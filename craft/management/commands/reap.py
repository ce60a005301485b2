"""`manage.py reap [--every SECONDS]`: the sandbox reaper, run from outside the server."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connections

from craft.session_activity import session_activity
from sandboxes import reaper


class Command(BaseCommand):
    help = (
        "Reap sandboxes once, or every SECONDS: re-claim sandboxes stuck provisioning or "
        "terminating, terminate idle ones (CRAFT_SANDBOX_IDLE_SECONDS), remove folders, pods "
        "and services that no live sandbox owns, and mark sandboxes whose folder or pod "
        "vanished as failed. Each server process does the same on its own every "
        "CRAFT_REAPER_INTERVAL_SECONDS. Agent connections live in the memory of the server "
        "processes, so this command cannot stop them: each server stops its own idle agents "
        "(CRAFT_AGENT_IDLE_SECONDS)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every",
            type=float,
            metavar="SECONDS",
            help="run again every SECONDS until stopped (SIGTERM, Ctrl-C)",
        )

    def handle(self, *args: Any, every: float | None = None, **options: Any) -> None:
        if every is not None and every <= 0:
            self.stderr.write("--every must be a positive number of seconds")
            raise SystemExit(2)
        try:
            while True:
                self._reap_once(quiet=every is not None)
                if every is None:
                    return
                connections.close_all()  # hand the connection back between passes
                time.sleep(every)
        except KeyboardInterrupt:
            return

    def _reap_once(self, quiet: bool) -> None:
        report = reaper.reap_sandboxes(session_activity)
        for action in report.actions:
            sandbox = f" sandbox {action.sandbox_id}" if action.sandbox_id else ""
            self.stdout.write(
                f"{action.get_kind_display()}{sandbox} {action.target}: {action.reason}"
            )
        for error in report.errors:
            self.stderr.write(f"failed: {error}")
        if not report.actions and not report.errors and not quiet:
            self.stdout.write("nothing to reap", self.style.SUCCESS)
