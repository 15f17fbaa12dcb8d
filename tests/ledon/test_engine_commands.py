"""The engines' management commands on their shared base (``ledon.commands.EngineCommand``)
and the read-only admins on theirs (``ledon.admin.ReadOnlyModelAdmin``)."""

from __future__ import annotations

import io
import logging
import re
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib import admin
from django.core.management.base import CommandError, OutputWrapper
from django.test import RequestFactory

from jobs.management.commands.run_jobs import Command as RunJobs
from jobs.models import Job
from jobs.observability.models import Dashboard
from ledon.admin import ReadOnlyAdminMixin, ReadOnlyModelAdmin
from ledon.commands import EngineCommand, EngineStart
from ledon.db import DatabaseNotMigrated
from ledon.engine import Engine, EngineStats, StopLevel
from outbox.exceptions import OutboxError
from outbox.management.commands.consume_events import Command as ConsumeEvents
from outbox.management.commands.dispatch_outbox import Command as DispatchOutbox
from sagas.management.commands.recover_sagas import Command as RecoverSagas

ENGINE_COMMANDS = (RunJobs, DispatchOutbox, ConsumeEvents, RecoverSagas)
ESC = "\x1b["


def printed(command: EngineCommand, verbosity: int, *calls: tuple[Any, ...]) -> list[str]:
    out = io.StringIO()
    command.stdout = OutputWrapper(out)
    emit = command.printer(verbosity)
    for call in calls:
        emit(*call)
    return out.getvalue().splitlines()


@pytest.mark.parametrize("command_class", ENGINE_COMMANDS)
def test_every_engine_command_has_the_shared_options_and_a_meaning_for_each_stop_level(
    command_class: type[EngineCommand],
) -> None:
    command = command_class()
    parser = command.create_parser("manage.py", "engine")
    assert "metrics_port" in {a.dest for a in parser._actions}
    assert set(command.signal_meaning) == {StopLevel.GRACEFUL, StopLevel.CANCEL, StopLevel.ABORT}
    assert all(text for text in command.signal_meaning.values())


class _Failing(EngineCommand):
    signal_meaning = {level: level.name for level in StopLevel if level}
    run_errors = (OutboxError,)
    error: Exception = RuntimeError("unset")

    def start(self, options: dict[str, Any]) -> EngineStart:
        engine = Engine(alias="default", log=logging.getLogger(__name__))

        def run() -> EngineStats:
            raise self.error

        return EngineStart(engine, run, "failing engine")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (OutboxError("the broker said no"), CommandError),
        (
            DatabaseNotMigrated("default", "outbox", ["outbox_outboxmessage"], "dispatcher"),
            CommandError,
        ),
        (RuntimeError("a bug"), RuntimeError),
    ],
)
def test_run_errors_and_a_missing_schema_end_the_command_with_their_message_alone(
    error: Exception, expected: type[Exception]
) -> None:
    command = _Failing(stdout=io.StringIO())
    command.error = error
    with pytest.raises(expected) as raised:
        command.handle(metrics_port=None, verbosity=1)
    assert str(raised.value) == str(error)


def test_the_printer_says_nothing_at_verbosity_0_and_never_stopped() -> None:
    command = DispatchOutbox()
    assert printed(command, 0, ("started", "transport x"), ("transport-unavailable", "down")) == []
    assert printed(command, 2, ("stopped", "claimed 0"), ("started", "transport x")) == [
        "started transport x"
    ]


def test_quiet_events_wait_for_verbosity_2_and_loud_ones_take_the_loud_style() -> None:
    command = ConsumeEvents(force_color=True)
    calls = (("handled", "m1 order.placed"), ("parked", "m2 bad"), ("reconnected", "q"))
    at_1 = printed(command, 1, *calls)
    assert [line.replace(ESC, "") for line in at_1 if ESC not in line] == ["reconnected q"]
    assert len(at_1) == 2
    assert ESC in at_1[0]
    assert "parked m2 bad" in at_1[0]
    at_2 = printed(command, 2, *calls)
    assert at_2[0] == "handled m1 order.placed"
    assert len(at_2) == 3


def test_a_subject_is_described_by_the_command_and_left_out_when_none() -> None:
    claim = SimpleNamespace(job_id="j-1", handler="send", handler_version=2)
    lines = printed(RunJobs(), 1, ("failed", claim, "boom"), ("started", None, "ready"))
    assert lines == ["failed job j-1 (send@2) boom", "started ready"]
    state = SimpleNamespace(name="checkout", instance_id=uuid.UUID(int=7))
    assert printed(RecoverSagas(), 1, ("released", state, "stopping")) == [
        f"released saga checkout {uuid.UUID(int=7)} stopping"
    ]
    assert printed(RecoverSagas(), 1, ("step-completed", state, "")) == []


def test_the_three_apps_read_only_admins_share_one_base_and_refuse_every_edit() -> None:
    read_only = {
        model: model_admin
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label in {"jobs", "outbox", "sagas"} and model is not Dashboard
    }
    assert Job in read_only
    assert len(read_only) >= 6
    request = RequestFactory().get("/")
    for model_admin in read_only.values():
        assert isinstance(model_admin, ReadOnlyModelAdmin), type(model_admin)
        assert isinstance(model_admin, ReadOnlyAdminMixin)
        assert not model_admin.has_add_permission(request)
        assert not model_admin.has_change_permission(request)
        assert not model_admin.has_delete_permission(request)
    assert not isinstance(admin.site._registry[Dashboard], ReadOnlyAdminMixin)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("dispatch_outbox", "--burst", "--dispatcher-id", ""),
            "--dispatcher-id must not be empty",
        ),
        (("recover_sagas", "--burst", "--runner-id", "  "), "--runner-id must not be empty"),
        (
            ("consume_events", "--group", "g", "--metrics-port", "70000"),
            "--metrics-port must be between 0 and 65535",
        ),
        (
            ("dispatch_outbox", "--burst", "--metrics-port", "0", "--metrics-address", ""),
            "--metrics-address must be an address to listen on",
        ),
        (
            ("recover_sagas", "--burst", "--metrics-port", "0", "--metrics-address", "300.1.2.3"),
            "--metrics-address '300.1.2.3' is not an address here",
        ),
    ],
)
def test_the_other_engines_refuse_bad_options_before_anything_starts(args, message) -> None:
    from django.core.management import call_command

    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command(*args, stdout=out, stderr=err)
    assert out.getvalue() == err.getvalue() == ""
