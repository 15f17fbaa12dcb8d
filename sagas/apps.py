from django.apps import AppConfig


class SagasConfig(AppConfig):
    name = "sagas"
    verbose_name = "Sagas"
    default_auto_field = "django.db.models.BigAutoField"
