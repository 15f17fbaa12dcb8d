"""``manage.py run_jobs``: a thin wrapper over :class:`jobs.worker.Worker`."""

from __future__ import annotations

import math
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from jobs import execution, supervisor, validation
from jobs.exceptions import JobsError
from jobs.handlers import autodiscover, registered_handlers
from jobs.types import Claim, FinishOutcome
from jobs.worker import Worker
from ledon.commands import EngineCommand, EngineStart, engine_id_option
from ledon.engine import StopLevel

#: The most handler threads one worker process runs: each is an operating-system
#: thread that may hold a database connection of its own. Past it, run more worker
#: processes instead.
MAX_CONCURRENCY = 1000


class Command(EngineCommand):
    help = "Run jobs: claim due jobs, run their handlers, recover stopped workers' attempts."
    signal_meaning = {
        StopLevel.GRACEFUL: "stopping gracefully (a second signal cancels running handlers)",
        StopLevel.CANCEL: "cancelling running handlers now (a third signal stops waiting for them)",
        StopLevel.ABORT: "no more waiting: re-queueing what still runs and exiting",
    }
    quiet_events = frozenset({"claimed"})
    loud_events = frozenset({"failed", "lost", FinishOutcome.KEEPS_KILLING_WORKER.value})
    loud_style = "ERROR"

    def add_engine_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=1,
            metavar="N",
            help="handler threads, at most 1000; jobs are claimed only for free ones "
            "(default: %(default)s)",
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            default=[],
            metavar="NAME",
            help="only this queue (repeatable; default: every queue)",
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            help="stable id of this worker; a restart with the same id recovers its "
            "own unfinished attempts at once (default: host:pid)",
        )
        parser.add_argument(
            "--burst", action="store_true", help="exit when nothing is due and nothing runs"
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=None,
            metavar="N",
            help="run N worker processes of --concurrency threads each under one "
            f"supervisor (1 to {supervisor.MAX_PROCESSES}; default: this process alone)",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=20.0,
            metavar="S",
            help="seconds running handlers get to finish on SIGTERM/SIGINT before "
            "they are signalled to stop and re-queued (a second signal: at once)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["processes"] is None:
            return super().handle(*args, **options)
        self.check_options(options)
        try:
            boss = supervisor.Supervisor.from_options(options, write=self._line)
        except (ValueError, JobsError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"supervisor {boss.worker_id}: {boss.processes} worker processes")
        stats = boss.run()
        if stats.refused:
            raise CommandError(f"supervisor {boss.worker_id}: a worker refused to start")
        line = f"supervisor {boss.worker_id} stopped: {stats.summary()}"
        self.stdout.write(self.style.SUCCESS(line))
        return None

    def _line(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse bad options with a clear error before anything starts."""
        concurrency = options["concurrency"]
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise CommandError(
                f"--concurrency must be between 1 and {MAX_CONCURRENCY} (handler threads of "
                f"one process; run more worker processes for more), got {concurrency}"
            )
        timeout = options["shutdown_timeout"]
        if not math.isfinite(timeout) or timeout < 0:
            raise CommandError(f"--shutdown-timeout must be seconds, at least 0, got {timeout}")
        worker_id = engine_id_option(options["worker_id"], "--worker-id", "host:pid")
        try:
            for name in options["queues"]:
                validation.name(name, "queue", validation.MAX_QUEUE_LENGTH)
            if worker_id is not None:
                validation.text(worker_id, "worker id", validation.MAX_NAME_LENGTH)
        except JobsError as exc:
            raise CommandError(str(exc)) from exc

    def start(self, options: dict[str, Any]) -> EngineStart:
        self.check_options(options)
        concurrency = options["concurrency"]
        autodiscover()
        verbosity = options["verbosity"]
        worker = Worker(
            concurrency=concurrency,
            queues=options["queues"],
            worker_id=options["worker_id"],
            burst=options["burst"],
            shutdown_timeout=options["shutdown_timeout"],
            on_event=self.printer(verbosity),
        )
        handlers = ", ".join(f"{h.name}@{h.version}" for h in registered_handlers()) or "none"
        self.stdout.write(f"worker {worker.worker_id}: handlers {handlers}")
        if options["queues"]:
            self._hint_other_queues(options["queues"])
        return EngineStart(worker, worker.run, f"worker {worker.worker_id}")

    def _hint_other_queues(self, queues: list[str]) -> None:
        """Say so when none of ``queues`` has a due job while other queues do: a
        misspelt or unused ``--queue`` otherwise just claims nothing, silently."""
        try:
            due = execution.due_counts_by_queue()
        except DatabaseError:
            return  # the worker's own start-up reports what is wrong with the database
        if any(due.get(name) for name in queues):
            return
        elsewhere = {name: count for name, count in due.items() if name not in queues}
        if not elsewhere:
            return
        counts = ", ".join(f"{name}: {count}" for name, count in sorted(elsewhere.items()))
        self.stdout.write(
            self.style.WARNING(
                f"hint: no job is due in queue {', '.join(queues)}, but "
                f"{sum(elsewhere.values())} wait in other queues ({counts}); name them "
                "with --queue, or leave --queue out to take every queue"
            )
        )

    def describe(self, subject: Claim) -> str:
        return f"job {subject.job_id} ({subject.handler}@{subject.handler_version})"
