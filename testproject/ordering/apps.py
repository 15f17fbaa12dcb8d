from django.apps import AppConfig


class OrderingConfig(AppConfig):
    """Handlers of batches and sequences for the process tests and the benchmarks.
    Installed only when ``ORDERING_TASKS`` is set."""

    name = "testproject.ordering"
    label = "ordering"
    verbose_name = "Batches and sequences (demo)"
