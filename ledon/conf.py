"""What the three apps' settings share: the reader of a settings dict, where their
reference lives, and the message for keys that do not exist (with the key that was
probably meant)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.signals import setting_changed

#: The published documentation; its settings reference is ``settings.html``
#: (``docs/settings.md`` in the source).
DOCS_URL = "https://django-ledon.readthedocs.io/en/latest/"


def settings_reference(setting: str) -> str:
    """The address of ``setting``'s section of the settings reference."""
    return f"{DOCS_URL}settings.html#{setting.lower()}"


def settings_hint(setting: str) -> str:
    """The hint of a system check about ``setting`` (JOBS, OUTBOX, SAGAS, TASKS)."""
    return f"See the {setting} settings reference: {settings_reference(setting)}"


def unknown_keys_message(what: str, unknown: Iterable[str], known: Iterable[str]) -> str:
    """``unknown JOBS setting(s): LEASE_SECOND (did you mean 'LEASE_SECONDS'?)`` for
    ``what="JOBS setting(s)"``: each unknown key with the known key it is closest to,
    if one is close enough to be a misspelling."""
    choices = sorted(known)
    parts = []
    for key in sorted(unknown):
        close = difflib.get_close_matches(key, choices, n=1, cutoff=0.7)
        parts.append(f"{key} (did you mean {close[0]!r}?)" if close else key)
    return f"unknown {what}: {', '.join(parts)}"


class SettingsReader[S]:
    """The only reader of one app's settings dict (``JOBS``, ``OUTBOX``, ``SAGAS``).

    Call it for the settings: read on first use (never at import time), checked by
    ``validate`` (which raises ``error``, an ``ImproperlyConfigured``), and kept until
    the setting changes (``setting_changed``, which ``override_settings`` sends) or
    :meth:`cache_clear`.
    """

    def __init__(
        self,
        setting: str,
        validate: Callable[[dict[str, Any]], S],
        error: type[Exception],
    ) -> None:
        self.setting = setting
        self.validate = validate
        self.error = error
        self._current: S | None = None
        setting_changed.connect(self._changed, weak=False, dispatch_uid=f"ledon.{setting}")

    def __call__(self) -> S:
        current = self._current
        if current is None:
            values = getattr(settings, self.setting, {}) or {}
            if not isinstance(values, dict):
                raise self.error(f"the {self.setting} setting must be a dict")
            current = self._current = self.validate(dict(values))
        return current

    def cache_clear(self) -> None:
        """Read the setting again on the next call."""
        self._current = None

    def check(self, check_id: str) -> list[checks.CheckMessage]:
        """The system check of the setting: one error ``check_id`` if it is invalid."""
        self.cache_clear()
        try:
            self()
        except self.error as exc:
            return [checks.Error(str(exc), hint=settings_hint(self.setting), id=check_id)]
        return []

    def _changed(self, *, setting: str, **kwargs: Any) -> None:
        if setting == self.setting:
            self.cache_clear()
