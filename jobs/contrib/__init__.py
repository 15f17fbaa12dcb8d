"""Optional layers of the jobs app, each needing an extra: ``metrics`` (``[metrics]``:
prometheus-client) and tracing through :mod:`ledon.tracing` (``[otel]``:
opentelemetry-api). No core module imports them: the app's
:class:`~ledon.observability.OptionalLayers` does, when ``JOBS["METRICS"]`` or
``JOBS["TRACING"]`` asks for them (at start-up, and again when the setting changes).
"""
