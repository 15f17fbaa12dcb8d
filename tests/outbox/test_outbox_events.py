"""Events (names, registry, JSON form), the in-process bus, settings, checks and
transport selection."""

from __future__ import annotations

import enum
import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core import checks
from django.core.management import CommandError, call_command

from outbox import DomainEvent, Event, IntegrationEvent, event_bus
from outbox.bus import EventBus, current_envelope
from outbox.checks import check_outbox_settings
from outbox.conf import outbox_settings
from outbox.events import decode, event_class, registered_events
from outbox.exceptions import (
    EventNameConflict,
    InvalidEvent,
    InvalidSubscriber,
    OutboxConfigurationError,
    UnknownEventType,
)
from outbox.transports import get_transport, transport_class
from outbox.transports.in_process import InProcessTransport
from outbox.types import Envelope


class Colour(enum.Enum):
    RED = "red"


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int


@dataclass(frozen=True)
class Rich(IntegrationEvent, name="test.events.rich"):
    id: uuid.UUID
    at: datetime
    day: date
    wait: timedelta
    amount: Decimal
    colour: Colour
    lines: list[Line]
    maybe: Decimal | None = None
    labels: dict[str, Decimal] = field(default_factory=dict)
    pair: tuple[int, str] = (0, "")


@dataclass(frozen=True)
class Timed(IntegrationEvent, name="test.events.timed"):
    at: datetime
    naive: datetime
    clock: time


@dataclass(frozen=True, slots=True)
class Slotted(IntegrationEvent, name="test.events.slotted"):
    n: int


@dataclass
class Unnamed(DomainEvent):
    n: int


class TestNamesAndRegistry:
    def test_the_class_keyword_names_the_event_and_registers_it(self):
        assert Rich.event_name == "test.events.rich"
        assert event_class("test.events.rich") is Rich

    def test_the_default_name_is_module_and_class(self):
        assert Unnamed.event_name == f"{__name__}.Unnamed"
        assert registered_events()[Unnamed.event_name] is Unnamed

    def test_a_slotted_dataclass_keeps_its_name(self):
        assert Slotted.event_name == "test.events.slotted"
        assert event_class("test.events.slotted") is Slotted
        assert not hasattr(Slotted(1), "__dict__")

    def test_bases_are_not_registered(self):
        assert "outbox.events.IntegrationEvent" not in registered_events()
        assert "outbox.events.DomainEvent" not in registered_events()

    def test_another_class_cannot_take_a_registered_name(self):
        with pytest.raises(EventNameConflict, match=r"test\.events\.rich"):

            class Impostor(IntegrationEvent, name="test.events.rich"):
                pass

        assert event_class("test.events.rich") is Rich

    def test_redefining_the_same_class_replaces_it(self):
        def define() -> type[Event]:
            @dataclass
            class Again(DomainEvent, name="test.events.again"):
                n: int

            return Again

        first, second = define(), define()
        assert first is not second
        assert event_class("test.events.again") is second

    @pytest.mark.parametrize("name", ["", "has space", "x" * 201, "new\nline", "-lead"])
    def test_bad_names_are_refused(self, name):
        with pytest.raises(InvalidEvent, match="event name"):

            class Bad(DomainEvent, name=name):
                pass

    def test_decoding_looks_names_up_and_never_imports_a_path(self):
        with pytest.raises(UnknownEventType, match=r"os\.system"):
            decode("os.system", "{}")
        with pytest.raises(UnknownEventType):
            decode("outbox.events.IntegrationEvent", "{}")


class TestJsonForm:
    def test_round_trip_restores_field_types(self):
        event = Rich(
            id=uuid.uuid4(),
            at=datetime(2026, 11, 29, 12, 30, 15, 250000, tzinfo=UTC),
            day=date(2026, 11, 29),
            wait=timedelta(hours=2, seconds=3),
            amount=Decimal("12.30"),
            colour=Colour.RED,
            lines=[Line("a", 1), Line("b", 2)],
            maybe=Decimal("0.1"),
            labels={"vat": Decimal("0.19")},
            pair=(3, "x"),
        )
        again = decode(Rich.event_name, event.to_json())
        assert again == event
        assert isinstance(again, Rich)
        assert isinstance(again.lines[0], Line)

    def test_datetimes_and_times_keep_their_microseconds(self):
        event = Timed(
            at=datetime(2026, 11, 29, 12, 30, 15, 123456, tzinfo=UTC),
            naive=datetime(2026, 11, 29, 12, 30, 15, 1),
            clock=time(23, 59, 59, 999999),
        )
        again = decode(Timed.event_name, event.to_json())
        assert again == event
        assert '"2026-11-29T12:30:15.123456Z"' in event.to_json()

    def test_unknown_keys_are_ignored_and_missing_required_fields_are_errors(self):
        assert decode("test.events.slotted", '{"n": 1, "added_later": true}') == Slotted(1)
        with pytest.raises(InvalidEvent, match="cannot read"):
            decode("test.events.slotted", "{}")
        with pytest.raises(InvalidEvent, match="JSON object"):
            decode("test.events.slotted", "[1]")
        with pytest.raises(InvalidEvent, match="not JSON"):
            decode("test.events.slotted", "{nope")

    def test_values_that_are_not_json_are_refused(self):
        @dataclass
        class Odd(DomainEvent, name="test.events.odd"):
            value: Any

        with pytest.raises(InvalidEvent, match="not JSON"):
            Odd(object()).to_json()
        with pytest.raises(InvalidEvent, match="not JSON"):
            Odd(float("nan")).to_json()
        assert Odd({"ü": [1, None]}).to_json() == '{"value":{"ü":[1,null]}}'


class TestBus:
    def test_subscribers_of_the_type_and_its_bases_run_in_order(self):
        bus = EventBus()
        calls: list[str] = []
        bus.subscribe(Slotted, lambda e: calls.append("slotted-1"))
        bus.subscribe(IntegrationEvent, lambda e: calls.append("integration"))
        bus.subscribe(Slotted, lambda e: calls.append("slotted-2"))
        bus.subscribe(Unnamed, lambda e: calls.append("other"))
        result = bus.publish(Slotted(1))
        assert calls == ["slotted-1", "slotted-2", "integration"]
        assert result.called == 3
        assert result.ok

    def test_a_failing_subscriber_is_logged_and_the_others_still_run(self, caplog):
        bus = EventBus()
        calls: list[int] = []

        def broken(event: Slotted) -> None:
            raise RuntimeError("boom")

        bus.subscribe(Slotted, lambda e: calls.append(1))
        bus.subscribe(Slotted, broken)
        bus.subscribe(Slotted, lambda e: calls.append(3))
        with caplog.at_level(logging.ERROR, logger="outbox.bus"):
            result = bus.publish(Slotted(1))
        assert calls == [1, 3]
        assert not result.ok
        assert [f.handler.rsplit(".", 1)[-1] for f in result.failures] == ["broken"]
        assert "boom" in result.describe_failures()
        record = next(r for r in caplog.records if r.name == "outbox.bus")
        assert record.exc_info is not None
        assert record.event_type == "test.events.slotted"  # type: ignore[attr-defined]

    def test_subscribing_twice_once_and_decorator_form_and_unsubscribe(self):
        bus = EventBus()
        calls: list[int] = []

        @bus.subscribe(Slotted)
        def handler(event: Slotted) -> None:
            calls.append(event.n)

        bus.subscribe(Slotted, handler)
        bus.publish(Slotted(7))
        assert calls == [7]
        assert bus.unsubscribe(Slotted, handler)
        assert not bus.unsubscribe(Slotted, handler)
        bus.publish(Slotted(8))
        assert calls == [7]

    def test_bad_subscriptions_are_refused(self):
        bus = EventBus()
        with pytest.raises(InvalidSubscriber):
            bus.subscribe(dict, print)  # type: ignore[type-var]
        with pytest.raises(InvalidSubscriber):
            bus.subscribe(Slotted, "not callable")  # type: ignore[arg-type]

        async def coroutine(event: Slotted) -> None:
            pass

        with pytest.raises(InvalidSubscriber, match="synchronously"):
            bus.subscribe(Slotted, coroutine)
        with pytest.raises(InvalidSubscriber):
            bus.publish({"n": 1})  # type: ignore[arg-type]

    def test_the_envelope_is_available_to_subscribers_only_while_they_run(self):
        bus = EventBus()
        seen: list[Envelope | None] = []
        bus.subscribe(Slotted, lambda e: seen.append(current_envelope()))
        envelope = Envelope(
            message_id=uuid.uuid4(),
            event_type=Slotted.event_name,
            payload_json='{"n":1}',
            created_at=datetime.now(UTC),
        )
        bus.publish(Slotted(1), envelope=envelope)
        bus.publish(Slotted(2))
        assert seen == [envelope, None]
        assert current_envelope() is None

    def test_the_in_process_transport_reports_each_message(self):
        good = Envelope(
            message_id=uuid.uuid4(),
            event_type="test.events.slotted",
            payload_json='{"n":1}',
            created_at=datetime.now(UTC),
        )
        unknown = Envelope(
            message_id=uuid.uuid4(),
            event_type="test.events.nobody",
            payload_json="{}",
            created_at=datetime.now(UTC),
        )
        garbled = Envelope(
            message_id=uuid.uuid4(),
            event_type="test.events.slotted",
            payload_json='{"m":1}',
            created_at=datetime.now(UTC),
        )
        received: list[Slotted] = []

        def broken(event: Slotted) -> None:
            received.append(event)
            if event.n == 2:
                raise ValueError("cannot handle 2")

        event_bus.subscribe(Slotted, broken)
        try:
            failing = Envelope(
                message_id=uuid.uuid4(),
                event_type="test.events.slotted",
                payload_json='{"n":2}',
                created_at=datetime.now(UTC),
            )
            reports = InProcessTransport().publish([good, unknown, garbled, failing])
        finally:
            event_bus.unsubscribe(Slotted, broken)
        assert [r.message_id for r in reports] == [
            good.message_id,
            unknown.message_id,
            garbled.message_id,
            failing.message_id,
        ]
        assert [(r.ok, r.permanent) for r in reports] == [
            (True, False),
            (False, False),  # perhaps deployed later: retried
            (False, True),  # cannot ever be read: parked at once
            (False, False),
        ]
        assert "cannot handle 2" in reports[3].error
        assert received == [Slotted(1), Slotted(2)]


class PickyTransport(InProcessTransport):
    @classmethod
    def check_options(cls, options: Any) -> list[str]:
        return [] if "url" in options else ["'url' is required"]


class TestSettingsAndChecks:
    def test_defaults(self, settings, request):
        # Deleting a setting sends no setting_changed signal: clear the cache by hand,
        # now and once the setting is back.
        del settings.OUTBOX
        outbox_settings.cache_clear()
        request.addfinalizer(outbox_settings.cache_clear)
        s = outbox_settings()
        assert s.ENABLED is False
        assert s.TRANSPORT == "in-process"
        assert s.MAX_ATTEMPTS == 10

    @pytest.mark.parametrize(
        ("values", "message"),
        [
            ({"ENABLED": "yes"}, "ENABLED"),
            ({"BATCH_SIZE": 0}, "BATCH_SIZE"),
            ({"LEASE_SECONDS": -1}, "LEASE_SECONDS"),
            ({"RETRY_JITTER": 1.5}, "RETRY_JITTER"),
            ({"RETRY_BACKOFF_FACTOR": 0.5}, "RETRY_BACKOFF_FACTOR"),
            ({"RETENTION_SECONDS": 0}, "RETENTION_SECONDS"),
            ({"NOTIFY_CHANNEL": "Bad Channel"}, "NOTIFY_CHANNEL"),
            ({"TRANSPORT_OPTIONS": []}, "TRANSPORT_OPTIONS"),
            ({"SURPRISE": 1}, "unknown OUTBOX setting"),
        ],
    )
    def test_bad_settings_are_configuration_errors_and_system_check_errors(
        self, settings, values, message
    ):
        settings.OUTBOX = values
        with pytest.raises(OutboxConfigurationError, match=message):
            outbox_settings()
        errors = check_outbox_settings()
        assert [e.id for e in errors] == ["outbox.E001"]
        assert message in errors[0].msg

    @pytest.mark.parametrize("name", ["carrier-pigeon", "outbox.nowhere.Transport", "os.path"])
    def test_an_unknown_transport_is_a_system_check_error(self, settings, name):
        settings.OUTBOX = {"TRANSPORT": name}
        assert [e.id for e in check_outbox_settings()] == ["outbox.E002"]
        with pytest.raises(OutboxConfigurationError):
            get_transport()

    def test_transport_by_name_or_dotted_path(self, settings):
        assert transport_class("in-process") is InProcessTransport
        path = "outbox.testing.RecordingTransport"
        settings.OUTBOX = {"TRANSPORT": path}
        assert type(get_transport()).__name__ == "RecordingTransport"
        assert check_outbox_settings() == []

    def test_transport_options_are_checked_by_the_transport(self, settings):
        settings.OUTBOX = {"TRANSPORT": f"{__name__}.PickyTransport"}
        errors = check_outbox_settings()
        assert [e.id for e in errors] == ["outbox.E003"]
        assert "'url' is required" in errors[0].msg
        with pytest.raises(OutboxConfigurationError, match="'url' is required"):
            get_transport()
        settings.OUTBOX = {
            "TRANSPORT": f"{__name__}.PickyTransport",
            "TRANSPORT_OPTIONS": {"url": "x"},
        }
        assert check_outbox_settings() == []
        assert get_transport().options == {"url": "x"}

    @pytest.mark.django_db
    def test_enabled_outbox_without_its_table_is_a_database_check_warning(
        self, settings, monkeypatch
    ):
        from django.db import connection

        # As before ``migrate outbox``: the database has every table but the outbox's.
        real = connection.introspection.table_names
        monkeypatch.setattr(
            connection.introspection,
            "table_names",
            lambda *a, **k: [t for t in real(*a, **k) if t != "outbox_outboxmessage"],
        )
        settings.OUTBOX = {"ENABLED": True}
        errors = checks.run_checks(tags=[checks.Tags.database], databases=["default"])
        assert [e.id for e in errors if e.id.startswith("outbox.")] == ["outbox.W001"]
        assert not any(e.is_serious() for e in errors)  # never stops `migrate outbox`
        with pytest.raises(CommandError, match=r"outbox_outboxmessage.*\n.*manage\.py migrate"):
            call_command("dispatch_outbox", "--burst")
        settings.OUTBOX = {"ENABLED": False}
        errors = checks.run_checks(tags=[checks.Tags.database], databases=["default"])
        assert not [e for e in errors if e.id.startswith("outbox.")]

    @pytest.mark.django_db
    def test_before_the_outbox_migrations_run_migrate_is_not_warned_but_dispatch_refuses(
        self, settings, monkeypatch
    ):
        from django.db import connection
        from django.db.migrations.recorder import MigrationRecorder

        # As on a fresh database during `migrate`: no table and no applied migration.
        real_tables = connection.introspection.table_names
        monkeypatch.setattr(
            connection.introspection,
            "table_names",
            lambda *a, **k: [t for t in real_tables(*a, **k) if t != "outbox_outboxmessage"],
        )
        real_applied = MigrationRecorder.applied_migrations
        monkeypatch.setattr(
            MigrationRecorder,
            "applied_migrations",
            lambda self: {k: v for k, v in real_applied(self).items() if k[0] != "outbox"},
        )
        settings.OUTBOX = {"ENABLED": True}
        errors = checks.run_checks(tags=[checks.Tags.database], databases=["default"])
        assert not [e for e in errors if e.id.startswith("outbox.")]
        with pytest.raises(CommandError, match=r"outbox_outboxmessage.*\n.*manage\.py migrate"):
            call_command("dispatch_outbox", "--burst")
