"""``manage.py chaos_feed --units N``: write the chaos workload, unit by unit.

Each unit's writes are retried until they are acknowledged, the way the guarantees
page tells a caller to retry after an ambiguous error: the same call again on a new
connection. Jobs have ids and sagas idempotency keys; a unit's orders (with their
messages and runs) commit together with the ``Order`` rows, so that a retry whose
first try did commit finds them and writes nothing. Before each unit the feeder waits
while more than ``--window`` jobs are queued or running, so that the backlog stays
about what the engines can finish in a few seconds, however busy the machine.

With ``--gate FILE`` it writes unit ``n`` only once ``FILE`` holds a number above
``n``: the chaos run keeps the feed just ahead of its faults.

It prints ``acknowledged <unit> <seconds>`` after each unit and ``fed <units>`` at the
end (the seconds since it started, on its own clock).
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, InterfaceError, close_old_connections, connection
from django.utils import timezone

from jobs import JobSubmission, submit_jobs
from ledon.backoff import Backoff
from outbox import unit_of_work
from sagas import start_saga
from workflows import stage_workflow

from ...events import OrderPlaced
from ...models import Order
from ...workload import CONSUMER, JOB_HANDLER, MESSAGE, RUN_SLEEP, SAGA, SCOPE, WORKFLOW, Unit


def wait_for_gate(gate: Path, unit: int) -> None:
    """Until ``gate`` holds a number above ``unit``."""
    while True:
        try:
            if int(gate.read_text() or 0) > unit:
                return
        except (OSError, ValueError):
            pass  # not written yet, or being written
        time.sleep(0.05)


class Command(BaseCommand):
    help = "Write the chaos workload, unit by unit, retrying each write until acknowledged."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--units", type=int, required=True)
        parser.add_argument("--first", type=int, default=0, help="the first unit to write")
        parser.add_argument(
            "--window", type=int, default=1000, help="most jobs queued or running before a unit"
        )
        parser.add_argument("--gate", default=None, help="a file: write only the units below it")

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        self.retries = 0
        for number in range(options["first"], options["units"]):
            if options["gate"]:
                wait_for_gate(Path(options["gate"]), number)
            self.retried(lambda: self.wait_for_room(options["window"]))
            self.feed(Unit(number))
            self.stdout.write(f"acknowledged {number} {time.monotonic() - started:.3f}")
            self.stdout.flush()
        self.stdout.write(f"fed {options['units']} retries {self.retries}")

    def retried(self, call: Any) -> Any:
        """``call()`` until it returns; a database error is retried on a new
        connection after a back-off."""
        backoff = Backoff()
        while True:
            try:
                return call()
            except (DatabaseError, InterfaceError) as exc:
                self.retries += 1
                self.stderr.write(f"retrying after {type(exc).__name__}: {str(exc)[:200]}")
                close_old_connections()
                connection.close()
                time.sleep(backoff.next_delay())

    def wait_for_room(self, window: int) -> None:
        """Until at most ``window`` jobs are queued or running and at most a fifth as
        many of the workload's messages wait to be consumed (the feed's own pace: a
        message is a fifth of a unit's jobs)."""
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT (SELECT count(*) FROM jobs_job WHERE status IN ('queued', 'running')),"
                    " (SELECT count(*) FROM outbox_outboxmessage WHERE event_type = %s)"
                    " - (SELECT count(*) FROM outbox_inboxmessage WHERE consumer = %s)",
                    [MESSAGE, CONSUMER],
                )
                jobs, messages = cursor.fetchone()
            if jobs <= window and messages * 5 <= window:
                return
            time.sleep(0.1)

    def feed(self, unit: Unit) -> None:
        now = timezone.now()
        jobs = [
            (
                SCOPE,
                job_id,
                JobSubmission.create(
                    JOB_HANDLER,
                    {"unit": unit.number},
                    max_attempts=25,
                    not_before=None if delay is None else now + timedelta(seconds=delay),
                ),
            )
            for i, job_id in enumerate(unit.job_ids())
            for delay in [unit.delay(i)]
        ]
        # The same submissions again on a retry: identical, so the existing jobs return.
        self.retried(lambda: submit_jobs(jobs))
        self.retried(lambda: self.place_orders(unit))
        for key, fail in unit.sagas():
            self.retried(
                lambda key=key, fail=fail: start_saga(
                    SAGA, {"key": key, "fail": fail}, idempotency_key=key
                )
            )

    def place_orders(self, unit: Unit) -> None:
        orders = unit.orders()
        with unit_of_work() as uow:
            numbers = [number for number, _ in orders]
            if Order.objects.filter(number__in=numbers).exists():
                return  # an earlier try committed, its reply lost
            for number, run_id in orders:
                Order.objects.create(number=number, run_id=run_id)
                if run_id:
                    stage_workflow(SCOPE, run_id, WORKFLOW, {"sleep": RUN_SLEEP})
                uow.add_integration_event(OrderPlaced(number, run_id), key=number)
