"""The time a transition is recorded at, the same rule in every app's store."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone


def aware_utc(value: object, what: str, *, error: type[Exception]) -> datetime:
    """``value`` as an aware datetime in UTC (microseconds kept), else ``error``
    saying why: a naive time has no meaning across machines."""
    if not isinstance(value, datetime):
        raise error(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise error(f"{what} must be timezone-aware (UTC is used throughout)")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        # datetime.max at a negative offset is past year 9999 in UTC.
        raise error(f"{what} {value.isoformat()} is out of range in UTC") from None


def current_time(now: datetime | None, *, error: type[Exception]) -> datetime:
    """``now`` (checked by :func:`aware_utc`) or, when None, the current time. Stores
    take ``now`` from their callers so that tests and engines can inject a clock."""
    return timezone.now() if now is None else aware_utc(now, "now", error=error)
