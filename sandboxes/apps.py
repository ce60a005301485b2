from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"
    verbose_name = "Sandboxes"
    default_auto_field = "django.db.models.BigAutoField"
