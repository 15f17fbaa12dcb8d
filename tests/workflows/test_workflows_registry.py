"""The registry only records: who acts on an activity (the app's config, which
registers its job handler) watches the registry, and is given the activities
declared before it watched as well as those declared after."""

from __future__ import annotations

import pytest

from jobs.handlers import get_handler
from workflows import activity, registry
from workflows.exceptions import InvalidWorkflow
from workflows.registry import ActivitySpec


@pytest.fixture
def watchers(monkeypatch):
    """The registry's watchers and activities for this test only."""
    monkeypatch.setattr(registry, "_watchers", [])
    monkeypatch.setattr(registry, "_activities", dict(registry._activities))
    return registry._watchers


def test_a_watcher_is_given_the_activities_declared_before_and_after_it(watchers):
    @activity("registry.before")
    def before(value: int) -> int:
        return value

    seen: list[str] = []

    def watch(spec: ActivitySpec) -> None:
        seen.append(spec.name)

    registry.watch_activities(watch)
    assert "registry.before" in seen

    @activity("registry.after")
    def after(value: int) -> int:
        return value

    assert seen[-1] == "registry.after"
    registry.watch_activities(watch)  # the same watcher again: called once
    assert seen.count("registry.after") == 1


def test_a_watchers_refusal_is_the_declarations_error_and_records_nothing(watchers):
    def refuse(spec: ActivitySpec) -> None:
        if spec.name == "registry.refused":
            raise InvalidWorkflow(f"activity {spec.name!r}: refused")

    registry.watch_activities(refuse)
    with pytest.raises(InvalidWorkflow, match="refused"):
        activity("registry.refused")(lambda value: value)
    with pytest.raises(InvalidWorkflow):
        registry.get_activity("registry.refused")


def test_the_app_registers_the_job_handler_of_an_activity_declared_after_ready():
    @activity("registry.late", retries=2, timeout=5)
    def late(value: int) -> int:
        return value

    handler = get_handler("registry.late", 1)
    assert handler.timeout == 5
    assert registry.activity_of(late) is registry.get_activity("registry.late")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"timeout": float("nan")}, "timeout must be a number of seconds"),
        ({"timeout": float("inf")}, "timeout must be a number of seconds"),
        ({"timeout": 0}, "timeout must be a number of seconds"),
        ({"retries": True}, "retries must be an int in"),
        ({"retries": 101}, "retries must be an int in"),
        ({"queue": 7}, "queue"),
    ],
)
def test_an_activitys_options_are_checked_by_the_rules_steps_use(options, said):
    """The same checks as ``wf.step``'s: a timeout that never fires (NaN, inf) was
    accepted here before."""
    with pytest.raises(InvalidWorkflow, match=said):
        activity("registry.bad_option", **options)


@pytest.mark.parametrize("version", [0, True, 2**31, "1"])
def test_a_workflows_version_is_an_int_from_1(version):
    with pytest.raises(InvalidWorkflow, match="version must be an int from 1"):
        registry.workflow("registry.versioned", version=version)
    with pytest.raises(InvalidWorkflow, match="version must be an int from 1"):
        registry.get_workflow("registry.versioned", version)
