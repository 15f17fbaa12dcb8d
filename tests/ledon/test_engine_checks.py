"""The system checks an engine's command runs before it starts: the apps' own and the
tasks framework's (tagged ``engines``), not the web side's (the admin's, the URLconf's,
the templates'), which ``manage.py check`` runs."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.core.checks.registry import registry
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from jobs import tasks_framework
from jobs.management.commands.run_jobs import Command as RunJobs
from ledon.checks import ENGINES
from ledon.commands import EngineCommand
from outbox.management.commands.consume_events import Command as ConsumeEvents
from outbox.management.commands.dispatch_outbox import Command as DispatchOutbox
from sagas.management.commands.recover_sagas import Command as RecoverSagas

# The workflows' check reads the runs in flight.
pytestmark = pytest.mark.django_db

ENGINE_COMMANDS = (RunJobs, DispatchOutbox, ConsumeEvents, RecoverSagas)
#: What each command needs on its command line.
ARGS: dict[type[EngineCommand], tuple[str, ...]] = {ConsumeEvents: ("--group", "checks")}
APPS = ("jobs", "outbox", "sagas", "workflows", "ledon")


class Started(Exception):
    """The command got past its checks to building its engine."""


def _started(options: dict[str, Any]) -> Any:
    raise Started


@pytest.fixture
def extra_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks this test registers stand beside the project's until it ends."""
    monkeypatch.setattr(registry, "registered_checks", set(registry.registered_checks))


def _failing(id: str) -> Any:
    def check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
        return [checks.Error(f"{id} is wrong", id=id)]

    return check


def _run(command_class: type[EngineCommand]) -> None:
    command = command_class()
    command.start = _started  # type: ignore[method-assign]
    call_command(command, *ARGS.get(command_class, ()), skip_checks=False)


def test_every_check_of_the_apps_is_an_engines_check_but_the_database_ones() -> None:
    ours = [
        check
        for check in registry.get_checks()
        if check.__module__.split(".")[0] in APPS and checks.Tags.database not in check.tags
    ]
    assert len(ours) >= 10
    assert [check for check in ours if ENGINES not in check.tags] == []


def test_the_tasks_frameworks_check_is_an_engines_check_and_keeps_its_own_tags() -> None:
    framework = [
        check
        for check in registry.get_checks()
        if check.__module__ == f"{tasks_framework.PACKAGE}.checks"
    ]
    assert framework
    assert all(ENGINES in check.tags for check in framework)
    tasks_framework.register_checks()  # again, as every start of the app does
    assert all(list(check.tags).count(ENGINES) == 1 for check in framework)


@pytest.mark.parametrize("command_class", ENGINE_COMMANDS)
def test_an_engines_check_that_fails_stops_the_command_before_its_engine_is_built(
    command_class: type[EngineCommand], extra_checks: None
) -> None:
    checks.register(_failing("project.E001"), ENGINES)
    with pytest.raises(SystemCheckError, match=r"\(project\.E001\) project\.E001 is wrong"):
        _run(command_class)


@pytest.mark.parametrize("command_class", ENGINE_COMMANDS)
def test_the_web_sides_checks_are_left_to_manage_py_check(
    command_class: type[EngineCommand], extra_checks: None
) -> None:
    for tag in (checks.Tags.urls, checks.Tags.admin, checks.Tags.templates):
        checks.register(_failing(f"{tag}.E999"), tag)
    with pytest.raises(Started):
        _run(command_class)
    with pytest.raises(SystemCheckError, match=r"urls\.E999"):
        call_command("check")


def test_a_bad_tasks_setting_stops_run_jobs() -> None:
    setting = {"BACKEND": "jobs.backends.JobsBackend", "OPTIONS": {"SCOPE": ""}}
    with (
        override_settings(TASKS={"default": setting}),
        pytest.raises(SystemCheckError, match=r"jobs\.E103"),
    ):
        _run(RunJobs)


def test_a_misspelt_setting_stops_every_engine(settings: Any) -> None:
    settings.LEDON_ROUND_TRIP_DEADLINE = "soon"
    for command_class in ENGINE_COMMANDS:
        with pytest.raises(SystemCheckError, match=r"ledon\.E002"):
            _run(command_class)
