"""Watching the outbox app run: :mod:`.hooks`, :mod:`.reads` and :mod:`.metrics` (when
``OUTBOX["METRICS"]`` asks for it), laid out as :mod:`ledon.observability` describes."""
