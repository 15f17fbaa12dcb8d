"""``manage.py recover_sagas``: a thin wrapper over :class:`sagas.runner.SagaRunner`."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledon.commands import run_engine
from ledon.engine import StopLevel
from sagas import validation
from sagas.exceptions import SagaError
from sagas.registry import registered_sagas
from sagas.runner import SagaRunner
from sagas.types import SagaSnapshot

#: What each signal does, by the stop level it reaches.
SIGNAL_MEANING = {
    StopLevel.GRACEFUL: "stopping after the current step (a second signal cancels it)",
    StopLevel.CANCEL: "cancelling the current step; the instance is released, not compensated",
    StopLevel.ABORT: "no more waiting for the step: releasing the instance and exiting",
}


class Command(BaseCommand):
    help = (
        "Recover saga instances: claim running or compensating instances whose lease "
        "expired (or that were only started) and drive them to their end."
    )

    def add_arguments(self, parser: CommandParser) -> None:
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

    def handle(self, *args: Any, **options: Any) -> None:
        known = {d.name for d in registered_sagas()}
        names = options["sagas"]
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
            on_event=self._printer(options["verbosity"]),
        )

        run_engine(
            runner, runner.run, out=self.stdout, name=f"saga runner {runner.runner_id}",
            meaning=SIGNAL_MEANING, style=self.style.SUCCESS,
        )  # fmt: skip

    def _printer(self, verbosity: int) -> Any:
        quiet = {"step-completed", "step-compensated", "stopped"}

        def emit(event: str, state: SagaSnapshot | None, detail: str) -> None:
            if verbosity < 1 or (verbosity < 2 and event in quiet) or event == "stopped":
                return
            what = f"saga {state.name} {state.instance_id}" if state is not None else ""
            line = " ".join(p for p in (event, what, detail) if p)
            bad = ("untouched", "needs-attention", "error", "lease-lost", "step-failed")
            style = self.style.ERROR if event in bad else (lambda s: s)
            self.stdout.write(style(line))
            self.stdout.flush()

        return emit
