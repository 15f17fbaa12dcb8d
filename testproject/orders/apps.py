from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "testproject.orders"
    label = "orders"
    verbose_name = "Orders (outbox demo)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from testproject.faults import install_from_environment

        install_from_environment("ORDERS_FAULT")
