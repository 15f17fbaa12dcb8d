"""Watching the sagas app run: :mod:`.hooks`, :mod:`.reads` and :mod:`.metrics` (when
``SAGAS["METRICS"]`` asks for it), laid out as :mod:`ledon.observability` describes."""
