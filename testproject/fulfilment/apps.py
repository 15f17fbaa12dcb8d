from django.apps import AppConfig


class FulfilmentConfig(AppConfig):
    name = "testproject.fulfilment"
    label = "fulfilment"
    verbose_name = "Fulfilment (saga demo)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from testproject.faults import install_from_environment

        install_from_environment("FULFILMENT_FAULT")
