"""The base of the bulk commands (``manage.py bulk_jobs``, and any app's like it): one
subcommand per operation, the filter options every app shares, ``--dry-run`` and
``--batch-size``; a line per batch while it runs and a summary at the end.

An app's command says what its rows are called, its status values, its operations
(with their own options) and how a :class:`~ledon.bulk.BulkFilter` becomes its rows::

    class Command(BulkCommand):
        noun = "job(s)"
        name_help = "a handler name"
        invalid_input = InvalidInput            # the app's typed error for bad input
        app_errors = (JobsError,)               # errors that end the command, said plainly
        operations = {"cancel": "cancel ...", "retry": "retry ..."}

        def statuses(self): return JobStatus.values
        def rows(self, selection): return bulk.matching(selection)
        def action(self, operation, options): return bulk.cancel_action() ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet

from .bulk import DEFAULT_BATCH, BulkAction, BulkFilter, BulkProgress, run_bulk
from .db import DATABASE_ERRORS


class BulkCommand(BaseCommand):
    """``<command> OPERATION [filters] [--dry-run] [--batch-size N] [--all]``.

    Without a filter the command refuses unless ``--all`` says every row is meant. Bad
    input (a status the app does not have, a time that is not ISO 8601, ``--since``
    not before ``--until``, a tag that is not ``KEY=VALUE``, an operation's bad
    option) ends it with the app's typed error's message and writes nothing. A
    database error ends it with what was done so far: running it again goes on."""

    #: What one row is called in the lines printed: ``"job(s)"``.
    noun: ClassVar[str]
    #: What ``--name`` matches, for its help: ``"a handler name"``.
    name_help: ClassVar[str]
    #: The app's error for bad input, raised for a bad filter.
    invalid_input: ClassVar[type[Exception]]
    #: The app's errors that end the command with their message alone.
    app_errors: ClassVar[tuple[type[Exception], ...]]
    #: Each operation's name and help.
    operations: ClassVar[Mapping[str, str]]
    #: Whether ``--scope`` applies (the app's rows belong to a scope).
    scoped: ClassVar[bool] = True
    #: Whether ``--tag`` applies (the app's rows carry tags).
    tagged: ClassVar[bool] = False

    def statuses(self) -> Sequence[str]:
        """The app's status values, for ``--status``."""
        raise NotImplementedError

    def rows(self, selection: BulkFilter) -> QuerySet[Any]:
        """The app's rows ``selection`` matches."""
        raise NotImplementedError

    def action(self, operation: str, options: Mapping[str, Any]) -> BulkAction:
        """The operation to run, built from its options (checked: the app's error)."""
        raise NotImplementedError

    def add_operation_arguments(self, operation: str, parser: CommandParser) -> None:
        """An operation's own options (``--extra-attempts`` for a retry)."""

    def add_arguments(self, parser: CommandParser) -> None:
        names = "|".join(self.operations)
        subparsers = parser.add_subparsers(dest="operation", required=True, metavar=names)
        for operation, text in self.operations.items():
            sub = subparsers.add_parser(operation, help=text, description=text)
            self._add_filter_arguments(sub)
            self.add_operation_arguments(operation, sub)

    def _add_filter_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--status", help="a status value (as stored: failed, queued…)")
        parser.add_argument("--name", help=f"{self.name_help}, exactly")
        if self.scoped:
            parser.add_argument(
                "--scope", help="a scope as your code passes it (hashed as the scoped API does)"
            )
        for option, text in (("--since", "at or after"), ("--until", "before")):
            parser.add_argument(
                option,
                metavar="WHEN",
                help=f"created {text} WHEN: ISO 8601, a date or a date and time (without "
                "an offset: UTC)",
            )
        parser.add_argument(
            "--error-contains", metavar="TEXT", help="its stored error contains TEXT (any case)"
        )
        if self.tagged:
            parser.add_argument(
                "--tag",
                action="append",
                metavar="KEY=VALUE",
                help="it carries the tag KEY with the value VALUE, exactly (repeatable: "
                "every pair given)",
            )
        parser.add_argument(
            "--all", action="store_true", help="act on every row when no filter is given"
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="count what would change, and what would be skipped and why; change nothing",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH,
            metavar="N",
            help=f"rows per transaction (default: {DEFAULT_BATCH})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        operation = options["operation"]
        progress: list[BulkProgress] = []
        try:
            selection = BulkFilter.parse(
                statuses=self.statuses(),
                error=self.invalid_input,
                status=options["status"],
                name=options["name"],
                scope=options.get("scope"),
                since=options["since"],
                until=options["until"],
                error_contains=options["error_contains"],
                tags=options.get("tag"),
            )
            if selection.is_empty and not options["all"]:
                raise CommandError(
                    f"give at least one filter (--status, --name, … see --help), or --all "
                    f"to {operation} every {self.noun.removesuffix('(s)')}"
                )
            rows = self.rows(selection)
            action = self.action(operation, options)
            if options["verbosity"] >= 1:
                self.stdout.write(f"{self.name_of_command()} {operation}: {selection.describe()}")
                self.stdout.flush()

            def report_batch(state: BulkProgress) -> None:
                progress.append(state)
                if options["verbosity"] >= 1:
                    self.stdout.write(state.describe(action))
                    self.stdout.flush()

            report = run_bulk(
                rows,
                action,
                error=self.invalid_input,
                dry_run=options["dry_run"],
                batch_size=options["batch_size"],
                on_batch=report_batch,
            )
        except self.app_errors as exc:
            raise CommandError(str(exc)) from exc
        except DATABASE_ERRORS as exc:
            done = progress[-1].describe(action) if progress else "before the first batch"
            raise CommandError(
                f"stopped by a database error ({exc}); done so far: {done}. The failed "
                "batch was rolled back; run the same command again to go on."
            ) from exc
        self.stdout.write(self.style.SUCCESS(report.summary(self.noun)))

    def name_of_command(self) -> str:
        """The command's name (its module's), for the first line."""
        return type(self).__module__.rsplit(".", 1)[-1]
