"""When a schedule's periods start: cron expressions in a time zone, and fixed intervals.

Cron expressions are parsed and matched by ``cronsim`` on *local wall-clock* times
(naive datetimes, where no daylight-saving change exists); each matching local time is
then turned into an instant of the schedule's zone (``zoneinfo``) by this rule:

- a local time that exists once is that instant;
- a local time skipped by a spring change (02:30 in Europe/Paris on the last Sunday
  of March) runs at the first instant after the gap (03:00 CEST);
- a local time repeated by an autumn change (02:30 on the last Sunday of October)
  runs once, at its first occurrence (02:30 CEST).

Every expression follows this rule, those that run every hour or more often included:
in a zone with daylight-saving time, ``*/15 * * * *`` does not run in the repeated
hour's second pass. For "every 15 minutes of real time", use ``timezone="UTC"`` or an
interval.

``cronsim`` comes with the ``[cron]`` extra (``pip install "django-ledon[cron]"``);
without it a cron schedule is refused at its declaration, intervals still work.

Intervals (``every=timedelta(...)``) are anchored to the Unix epoch in UTC: their
periods start at ``1970-01-01T00:00:00Z + k * every``, the same on every machine and
after every restart, with no stored anchor. Every period start is a whole second.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Protocol
from zoneinfo import ZoneInfo

__all__ = [
    "ALIASES",
    "CronTimetable",
    "IntervalTimetable",
    "Timetable",
    "TimetableError",
    "job_id_time",
]

#: The shorthands of crontab(5), as the five fields they stand for (``@reboot`` has no
#: meaning for a job system and is refused).
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_SECOND = timedelta(seconds=1)
#: The longest interval the table stores (a 32-bit count of seconds: about 68 years).
_LONGEST = timedelta(seconds=2**31 - 1)


class TimetableError(ValueError):
    """A cron expression, time zone or interval that cannot make a timetable."""


def _cronsim() -> ModuleType:
    """The cron library, imported when a cron schedule is declared: an optional extra."""
    try:
        import cronsim  # an optional extra ([cron]): imported only when it is needed
    except ImportError:
        raise TimetableError(
            'cron schedules need the cronsim package: pip install "django-ledon[cron]" '
            "(intervals, every=timedelta(...), need nothing more)"
        ) from None
    return cronsim


def job_id_time(period: datetime) -> str:
    """A period start as job ids carry it: UTC, ISO 8601 with seconds, ``Z``."""
    return period.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Timetable(Protocol):
    """The period starts of a schedule, as aware UTC datetimes."""

    def after(self, moment: datetime) -> datetime:
        """The first period start strictly after ``moment``."""
        ...

    def at_or_before(self, moment: datetime) -> datetime:
        """The last period start at or before ``moment``."""
        ...

    def describe(self) -> str:
        """The timetable in words, for people."""
        ...


def normalise_cron(expression: object) -> str:
    """The five fields of a cron expression (an alias replaced), single-spaced;
    :class:`TimetableError` if it is not one."""
    if not isinstance(expression, str):
        raise TimetableError(f"a cron expression is a str, not {type(expression).__name__}")
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            known = ", ".join(ALIASES)
            raise TimetableError(f"unknown cron alias {text!r}; the aliases are {known}")
        return ALIASES[text.lower()]
    fields = text.split(" ")
    if len(fields) != 5 or not text:
        raise TimetableError(
            f"cron expression {expression!r} must have five fields "
            "(minute hour day-of-month month day-of-week)"
        )
    return text


def zone(name: object) -> ZoneInfo:
    """The ``zoneinfo`` zone of this name; :class:`TimetableError` if there is none."""
    if isinstance(name, ZoneInfo):
        return name
    if not isinstance(name, str) or not name:
        raise TimetableError(f"a time zone is an IANA name such as 'Europe/Paris', not {name!r}")
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError
        raise TimetableError(f"unknown time zone {name!r}") from None


@dataclass(frozen=True, slots=True)
class CronTimetable:
    """Periods of a five-field cron expression evaluated in ``tz`` (see the module)."""

    expression: str
    tz: ZoneInfo

    def __post_init__(self) -> None:
        cronsim = _cronsim()
        try:
            probe = cronsim.CronSim(self.expression, datetime(2000, 1, 1))
            next(probe)
        except cronsim.CronSimError as exc:
            raise TimetableError(f"invalid cron expression {self.expression!r}: {exc}") from None
        except StopIteration:
            raise TimetableError(
                f"cron expression {self.expression!r} never matches a date"
            ) from None

    @classmethod
    def parse(cls, expression: object, timezone: object = "UTC") -> CronTimetable:
        return cls(normalise_cron(expression), zone(timezone))

    @property
    def zone_name(self) -> str:
        return self.tz.key

    def describe(self) -> str:
        words: str = _cronsim().CronSim(self.expression, datetime(2000, 1, 1)).explain()
        return f"{words} ({self.zone_name})"

    # -------------------------------------------------------------- local -> instant

    def _instant(self, local: datetime) -> datetime:
        """The instant of a local wall-clock time (naive) (a skipped time runs at the
        first instant after the gap, a repeated time once, at its first occurrence)."""
        first = local.replace(tzinfo=self.tz)  # fold=0: the first of a repeated time
        instant = first.astimezone(UTC)
        if instant.astimezone(self.tz).replace(tzinfo=None) == local:
            return instant
        # Skipped by a spring change: the first instant after the gap. zoneinfo puts
        # the two readings of the missing time on either side of the transition.
        low = local.replace(tzinfo=self.tz, fold=1).astimezone(UTC)
        high = instant
        if low > high:
            low, high = high, low
        # The transition is the first whole second whose offset is the later one.
        after = high.astimezone(self.tz).utcoffset()
        low_s, high_s = int((low - EPOCH).total_seconds()), int((high - EPOCH).total_seconds())
        while high_s - low_s > 1:
            middle = (low_s + high_s) // 2
            if (EPOCH + timedelta(seconds=middle)).astimezone(self.tz).utcoffset() == after:
                high_s = middle
            else:
                low_s = middle
        return EPOCH + timedelta(seconds=high_s)

    # -------------------------------------------------------------- queries

    def after(self, moment: datetime) -> datetime:
        local = moment.astimezone(self.tz).replace(tzinfo=None, fold=0)
        # Local times after the moment's own can still map to earlier instants (the
        # first pass of a repeated hour when the moment is in its second pass): skip.
        for candidate in _cronsim().CronSim(self.expression, local):
            instant = self._instant(candidate)
            if instant > moment:
                return instant
        raise TimetableError(f"cron expression {self.expression!r} has no further date")

    def at_or_before(self, moment: datetime) -> datetime:
        local_aware = moment.astimezone(self.tz)
        local = local_aware.replace(tzinfo=None, fold=0)
        if local_aware.fold:
            # In the second pass of a repeated hour: the first pass's later local times
            # are earlier instants, so the search starts from the end of that hour.
            first_offset = local_aware.replace(fold=0).utcoffset()
            second_offset = local_aware.utcoffset()
            assert first_offset is not None
            assert second_offset is not None
            local += first_offset - second_offset
        for candidate in _cronsim().CronSim(self.expression, local + _MICROSECOND, reverse=True):
            instant = self._instant(candidate)
            if instant <= moment:
                return instant
        raise TimetableError(f"cron expression {self.expression!r} has no earlier date")


@dataclass(frozen=True, slots=True)
class IntervalTimetable:
    """Periods every ``seconds`` seconds, anchored to the Unix epoch in UTC."""

    seconds: int

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, int) or self.seconds < 1:
            raise TimetableError(
                f"an interval is a whole number of seconds >= 1, not {self.seconds!r}"
            )

    @classmethod
    def parse(cls, every: object) -> IntervalTimetable:
        if not isinstance(every, timedelta):
            raise TimetableError(f"every= takes a datetime.timedelta, not {type(every).__name__}")
        if every <= timedelta(0) or every % _SECOND:
            raise TimetableError(f"every= must be a positive whole number of seconds, not {every}")
        if every > _LONGEST:
            raise TimetableError(f"every= must be at most {_LONGEST.days} days, not {every}")
        return cls(every // _SECOND)

    @property
    def every(self) -> timedelta:
        return timedelta(seconds=self.seconds)

    def describe(self) -> str:
        return f"every {self.every} (from the Unix epoch, UTC)"

    def at_or_before(self, moment: datetime) -> datetime:
        elapsed = (moment - EPOCH) // _MICROSECOND
        step = self.seconds * 1_000_000
        return EPOCH + timedelta(microseconds=(elapsed // step) * step)

    def after(self, moment: datetime) -> datetime:
        return self.at_or_before(moment) + self.every
