"""Encrypt every stored credential and git token again with the newest CRAFT_SECRETS_KEY
(docs/agents.md, docs/repositories.md)."""

from django.core.management.base import BaseCommand

from craft import credentials, git_tokens


class Command(BaseCommand):
    help = (
        "Encrypt every stored credential and git token again with the first key of "
        "CRAFT_SECRETS_KEY, so that the older keys listed after it can be dropped. Values no "
        "listed key can read are left as they are (their owners must enter them again)."
    )

    def handle(self, *args: object, **options: object) -> None:
        for what, (rotated, unreadable) in (
            ("credential(s)", credentials.rotate_all()),
            ("git token(s)", git_tokens.rotate_all()),
        ):
            self.stdout.write(f"Encrypted {rotated} {what} with the newest key.")
            if unreadable:
                self.stdout.write(
                    self.style.WARNING(
                        f"{unreadable} {what} could not be read with any listed key; "
                        "their owners must enter them again."
                    )
                )
