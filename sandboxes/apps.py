from django.apps import AppConfig
from django.core import checks


class SandboxesConfig(AppConfig):
    name = "sandboxes"
    verbose_name = "Sandboxes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        from .checks import sandbox_users
        from .models import Sandbox
        from .services import terminate_before_delete

        checks.register(sandbox_users)
        # Deleting a sandbox's row (the admin, a deleted user) terminates it first.
        pre_delete.connect(terminate_before_delete, sender=Sandbox)
