"""``manage.py consume_events``: a thin wrapper over :class:`outbox.consumer.EventConsumer`."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ledon.commands import EngineCommand, EngineStart
from ledon.engine import StopLevel
from outbox.conf import outbox_settings
from outbox.consumer import EventConsumer
from outbox.exceptions import OutboxError
from outbox.transports import transport_class
from outbox.transports.kafka import KafkaTransport
from outbox.transports.rabbitmq import RabbitMQTransport


class Command(EngineCommand):
    help = (
        "Receive integration events from the configured broker and hand each to this "
        "process's subscribers in one transaction through the inbox; acknowledge after "
        "commit, park what cannot be handled."
    )
    signal_meaning = {
        StopLevel.GRACEFUL: "stopping after this message",
        StopLevel.CANCEL: "stopping after this message (a third signal stops waiting)",
        StopLevel.ABORT: "exiting now; an unacknowledged message comes again",
    }
    quiet_events = frozenset({"handled", "duplicate", "skipped", "retry"})
    loud_events = frozenset({"broker-unavailable", "parked", "retry"})
    run_errors = (OutboxError,)

    def add_engine_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--group",
            required=True,
            help="consumer name: its inbox records, its RabbitMQ queue (by default) and "
            "its Kafka consumer group",
        )
        parser.add_argument(
            "--queue", default=None, help="RabbitMQ queue to consume (default: the group name)"
        )
        parser.add_argument(
            "--topic",
            action="append",
            default=[],
            help="Kafka topic to read (repeatable; default: the transport's topic)",
        )
        parser.add_argument(
            "--event-type",
            action="append",
            default=[],
            dest="event_types",
            metavar="NAME",
            help="handle only this event type (repeatable; default: every integration "
            "event with a subscriber in this process)",
        )
        parser.add_argument(
            "--max-attempts",
            type=int,
            default=5,
            metavar="N",
            help="attempts at a message whose subscriber raises before it is parked",
        )
        parser.add_argument(
            "--retry-delay",
            type=float,
            default=1.0,
            metavar="SECONDS",
            help="first delay before retrying a failed message (doubles each time)",
        )

    def start(self, options: dict[str, Any]) -> EngineStart:
        if options["max_attempts"] < 1:
            raise CommandError("--max-attempts must be at least 1")
        if options["retry_delay"] < 0:
            raise CommandError("--retry-delay must not be negative")
        if options["queue"] is not None and options["topic"]:
            raise CommandError("give --queue (RabbitMQ) or --topic (Kafka), not both")
        transport = outbox_settings().TRANSPORT
        try:
            cls = transport_class(transport)
        except OutboxError as exc:
            raise CommandError(str(exc)) from exc
        if options["queue"] is not None and not issubclass(cls, RabbitMQTransport):
            raise CommandError(f"--queue is for the rabbitmq transport, not {transport!r}")
        if options["topic"] and not issubclass(cls, KafkaTransport):
            raise CommandError(f"--topic is for the kafka transport, not {transport!r}")
        sources = [options["queue"]] if options["queue"] is not None else options["topic"]
        try:
            consumer = EventConsumer(
                options["group"],
                sources=sources,
                event_types=options["event_types"] or None,
                max_attempts=options["max_attempts"],
                retry_delay=options["retry_delay"],
                on_event=self.printer(options["verbosity"]),
            )
        except OutboxError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"consumer {consumer.group}: transport {transport}, {consumer.subscription.describe()}"
        )
        self.stdout.flush()
        return EngineStart(consumer, consumer.run, f"consumer {consumer.group}")
