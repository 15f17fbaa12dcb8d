"""Optional layers of the outbox app, each needing an extra: ``metrics`` (``[metrics]``:
prometheus-client) and tracing through :mod:`ledon.tracing` (``[otel]``:
opentelemetry-api). No core module imports them: the app's
:class:`~ledon.observability.OptionalLayers` does, when ``OUTBOX["METRICS"]`` or
``OUTBOX["TRACING"]`` asks for them (at start-up, and again when the setting changes).
"""
