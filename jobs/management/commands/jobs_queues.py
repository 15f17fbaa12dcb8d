"""``manage.py jobs_queues list|pause|resume NAME``: queues' depth, Running jobs, pause
and limits; pause and resume a queue for every worker."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import execution
from jobs.conf import jobs_settings, queue_limits
from jobs.exceptions import JobsError
from jobs.management.tables import write_table

COLUMNS = ("queue", "queued", "running", "paused", "limits")


class Command(BaseCommand):
    help = (
        "Queues: 'list' shows each queue's depth (Queued jobs), Running jobs, whether it "
        "is paused and its limits (JOBS['QUEUES']); 'pause NAME' stops every worker "
        "from claiming its jobs, 'resume NAME' lets them go on."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="list|pause|resume")
        actions.add_parser("list", help="every known queue")
        for name, text in (("pause", "pause a queue"), ("resume", "resume a paused queue")):
            action = actions.add_parser(name, help=text)
            action.add_argument("name", help="the queue's name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "list":
                self._list()
            elif options["action"] == "pause":
                changed = execution.pause_queue(options["name"])
                self.stdout.write(
                    f"queue {options['name']} paused: no worker claims its jobs until "
                    "'jobs_queues resume'"
                    if changed
                    else f"queue {options['name']} was already paused"
                )
            else:
                changed = execution.resume_queue(options["name"])
                self.stdout.write(
                    f"queue {options['name']} resumed"
                    if changed
                    else f"queue {options['name']} was not paused"
                )
        except JobsError as exc:
            raise CommandError(str(exc)) from exc

    def _list(self) -> None:
        limits = queue_limits()
        configured = list(jobs_settings().QUEUES)
        rows = [
            (
                state.name,
                state.queued,
                state.running,
                "yes" if state.paused else "no",
                limits[state.name].describe() if state.name in limits else "none",
            )
            for state in execution.queue_states(configured)
        ]
        write_table(
            self.stdout, COLUMNS, rows, empty="No queue has jobs, a stored state or limits."
        )
