"""``manage.py purge_workflows``: delete finished runs past the retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from workflows import store
from workflows.conf import workflows_settings


class Command(BaseCommand):
    help = (
        "Delete runs that finished more than WORKFLOWS['RETENTION_SECONDS'] ago (or "
        "--older-than seconds), with their checkpoints, items, signals and children, "
        "in bounded batches. Every run_jobs worker also does this on a time basis."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=float, metavar="SECONDS", default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        seconds = options["older_than"]
        if seconds is None:
            seconds = workflows_settings().RETENTION_SECONDS
        if seconds is None:
            self.stdout.write("WORKFLOWS['RETENTION_SECONDS'] is None: finished runs are kept")
            return
        cutoff = timezone.now() - timedelta(seconds=seconds)
        total = 0
        while deleted := store.purge_finished(older_than=cutoff):
            total += deleted
        self.stdout.write(f"deleted {total} finished runs")
