"""What the apps' settings share: the reader of a settings dict, the checks of values
every app makes alike (:class:`ValueChecks`), where their reference lives, and the
message for keys that do not exist (with the key that was probably meant)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from .naming import did_you_mean

#: The published documentation; its settings reference is ``settings.html``
#: (``docs/settings.md`` in the source).
DOCS_URL = "https://django-ledon.readthedocs.io/en/latest/"


def is_number(value: object) -> bool:
    """An int or a float, not a bool (which Python counts as an int)."""
    return not isinstance(value, bool) and isinstance(value, int | float)


def is_database_alias_or_none(value: object) -> bool:
    """None, or an alias of ``DATABASES`` (an app's ``LISTEN_DATABASE``)."""
    return value is None or (isinstance(value, str) and value in settings.DATABASES)


def metrics_token() -> str | None:
    """``settings.LEDON_METRICS_TOKEN``: the bearer token a scraper may send to
    :func:`ledon.metrics.metrics_view` (None or empty: no token is accepted). A value
    that is not a string is an ``ImproperlyConfigured`` (``ledon.E001`` says so at
    ``manage.py check``)."""
    token = getattr(settings, "LEDON_METRICS_TOKEN", None)
    if token is not None and not isinstance(token, str):
        raise ImproperlyConfigured(
            f"LEDON_METRICS_TOKEN must be a string or None, got {type(token).__name__}"
        )
    return token or None


def settings_reference(setting: str) -> str:
    """The address of ``setting``'s section of the settings reference."""
    return f"{DOCS_URL}settings.html#{setting.lower()}"


def settings_hint(setting: str) -> str:
    """The hint of a system check about ``setting`` (JOBS, OUTBOX, SAGAS, TASKS)."""
    return f"See the {setting} settings reference: {settings_reference(setting)}"


def unknown_keys_message(
    what: str,
    unknown: Iterable[str],
    known: Iterable[str],
    renamed: Mapping[str, str] | None = None,
) -> str:
    """``unknown JOBS setting(s): LEASE_SECOND (did you mean 'LEASE_SECONDS'?)`` for
    ``what="JOBS setting(s)"``: each unknown key with the known key it is closest to,
    if one is close enough to be a misspelling, or with its new name if ``renamed``
    (old name to new) says it was renamed."""
    choices = sorted(known)
    renamed = renamed or {}
    parts = [
        f"{key} (renamed to {renamed[key]!r})"
        if key in renamed
        else f"{key}{did_you_mean(key, choices)}"
        for key in sorted(unknown)
    ]
    return f"unknown {what}: {', '.join(parts)}"


@dataclasses.dataclass(frozen=True)
class ValueChecks:
    """The checks of one app's settings values that every app makes alike. Each raises
    ``error`` (the app's ``ImproperlyConfigured``) for the first bad key, with the
    message every setting uses: ``OUTBOX['BATCH_SIZE'] must be a positive integer, got
    0``."""

    setting: str
    error: Callable[[str], Exception]

    def fail(self, result: object, key: str, expected: str) -> Exception:
        """The error for ``key`` of ``result``, which must be ``expected``."""
        return self.error(
            f"{self.setting}[{key!r}] must be {expected}, got {getattr(result, key)!r}"
        )

    def _each(
        self, result: object, keys: Iterable[str], good: Callable[[Any], bool], expected: str
    ) -> None:
        for key in keys:
            if not good(getattr(result, key)):
                raise self.fail(result, key, expected)

    def flags(self, result: object, *keys: str) -> None:
        """Each of ``keys`` is True or False."""
        self._each(result, keys, lambda value: isinstance(value, bool), "True or False")

    def positive(self, result: object, *keys: str) -> None:
        """Each of ``keys`` is a number above 0."""
        self._each(result, keys, lambda value: is_number(value) and value > 0, "a positive number")

    def positive_or_none(self, result: object, *keys: str) -> None:
        """Each of ``keys`` is None or a number above 0 (a retention: None keeps for ever)."""
        self._each(
            result,
            keys,
            lambda value: value is None or (is_number(value) and value > 0),
            "a positive number or None",
        )

    def not_negative(self, result: object, *keys: str) -> None:
        """Each of ``keys`` is a number of seconds, 0 or more (a delay)."""
        self._each(
            result, keys, lambda value: is_number(value) and value >= 0, "a number of seconds >= 0"
        )

    def retry_pace(self, result: object) -> None:
        """The four keys of an app's automatic retries (``RETRY_BASE_DELAY``,
        ``RETRY_BACKOFF_FACTOR``, ``RETRY_MAX_DELAY``, ``RETRY_JITTER``: see
        :class:`ledon.backoff.RetryPace`) are delays, a factor of 1 or more and a
        ratio."""
        self.not_negative(result, "RETRY_BASE_DELAY", "RETRY_MAX_DELAY")
        self._each(
            result,
            ["RETRY_BACKOFF_FACTOR"],
            lambda value: is_number(value) and value >= 1,
            "a number >= 1",
        )
        self._each(
            result,
            ["RETRY_JITTER"],
            lambda value: is_number(value) and 0 <= value < 1,
            "a ratio in [0, 1)",
        )

    def int_from(
        self,
        result: object,
        key: str,
        low: int,
        high: int | None = None,
        *,
        expected: str,
        none_ok: bool = False,
    ) -> None:
        """``key`` is an int (a bool is not) from ``low`` to ``high`` (None: no upper
        bound), or None where ``none_ok``; else the error says it must be ``expected``."""
        value = getattr(result, key)
        if value is None and none_ok:
            return
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < low
            or (high is not None and value > high)
        ):
            raise self.fail(result, key, expected)

    def positive_ints(self, result: object, *keys: str) -> None:
        """Each of ``keys`` is an int above 0 (a bool is not)."""
        self._each(
            result,
            keys,
            lambda value: isinstance(value, int) and not isinstance(value, bool) and value > 0,
            "a positive integer",
        )


@dataclasses.dataclass(eq=False)
class SettingsReader[S]:
    """The only reader of one app's settings dict (``JOBS``, ``OUTBOX``, ``SAGAS``).

    Call it for the settings: read on first use (never at import time), as the
    frozen dataclass ``cls`` (whose fields are the known keys, with their defaults),
    checked by ``check_values`` (which raises ``error``, an ``ImproperlyConfigured``), and
    kept until the setting changes (``setting_changed``, which ``override_settings``
    sends) or :meth:`cache_clear`. A key in ``renamed`` (old name to new) is unknown,
    and its error names the new one.
    """

    setting: str
    cls: Callable[..., S]
    check_values: Callable[[S], None]
    error: type[Exception]
    renamed: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self._current: S | None = None
        setting_changed.connect(self._changed, weak=False, dispatch_uid=f"ledon.{self.setting}")

    def __call__(self) -> S:
        current = self._current
        if current is None:
            current = self._current = self.read(getattr(settings, self.setting, {}) or {})
        return current

    def read(self, values: object) -> S:
        """``values`` as this setting, checked (what a settings file would give)."""
        if not isinstance(values, dict):
            raise self.error(f"the {self.setting} setting must be a dict")
        known = {f.name for f in dataclasses.fields(self.cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - known)
        if unknown:
            raise self.error(
                unknown_keys_message(f"{self.setting} setting(s)", unknown, known, self.renamed)
            )
        result = self.cls(**values)
        self.check_values(result)
        return result

    def cache_clear(self) -> None:
        """Read the setting again on the next call."""
        self._current = None

    def _fails(self, values: dict[str, Any]) -> str | None:
        """Why ``values`` (known keys only, the others at their defaults) are not a
        valid setting, or None."""
        try:
            self.check_values(self.cls(**values))
        except self.error as exc:
            return str(exc)
        return None

    def problems(self, values: object) -> list[str]:
        """Every reason ``values`` is not a valid setting, not only the first: the
        unknown keys, then each bad key's value, then (if every value is good alone)
        what is wrong with them together."""
        if not isinstance(values, dict):
            return [f"the {self.setting} setting must be a dict"]
        known = {f.name for f in dataclasses.fields(self.cls)}  # type: ignore[arg-type]
        found = []
        unknown = sorted(set(values) - known)
        if unknown:
            found.append(
                unknown_keys_message(f"{self.setting} setting(s)", unknown, known, self.renamed)
            )
        given = {key: value for key, value in values.items() if key in known}
        alone = {key: self._fails({key: value}) for key, value in given.items()}
        suspects = {key for key, reason in alone.items() if reason is not None}
        for key in sorted(suspects):
            # A value may be bad only beside the others' defaults (a lease shorter than
            # the default heartbeat): with the given values that are good, it may pass.
            context = {k: v for k, v in given.items() if k not in suspects or k == key}
            if self._fails(context) is not None:
                found.append(str(alone[key]))
        if not suspects:
            together = self._fails(given)
            if together is not None:
                found.append(together)
        return found

    def check(self, check_id: str) -> list[checks.CheckMessage]:
        """The system check of the setting: one error ``check_id`` per problem, every
        bad key at once (:meth:`problems`)."""
        self.cache_clear()
        try:
            self()
        except self.error as exc:
            values = getattr(settings, self.setting, {}) or {}
            hint = settings_hint(self.setting)
            return [
                checks.Error(message, hint=hint, id=check_id)
                for message in self.problems(values) or [str(exc)]
            ]
        return []

    def _changed(self, *, setting: str, **kwargs: Any) -> None:
        if setting == self.setting:
            self.cache_clear()
