"""``manage.py list_schedules``: every schedule declared or stored, with its next run and
its last run's job and status."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.exceptions import JobsError
from jobs.management.tables import write_table
from jobs.schedules.service import list_schedules

COLUMNS = ("name", "timetable", "next run (UTC)", "last run", "status", "state")


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%SZ")


class Command(BaseCommand):
    help = (
        "List the schedules (@periodic): timetable and time zone, next run, last run's job "
        "and its status, and whether each is active, paused or orphaned."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="one JSON object per schedule")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            views = list_schedules()
        except JobsError as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            for view in views:
                self.stdout.write(
                    json.dumps(
                        {
                            "name": view.name,
                            "timetable": view.timetable,
                            "timezone": view.timezone,
                            "catch_up": view.catch_up,
                            "handler": view.handler,
                            "next_run_at": view.next_run_at and view.next_run_at.isoformat(),
                            "last_period": view.last_period and view.last_period.isoformat(),
                            "last_job_id": view.last_job_id or None,
                            "last_job_status": view.last_job_status,
                            "paused": view.paused,
                            "state": view.state,
                        }
                    )
                )
            return
        rows = [
            (
                view.name,
                view.timetable,
                _time(view.next_run_at),
                view.last_job_id or "-",
                view.last_job_status or "-",
                view.state,
            )
            for view in views
        ]
        write_table(self.stdout, COLUMNS, rows, empty="No schedules are declared or stored.")
