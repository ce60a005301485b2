from django.apps import AppConfig


class CraftConfig(AppConfig):
    name = "craft"
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from craft.checks import service_passwords
        from craft.live import accounts

        accounts.connect_signals()
        checks.register(service_passwords, checks.Tags.security, deploy=True)
