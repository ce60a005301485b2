"""Encrypt every stored credential again with the newest CRAFT_SECRETS_KEY (docs/agents.md)."""

from django.core.management.base import BaseCommand

from craft import credentials


class Command(BaseCommand):
    help = (
        "Encrypt every stored credential again with the first key of CRAFT_SECRETS_KEY, so "
        "that the older keys listed after it can be dropped. Values no listed key can read "
        "are left as they are (their owners must enter them again)."
    )

    def handle(self, *args: object, **options: object) -> None:
        rotated, unreadable = credentials.rotate_all()
        self.stdout.write(f"Encrypted {rotated} credential(s) with the newest key.")
        if unreadable:
            self.stdout.write(
                self.style.WARNING(
                    f"{unreadable} credential(s) could not be read with any listed key; "
                    "their owners must enter them again."
                )
            )
