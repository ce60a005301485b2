from django.apps import AppConfig


class CraftConfig(AppConfig):
    name = "craft"
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from craft.checks import service_passwords
        from craft.cluster import forwarding
        from craft.live import accounts
        from craft.turns.registry import runners

        accounts.connect_signals()
        # A session's commands, routed here by the cluster, are carried out by its runner.
        forwarding.serve(handle=runners.handle, lose=runners.lose)
        checks.register(service_passwords, checks.Tags.security, deploy=True)
