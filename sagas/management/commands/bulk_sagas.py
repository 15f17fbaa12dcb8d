"""``manage.py bulk_sagas compensate|resume``: every saga instance a filter matches, in
batches, handed to the saga runners."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.core.management.base import CommandParser
from django.db.models import QuerySet

from ledon.bulk import BulkAction, BulkFilter
from ledon.bulk_command import BulkCommand
from sagas import bulk
from sagas.exceptions import InvalidInput, SagaError
from sagas.models import SagaInstance
from sagas.types import SagaStatus


class Command(BulkCommand):
    help = (
        "Compensate or resume every saga instance a filter matches (--status, --name, "
        "--since, --until, --error-contains), in short batches that never hold up a "
        "runner; the saga runners (recover_sagas, or the one beside each run_jobs worker) "
        "then drive them. --dry-run counts first and changes nothing."
    )
    noun = "saga instance(s)"
    name_help = "a saga name"
    invalid_input = InvalidInput
    app_errors = (SagaError,)
    scoped = False
    operations = {
        "compensate": "Running instances no runner holds start compensating, failed ones "
        "(a compensation kept failing) try their compensations again; the runners undo "
        "their completed steps",
        "resume": "Running and compensating instances whose runner is gone (lease expired, "
        "or taken over before) are handed back to the runners, their takeovers counted "
        "from zero",
    }

    def add_operation_arguments(self, operation: str, parser: CommandParser) -> None:
        if operation == "compensate":
            parser.add_argument(
                "--reason",
                default="",
                metavar="TEXT",
                help="recorded as the error of each running instance that starts "
                "compensating (default: compensation requested by an operator)",
            )

    def statuses(self) -> Sequence[str]:
        return SagaStatus.values

    def rows(self, selection: BulkFilter) -> QuerySet[SagaInstance]:
        return bulk.matching(selection)

    def action(self, operation: str, options: Mapping[str, Any]) -> BulkAction:
        if operation == "compensate":
            return bulk.compensate_action(options["reason"])
        return bulk.resume_action()
