"""``manage.py recover_sagas``: a thin wrapper over :class:`sagas.runner.SagaRunner`."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ledon.commands import EngineCommand, EngineStart, engine_id_option
from ledon.engine import StopLevel
from sagas import validation
from sagas.exceptions import SagaError
from sagas.registry import registered_sagas
from sagas.runner import SagaRunner
from sagas.types import SagaSnapshot


class Command(EngineCommand):
    help = (
        "Recover saga instances: claim running or compensating instances whose lease "
        "expired (or that were only started) and drive them to their end."
    )
    signal_meaning = {
        StopLevel.GRACEFUL: "stopping after the current step (a second signal cancels it)",
        StopLevel.CANCEL: "cancelling the current step; the instance is released, not compensated",
        StopLevel.ABORT: "no more waiting for the step: releasing the instance and exiting",
    }
    quiet_events = frozenset({"step-completed", "step-compensated"})
    loud_events = frozenset({"untouched", "needs-attention", "error", "lease-lost", "step-failed"})
    loud_style = "ERROR"

    def add_engine_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--burst", action="store_true", help="exit when no instance is left to claim"
        )
        parser.add_argument(
            "--runner-id",
            default=None,
            help="id this runner leases instances under (default: host:pid:random)",
        )
        parser.add_argument(
            "--saga",
            action="append",
            dest="sagas",
            default=None,
            metavar="NAME",
            help="only instances of this saga (repeatable; default: every registered saga)",
        )

    def start(self, options: dict[str, Any]) -> EngineStart:
        known = {d.name for d in registered_sagas()}
        names = options["sagas"]
        engine_id_option(options["runner_id"], "--runner-id", "host:pid:random")
        try:
            if options["runner_id"] is not None:
                validation.text(options["runner_id"], "runner id", validation.MAX_OWNER_LENGTH)
            for name in names or []:
                validation.saga_name(name)
        except SagaError as exc:
            raise CommandError(str(exc)) from exc
        unknown = sorted(set(names or []) - known)
        if unknown:
            raise CommandError(
                f"no saga is registered as {', '.join(map(repr, unknown))}; registered: "
                f"{', '.join(sorted(known)) or 'none'}"
            )
        runner = SagaRunner(
            runner_id=options["runner_id"],
            burst=options["burst"],
            names=names,
            on_event=self.printer(options["verbosity"]),
        )
        return EngineStart(runner, runner.run, f"saga runner {runner.runner_id}")

    def describe(self, subject: SagaSnapshot) -> str:
        return f"saga {subject.name} {subject.instance_id}"
