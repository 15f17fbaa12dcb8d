"""``manage.py bulk_workflows cancel|resume``: every run a filter matches, in batches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import QuerySet

from ledon.bulk import BulkAction, BulkFilter
from ledon.bulk_command import BulkCommand
from workflows import bulk
from workflows.exceptions import InvalidInput, WorkflowError
from workflows.models import WorkflowRun
from workflows.types import RunStatus


class Command(BulkCommand):
    help = (
        "Cancel or resume every workflow run a filter matches (--status, --name, --scope, "
        "--since, --until, --error-contains, --tag), in short batches that never hold up a "
        "worker; --dry-run counts first and changes nothing."
    )
    noun = "run(s)"
    name_help = "a workflow name"
    tagged = True
    invalid_input = InvalidInput
    app_errors = (WorkflowError,)
    operations = {
        "cancel": "Waiting runs end Cancelled at once, Running ones are asked to stop (with "
        "their unfinished children and items), finished ones are left",
        "resume": "Failed runs advance again: their failed steps run again with fresh "
        "retries, recorded ones keep their values",
    }

    def statuses(self) -> Sequence[str]:
        return RunStatus.values

    def rows(self, selection: BulkFilter) -> QuerySet[WorkflowRun]:
        return bulk.matching(selection)

    def action(self, operation: str, options: Mapping[str, Any]) -> BulkAction:
        if operation == "resume":
            return bulk.resume_action()
        return bulk.cancel_action()
