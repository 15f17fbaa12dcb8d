"""Optional layers of the sagas app, each needing an extra: ``metrics`` (``[metrics]``:
prometheus-client) and tracing through :mod:`ledon.tracing` (``[otel]``:
opentelemetry-api). No core module imports them: the app's
:class:`~ledon.observability.OptionalLayers` does, when ``SAGAS["METRICS"]`` or
``SAGAS["TRACING"]`` asks for them (at start-up, and again when the setting changes).
"""
