"""Internal: code that every app of django-ledon shares and that imports no models.

Not a Django app (never in ``INSTALLED_APPS``) and not public API: ``jobs``, ``outbox``
and ``sagas`` import from here; this package imports nothing from them.
"""
