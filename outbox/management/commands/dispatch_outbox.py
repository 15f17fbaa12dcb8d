"""``manage.py dispatch_outbox``: a thin wrapper over :class:`outbox.dispatcher.Dispatcher`."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ledon.commands import EngineCommand, EngineStart, engine_id_option
from ledon.engine import StopLevel
from outbox import validation
from outbox.conf import outbox_settings
from outbox.dispatcher import Dispatcher
from outbox.exceptions import OutboxError


class Command(EngineCommand):
    help = (
        "Deliver outbox messages through the configured transport: claim batches, "
        "publish, mark sent, retry with backoff, park poison messages."
    )
    signal_meaning = {
        StopLevel.GRACEFUL: "stopping after the current batch",
        StopLevel.CANCEL: "stopping after the current batch (a third signal stops waiting)",
        StopLevel.ABORT: "no more waiting: exiting; an unrecorded batch is delivered again",
    }
    quiet_events = frozenset({"batch"})
    loud_events = frozenset({"transport-unavailable"})

    def add_engine_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--burst", action="store_true", help="exit when no message is due")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=None,
            metavar="N",
            help="messages per batch (default: OUTBOX['BATCH_SIZE'])",
        )
        parser.add_argument(
            "--dispatcher-id",
            default=None,
            help="stable id of this dispatcher; a restart with the same id recovers its "
            "own unfinished batch at once (default: host:pid)",
        )

    def start(self, options: dict[str, Any]) -> EngineStart:
        batch_size = options["batch_size"]
        if batch_size is not None and not 1 <= batch_size <= 10_000:
            raise CommandError("--batch-size must be between 1 and 10000")
        engine_id_option(options["dispatcher_id"], "--dispatcher-id", "host:pid")
        try:
            if options["dispatcher_id"] is not None:
                validation.text(
                    options["dispatcher_id"], "dispatcher id", validation.MAX_DISPATCHER_ID_LENGTH
                )
            dispatcher = Dispatcher(
                dispatcher_id=options["dispatcher_id"],
                batch_size=batch_size,
                burst=options["burst"],
                on_event=self.printer(options["verbosity"]),
            )
        except OutboxError as exc:
            raise CommandError(str(exc)) from exc
        if not outbox_settings().ENABLED:
            self.stderr.write(
                "warning: OUTBOX['ENABLED'] is False: integration events are published in "
                "process and not stored; delivering what the outbox still holds"
            )
        self.stdout.write(
            f"dispatcher {dispatcher.dispatcher_id}: transport {outbox_settings().TRANSPORT}, "
            f"batches of {dispatcher.batch_size}"
        )
        return EngineStart(dispatcher, dispatcher.run, f"dispatcher {dispatcher.dispatcher_id}")
