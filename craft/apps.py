from django.apps import AppConfig


class CraftConfig(AppConfig):
    name = "craft"
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from . import account_sockets
        from .checks import service_passwords

        account_sockets.connect_signals()
        checks.register(service_passwords, checks.Tags.security, deploy=True)
