from django.apps import AppConfig


class CraftConfig(AppConfig):
    name = "craft"
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import account_sockets

        account_sockets.connect_signals()
