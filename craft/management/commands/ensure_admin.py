"""Make sure a local admin account exists, with a random password shown only when created."""

import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the 'admin' superuser with a random password if no superuser exists."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--username", default="admin")

    def handle(self, *args: object, username: str, **options: object) -> None:
        password_file = Path(settings.VAR_DIR) / "admin-password.txt"
        users = get_user_model().objects
        if users.filter(is_superuser=True).exists():
            self.stdout.write(f"An admin account exists (first password, if any: {password_file}).")
            return
        password = secrets.token_urlsafe(18)
        users.create_superuser(username=username, email="", password=password)
        password_file.parent.mkdir(parents=True, exist_ok=True)
        password_file.write_text(f"{username}\n{password}\n")
        password_file.chmod(0o600)
        self.stdout.write(
            self.style.SUCCESS(
                f"Created admin account {username!r} with password {password}\n"
                f"(kept in {password_file}; it is not shown again)"
            )
        )
