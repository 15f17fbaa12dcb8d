"""Retention on demand: what ``purge_jobs``, ``purge_outbox``, ``purge_sagas`` and
``purge_workflows`` share. Each app names its growing tables (:class:`Purge`: what they
hold, the setting of their retention, a bounded delete and the rows it deletes); the
command deletes every one past its retention in batches, ``--older-than-days``
overriding the settings for all of them, ``--dry-run`` only counting."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from .conf import SettingsReader
from .db import alias_for

#: Rows deleted per transaction unless ``--batch-size`` says otherwise.
DEFAULT_BATCH = 1000
MAX_BATCH = 100_000


@dataclass(frozen=True, slots=True)
class Purge:
    """One table that grows: ``what`` it holds (``"finished job(s)"``), the app's
    ``settings`` reader and the ``key`` of its retention there (``"RETENTION_SECONDS"``),
    ``delete(older_than=, limit=)`` deleting one bounded batch and returning how many,
    and the ``rows`` (a callable returning the guarded QuerySet) whose ``field`` the
    cutoff applies to: what ``delete`` deletes, counted by ``--dry-run``."""

    what: str
    settings: SettingsReader[Any]
    key: str
    delete: Callable[..., int]
    rows: Callable[[], QuerySet[Any]]
    field: str

    @property
    def setting(self) -> str:
        """The setting that names the retention: ``"JOBS['RETENTION_SECONDS']"``."""
        return f"{self.settings.setting}[{self.key!r}]"

    def seconds(self) -> float | None:
        """The retention in seconds (None: kept for ever)."""
        seconds: float | None = getattr(self.settings(), self.key)
        return seconds

    def count(self, cutoff: datetime) -> int:
        """How many rows a purge up to ``cutoff`` would delete."""
        return self.rows().filter(**{f"{self.field}__lt": cutoff}).count()


def delete_oldest(
    rows: QuerySet[Any],
    field: str,
    older_than: object,
    limit: object,
    *,
    error: type[Exception],
) -> int:
    """Delete up to ``limit`` of ``rows`` whose ``field`` is before ``older_than``,
    oldest first, in one transaction: the number deleted.

    ``rows`` carries the guard (a status): the delete re-checks it and the cutoff, so
    a row that moved on meanwhile stays. On PostgreSQL a row another transaction
    holds is skipped (``SKIP LOCKED``), left to a later batch: retention never waits
    on, nor holds up, the engines' own statements. A bad cutoff or limit raises
    ``error`` (the app's typed error) and deletes nothing.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
        raise error(f"limit must be an int from 1 to {MAX_BATCH}, got {limit!r}")
    if not isinstance(older_than, datetime) or older_than.utcoffset() is None:
        raise error(f"older_than must be a timezone-aware datetime, got {older_than!r}")
    alias = alias_for(rows.model)
    rows = rows.using(alias).filter(**{f"{field}__lt": older_than})
    with transaction.atomic(using=alias):
        ids = list(
            rows.order_by(field, "id")
            .select_for_update(skip_locked=True)
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return 0
        deleted, _ = rows.filter(id__in=ids).delete()
    return deleted


def purge_all(delete: Callable[..., int], cutoff: datetime, batch: int) -> int:
    """Delete batch after batch until a batch comes back short: the total."""
    total = 0
    while count := delete(older_than=cutoff, limit=batch):
        total += count
        if count < batch:
            break
    return total


class PurgeCommand(BaseCommand):
    """The base of the purge commands: subclasses say :meth:`purges`."""

    def purges(self) -> Sequence[Purge]:
        raise NotImplementedError

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than-days",
            type=float,
            default=None,
            metavar="DAYS",
            help="delete what ended more than DAYS ago (default: each table's retention "
            "setting; a table whose setting is None is kept)",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH,
            help=f"rows deleted per transaction (default: {DEFAULT_BATCH})",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than_days"]
        if days is not None and not days > 0:
            raise CommandError("--older-than-days must be positive")
        batch = options["batch_size"]
        if not 1 <= batch <= MAX_BATCH:
            raise CommandError(f"--batch-size must be between 1 and {MAX_BATCH}")
        purges = self.purges()
        retention = {p.what: (days * 86_400 if days is not None else p.seconds()) for p in purges}
        if all(seconds is None for seconds in retention.values()):
            settings = " and ".join(p.setting for p in purges)
            raise CommandError(f"give --older-than-days or set {settings} (None keeps for ever)")
        now = timezone.now()
        for purge in purges:
            seconds = retention[purge.what]
            if seconds is None:
                self.stdout.write(f"{purge.what}: kept for ever ({purge.setting} is None)")
                continue
            cutoff = now - timedelta(seconds=seconds)
            if options["dry_run"]:
                count = purge.count(cutoff)
                self.stdout.write(
                    f"{count} {purge.what} before {cutoff.isoformat()} would be deleted"
                )
                continue
            total = purge_all(purge.delete, cutoff, batch)
            self.stdout.write(f"deleted {total} {purge.what} before {cutoff.isoformat()}")
