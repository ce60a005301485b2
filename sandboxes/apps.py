from django.apps import AppConfig
from django.core import checks


class SandboxesConfig(AppConfig):
    name = "sandboxes"
    verbose_name = "Sandboxes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .checks import sandbox_users

        checks.register(sandbox_users)
