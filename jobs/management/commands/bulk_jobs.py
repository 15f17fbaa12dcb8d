"""``manage.py bulk_jobs cancel|retry``: every job a filter matches, in batches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.core.management.base import CommandParser
from django.db.models import QuerySet

from jobs import bulk
from jobs.exceptions import InvalidInput, JobsError
from jobs.models import Job
from jobs.types import JobStatus
from ledon.bulk import BulkAction, BulkFilter
from ledon.bulk_command import BulkCommand


class Command(BulkCommand):
    help = (
        "Cancel or retry every job a filter matches (--status, --name, --scope, --since, "
        "--until, --error-contains), in short batches that never hold up a worker's "
        "claims; --dry-run counts first and changes nothing."
    )
    noun = "job(s)"
    name_help = "a handler name"
    invalid_input = InvalidInput
    app_errors = (JobsError,)
    operations = {
        "cancel": "Queued jobs end Cancelled at once, Running ones are asked to stop, "
        "finished ones are left",
        "retry": "Failed, Cancelled and Interrupted jobs with an attempt left are queued "
        "again (--extra-attempts grants more)",
    }

    def add_operation_arguments(self, operation: str, parser: CommandParser) -> None:
        if operation == "retry":
            parser.add_argument(
                "--extra-attempts",
                type=int,
                default=0,
                metavar="N",
                help="grant each job N more attempts, as JobScope.retry(extra_attempts=N) "
                "does (default: 0, only jobs with an attempt left are retried)",
            )

    def statuses(self) -> Sequence[str]:
        return JobStatus.values

    def rows(self, selection: BulkFilter) -> QuerySet[Job]:
        return bulk.matching(selection)

    def action(self, operation: str, options: Mapping[str, Any]) -> BulkAction:
        if operation == "retry":
            return bulk.retry_action(options["extra_attempts"])
        return bulk.cancel_action()
