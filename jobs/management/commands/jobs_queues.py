"""``manage.py jobs_queues list|scopes|keys|why|pause|resume``: queues' depth, Running
jobs, pause, order and limits; each scope's weight and jobs per queue; each limit's and
limit key's state; why a job waits; pause and resume a queue for every worker."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import execution, validation
from jobs.conf import fair_queue, jobs_settings, queue_limits
from jobs.exceptions import JobNotFound, JobsError
from jobs.management.tables import write_table
from jobs.store.waiting import KeyState

COLUMNS = ("queue", "queued", "running", "paused", "order", "limits")
SCOPE_COLUMNS = ("queue", "scope", "weight", "queued", "running")


class Command(BaseCommand):
    help = (
        "Queues: 'list' shows each queue's depth (Queued jobs), Running jobs, whether it "
        "is paused, its order (fair share or submission order) and its limits "
        "(JOBS['QUEUES']); 'scopes [--queue NAME]' shows each scope's weight and jobs "
        "per queue; 'keys [--queue NAME]' shows each limit's and limit key's running jobs "
        "against its cap and its rate's free units; 'why SCOPE JOB_ID' says why a job "
        "waits; 'pause NAME' stops every worker from claiming its jobs, "
        "'resume NAME' lets them go on."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action", required=True, metavar="list|scopes|keys|why|pause|resume"
        )
        actions.add_parser("list", help="every known queue")
        scopes = actions.add_parser("scopes", help="each scope with work, per queue")
        scopes.add_argument("--queue", help="only this queue")
        keys = actions.add_parser("keys", help="each limit and limit key with work")
        keys.add_argument("--queue", help="only the limits this queue's jobs fall under")
        why = actions.add_parser("why", help="why a job has not started")
        why.add_argument("scope", help="the job's scope: its name as callers pass it, or its hash")
        why.add_argument("job_id", help="the job's id")
        for name, text in (("pause", "pause a queue"), ("resume", "resume a paused queue")):
            action = actions.add_parser(name, help=text)
            action.add_argument("name", help="the queue's name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "list":
                self._list()
            elif options["action"] == "scopes":
                self._scopes(options["queue"])
            elif options["action"] == "keys":
                self._keys(options["queue"])
            elif options["action"] == "why":
                self._why(options["scope"], options["job_id"])
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
                "fair" if fair_queue(state.name) else "submission",
                limits[state.name].describe() if state.name in limits else "none",
            )
            for state in execution.queue_states(configured)
        ]
        write_table(
            self.stdout, COLUMNS, rows, empty="No queue has jobs, a stored state or limits."
        )

    def _scopes(self, queue: str | None) -> None:
        rows = [
            (share.queue, share.scope_hash, f"{share.weight:g}", share.queued, share.running)
            for share in execution.scope_shares(queue)
        ]
        write_table(self.stdout, SCOPE_COLUMNS, rows, empty="No scope has Queued or Running jobs.")

    def _keys(self, queue: str | None) -> None:
        rows = [state.cells() for state in execution.key_states(queue)]
        write_table(
            self.stdout, KeyState.HEADINGS, rows, empty="No limit has Queued or Running jobs."
        )

    def _why(self, scope: str, job_id: str) -> None:
        found = []
        for scope_hash in sorted(validation.scope_hashes_named(scope)):
            try:
                found.append(execution.why_waiting(scope_hash, job_id))
            except JobNotFound:
                continue
        if not found:
            raise CommandError(f"no job {job_id!r} in a scope named or hashed {scope!r}")
        for waiting in found:
            self.stdout.write(
                f"job {waiting.job_id} (scope {waiting.scope_hash}, queue {waiting.queue}, "
                f"handler {waiting.handler}): {waiting.status.label}"
            )
            for reason in waiting.reasons:
                self.stdout.write(f"  - {reason.describe()}")
