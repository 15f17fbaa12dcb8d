"""In process: the django.tasks backend — configuration and checks, enqueue (staged
or submitted), the job-to-TaskResult mapping, the task handler, signals and retries.

The worker here is the in-process engine; ``test_tasks_backend_processes.py`` runs the
same through real ``manage.py run_jobs`` processes.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from jobs import JobScope, JobStatus, JobSubmission, execution
from jobs.backends import (
    InvalidReturnValue,
    JobsBackend,
    JobsTask,
    TaskInterrupted,
    TaskNotRegistered,
    compat,
)
from jobs.backends.compat import (
    InvalidTask,
    TaskError,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from jobs.backends.results import HANDLER, format_task_error, parse_task_error
from jobs.exceptions import JobCancelled, JobNotFound, JobsConfigurationError
from jobs.types import CancelOutcome
from jobs.worker import Worker
from testproject.tasks_demo import probes
from testproject.tasks_demo.models import TaskEvent
from testproject.tasks_demo.tasks import double_dictionary, email_users
from tests.support.procs import wait_until

SCOPE = "django.tasks"
TASKS_SETTING: dict[str, Any] = {"BACKEND": "jobs.backends.JobsBackend", "QUEUES": []}


def plain_function() -> None:
    """A module-level function that tests turn into tasks."""


def run_burst(**kwargs: Any) -> Worker:
    worker = Worker(burst=True, listen=False, **kwargs)
    worker.run()
    return worker


def job(result_id: str) -> Any:
    snap = execution.reserved_scope(SCOPE).get(result_id)
    assert snap is not None
    return snap


@pytest.fixture
def received() -> Iterator[list[tuple[str, str, TaskResultStatus, int]]]:
    """Every task signal sent in this process: (signal, result id, status, attempts)."""
    seen: list[tuple[str, str, TaskResultStatus, int]] = []
    receivers = []
    for name, signal in (
        ("enqueued", task_enqueued),
        ("started", task_started),
        ("finished", task_finished),
    ):

        def receiver(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            seen.append((_name, task_result.id, task_result.status, task_result.attempts))

        signal.connect(receiver, weak=False)
        receivers.append((signal, receiver))
    yield seen
    for signal, receiver in receivers:
        signal.disconnect(receiver)


# --------------------------------------------------------------------------- configuration


class TestConfiguration:
    def test_capabilities_and_task_class(self) -> None:
        backend = task_backends["default"]
        assert isinstance(backend, JobsBackend)
        assert backend.supports_defer
        assert backend.supports_async_task
        assert backend.supports_get_result
        assert backend.supports_priority
        assert isinstance(email_users, JobsTask)
        assert email_users.max_attempts == 1
        assert probes.flaky.max_attempts == 3
        assert probes.flaky.retry == probes.NO_DELAY

    def test_using_keeps_the_extra_fields_and_accepts_max_attempts(self) -> None:
        assert email_users.priority == 0
        assert email_users.using(priority=10).priority == 10
        assert probes.flaky.using(priority=5).max_attempts == 3
        five = probes.flaky.using(max_attempts=5, queue_name="slow")
        assert (five.max_attempts, five.queue_name, five.retry) == (5, "slow", probes.NO_DELAY)
        assert probes.flaky.max_attempts == 3  # the original is unchanged

    def test_tasks_pickle(self) -> None:
        assert pickle.loads(pickle.dumps(probes.flaky)) == probes.flaky

    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"queue_name": "with space"}, "queue_name"),
            ({"queue_name": "q" * 101}, "queue_name"),
            ({"max_attempts": 0}, "max_attempts"),
            ({"max_attempts": 1001}, "max_attempts"),
            ({"retry": "fast"}, "RetryPolicy"),
            ({"priority": 101}, "priority"),
        ],
    )
    def test_validate_task_rejects_what_the_store_cannot_hold(
        self, changes: dict[str, Any], message: str
    ) -> None:
        # Every field given: Django 6.0's Task has no defaults (6.1's and the backport's do).
        fields = {"priority": 0, "backend": "default", "queue_name": "default", "run_after": None}
        with pytest.raises(InvalidTask, match=message):
            JobsTask(func=probes.record.func, **{**fields, **changes})

    def test_bad_flow_rules_are_invalid_tasks(self) -> None:
        fields = {"priority": 0, "backend": "default", "queue_name": "default", "run_after": None}
        for rules, message in (
            ({"debounce": 5}, "unique_key"),
            ({"start_within": 0}, "start_within"),
            ({"unique_key": "k", "unique_while": "always"}, "unique_while"),
        ):
            with pytest.raises(InvalidTask, match=message):
                JobsTask(func=probes.record.func, **fields, **rules)
        with pytest.raises(TypeError, match="cost"):
            email_users.using(cost=2)

    def test_queues_setting_is_honoured(self) -> None:
        only_default = {**TASKS_SETTING, "QUEUES": ["default"]}
        with (
            override_settings(TASKS={"default": only_default}),
            pytest.raises(InvalidTask, match="Queue 'emails' is not valid"),
        ):
            email_users.using(queue_name="emails")

    def test_extra_task_kwargs_reach_the_task_class(self) -> None:
        made = task(max_attempts=4, retry=probes.NO_DELAY)(plain_function)  # type: ignore[call-overload]
        assert isinstance(made, JobsTask)
        assert made.max_attempts == 4
        with pytest.raises(TypeError, match="unexpected keyword argument 'retries'"):
            task(retries=4)(plain_function)  # type: ignore[call-overload]

    def test_the_decorator_for_django_6_0_passes_the_options_as_django_6_1_does(self) -> None:
        """``compat.task`` on Django 6.0, whose own ``@task`` takes no options for the
        task class; the same function on every version, so it is tested on each."""
        made = compat._task_with_options(
            priority=3, queue_name="slow", max_attempts=4, retry=probes.NO_DELAY
        )(plain_function)
        assert isinstance(made, JobsTask)
        assert (made.priority, made.queue_name, made.max_attempts) == (3, "slow", 4)
        assert made.retry == probes.NO_DELAY
        plain = compat._task_with_options(plain_function)
        assert (plain.priority, plain.queue_name, plain.max_attempts) == (0, "default", 1)
        with pytest.raises(TypeError, match="run_after cannot be defined statically"):
            compat._task_with_options(run_after=timezone.now())
        with pytest.raises(InvalidTask, match="max_attempts"):
            compat._task_with_options(max_attempts=0)(plain_function)


def check_ids(options: Any, queues: list[str] | None = None) -> list[str]:
    setting = {**TASKS_SETTING, "OPTIONS": options, "QUEUES": queues or []}
    with override_settings(TASKS={"default": setting}):
        return [m.id for m in task_backends["default"].check() if m.id]


class TestChecks:
    def test_the_project_configuration_is_clean(self) -> None:
        assert default_task_backend.check() == []

    @pytest.mark.parametrize(
        ("options", "queues", "expected"),
        [
            (["SCOPE"], None, "jobs.E101"),
            ({"SCOPE": "s", "TIMEOUT": 3}, None, "jobs.E102"),
            ({"SCOPE": ""}, None, "jobs.E103"),
            ({"SCOPE": "bad\ud800scope"}, None, "jobs.E103"),
            ({"SCOPE": 7}, None, "jobs.E103"),
            ({"MODULES": "testproject.tasks_demo.probes"}, None, "jobs.E104"),
            ({"MODULES": [""]}, None, "jobs.E104"),
            ({"MODULES": ["testproject.tasks_demo.does_not_exist"]}, None, "jobs.E105"),
            ({}, ["default", "not a queue"], "jobs.E106"),
        ],
    )
    def test_bad_options_are_reported_with_stable_ids(
        self, options: Any, queues: list[str] | None, expected: str
    ) -> None:
        assert check_ids(options, queues) == [expected]

    def test_missing_jobs_app_is_reported(self, settings: Any) -> None:
        apps = [a for a in settings.INSTALLED_APPS if a != "jobs"]
        with override_settings(INSTALLED_APPS=apps):
            assert "jobs.E107" in [m.id for m in default_task_backend.check()]

    @pytest.mark.django_db
    def test_checks_run_through_djangos_check_framework(self) -> None:
        setting = {**TASKS_SETTING, "OPTIONS": {"SCOPE": ""}}
        with override_settings(TASKS={"default": setting}):
            messages = checks.run_checks()
        assert any(m.id == "jobs.E103" and "TASKS['default']" in m.msg for m in messages)

    @pytest.mark.slow
    def test_manage_py_check_runs_them_in_a_fresh_process(self, tmp_path: Path) -> None:
        """Django registers its tasks check only once ``django.tasks`` is imported;
        in a fresh ``manage.py check`` nothing else imports it."""
        from tests.support.procs import ManageProcess

        # A project of its own: the test project's apps import django.tasks.
        (tmp_path / "bad_tasks_settings.py").write_text(
            "SECRET_KEY = 'x'\n"
            "INSTALLED_APPS = ['django.contrib.contenttypes', 'django.contrib.auth', 'jobs']\n"
            f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3',"
            f" 'NAME': {str(tmp_path / 'db.sqlite3')!r}}}}}\n"
            "TASKS = {'default': {'BACKEND': 'jobs.backends.JobsBackend',"
            " 'OPTIONS': {'SCOPE': ''}}}\n"
        )
        check = ManageProcess(
            tmp_path,
            "check",
            env={"DJANGO_SETTINGS_MODULE": "bad_tasks_settings", "PYTHONPATH": str(tmp_path)},
            database=f"sqlite:///{tmp_path}/unused.sqlite3",
            real=True,
        )
        assert check.wait() == 1, check.output
        assert "jobs.E103" in check.output

    @pytest.mark.django_db
    def test_a_bad_option_makes_enqueue_a_configuration_error(self) -> None:
        setting = {**TASKS_SETTING, "OPTIONS": {"SCOPE": ""}}
        with (
            override_settings(TASKS={"default": setting}),
            pytest.raises(JobsConfigurationError, match="SCOPE"),
        ):
            probes.record.enqueue("x")


# --------------------------------------------------------------------------- enqueue


@pytest.mark.django_db
class TestEnqueue:
    def test_outside_a_transaction_the_job_is_submitted_at_once(self, received) -> None:
        run_after = timezone.now() + timedelta(hours=1)
        result = email_users.using(priority=7, queue_name="emails", run_after=run_after).enqueue(
            emails=["user@example.com"], subject="Hi", message="Hello"
        )
        assert result.status == TaskResultStatus.READY
        assert result.backend == "default"
        assert result.args == []
        assert result.kwargs == {
            "emails": ["user@example.com"],
            "subject": "Hi",
            "message": "Hello",
        }
        assert result.enqueued_at is not None
        assert (result.started_at, result.finished_at, result.last_attempted_at) == (None,) * 3
        assert (result.errors, result.worker_ids) == ([], [])
        snap = job(result.id)
        assert (snap.handler, snap.handler_version) == (HANDLER, 1)
        assert (snap.queue, snap.priority, snap.max_attempts) == ("emails", 7, 1)
        assert snap.initial_not_before == run_after
        assert snap.payload == {
            "task": "testproject.tasks_demo.tasks.email_users",
            "backend": "default",
            "args": [],
            "kwargs": {"emails": ["user@example.com"], "subject": "Hi", "message": "Hello"},
        }
        assert received == [("enqueued", result.id, TaskResultStatus.READY, 0)]

    def test_a_whole_float_priority_is_stored_as_an_int(self) -> None:
        result = probes.record.using(priority=2.0).enqueue("x")  # type: ignore[arg-type]
        assert job(result.id).priority == 2

    def test_max_attempts_reaches_the_job(self) -> None:
        assert job(probes.flaky.enqueue(1).id).max_attempts == 3
        assert job(probes.flaky.using(max_attempts=6).enqueue(1).id).max_attempts == 6

    def test_arguments_are_normalised_like_django_does(self) -> None:
        result = probes.record.enqueue((1, 2), b"abc")  # type: ignore[arg-type, call-arg]
        assert result.args == [[1, 2], "abc"]
        assert job(result.id).payload["args"] == [[1, 2], "abc"]

    def test_arguments_that_are_not_json_store_nothing(self) -> None:
        with pytest.raises(TypeError, match="Unsupported type"):
            probes.record.enqueue(timezone.now())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="NaN"):
            probes.record.enqueue(float("nan"))  # type: ignore[arg-type]
        assert execution.reserved_scope(SCOPE).list() == []

    def test_inside_atomic_the_signal_waits_for_the_commit(
        self, received, django_capture_on_commit_callbacks
    ) -> None:
        with django_capture_on_commit_callbacks(execute=True) as callbacks, transaction.atomic():
            result = probes.record.enqueue("staged")
            assert job(result.id).status == JobStatus.QUEUED
            assert received == []
        assert len(callbacks) == 1
        assert received == [("enqueued", result.id, TaskResultStatus.READY, 0)]

    def test_a_failing_receiver_does_not_fail_the_enqueue(self, caplog) -> None:
        def broken(**kwargs: Any) -> None:
            raise RuntimeError("receiver bug")

        task_enqueued.connect(broken, weak=False)
        try:
            result = probes.record.enqueue("x")
        finally:
            task_enqueued.disconnect(broken)
        assert job(result.id).status == JobStatus.QUEUED
        assert "receiver bug" in caplog.text

    def test_aenqueue_and_aget_result(self) -> None:
        async def main() -> None:
            result = await probes.record.aenqueue("async")
            fetched = await probes.record.aget_result(result.id)
            assert (fetched.id, fetched.status, fetched.args) == (result.id, "READY", ["async"])
            backend_fetched = await default_task_backend.aget_result(result.id)
            assert backend_fetched.task == fetched.task
            await fetched.arefresh()
            assert fetched.status == TaskResultStatus.READY

        async_to_sync(main)()


@pytest.mark.django_db(transaction=True)
class TestEnqueueInTransactions:
    def test_rolled_back_enqueue_leaves_no_job_and_sends_no_signal(self, received) -> None:
        enqueued: list[str] = []

        def business_work() -> None:
            with transaction.atomic():
                enqueued.append(probes.record.enqueue("doomed").id)
                raise RuntimeError("business failure")

        with pytest.raises(RuntimeError):
            business_work()
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(enqueued[0])
        assert execution.reserved_scope(SCOPE).list() == []
        assert received == []

    def test_committed_enqueue_exists_and_is_announced_after_commit(self, received) -> None:
        with transaction.atomic():
            result = probes.record.enqueue("kept")
            assert received == []
        assert received == [("enqueued", result.id, TaskResultStatus.READY, 0)]
        assert default_task_backend.get_result(result.id).status == TaskResultStatus.READY


# --------------------------------------------------------------------------- results


@pytest.mark.django_db
class TestGetResult:
    def test_unknown_and_invalid_ids_do_not_exist(self) -> None:
        for bad in ("nope", "x" * 500, "", "a\x00b"):
            with pytest.raises(TaskResultDoesNotExist):
                default_task_backend.get_result(bad)
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(None)  # type: ignore[arg-type]

    def test_a_plain_job_of_the_same_scope_is_not_a_task_result(self) -> None:
        execution.reserved_scope(SCOPE).submit(
            "plain", JobSubmission.create("reports.generate", {})
        )
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result("plain")

    def test_a_tenant_scope_of_the_same_name_cannot_reach_the_results(self) -> None:
        result = probes.record.enqueue("x")
        tenant = JobScope(SCOPE)
        assert tenant.get(result.id) is None
        assert tenant.list() == []
        with pytest.raises(JobNotFound):
            tenant.cancel(result.id)
        # The tenant's own job of the same id is another job.
        tenant.submit(result.id, JobSubmission.create("reports.generate", {}))
        assert default_task_backend.get_result(result.id).id == result.id
        assert execution.reserved_scope(SCOPE).get(result.id).handler == HANDLER

    def test_another_scope_cannot_see_the_result(self) -> None:
        result = probes.record.enqueue("x")
        other = {**TASKS_SETTING, "OPTIONS": {"SCOPE": "tenant-b"}}
        with (
            override_settings(TASKS={"default": TASKS_SETTING, "other": other}),
            pytest.raises(TaskResultDoesNotExist),
        ):
            task_backends["other"].get_result(result.id)

    def test_result_of_another_task_is_a_mismatch(self) -> None:
        result = probes.record.enqueue("x")
        assert probes.record.get_result(result.id).id == result.id
        with pytest.raises(TaskResultMismatch):
            probes.ship.get_result(result.id)

    def test_the_result_task_carries_the_enqueued_settings(self) -> None:
        result = probes.flaky.using(priority=-3, queue_name="low", max_attempts=2).enqueue(0)
        fetched = default_task_backend.get_result(result.id)
        assert fetched.task.func is probes.flaky.func
        assert (fetched.task.priority, fetched.task.queue_name) == (-3, "low")
        assert fetched.task.max_attempts == 2  # type: ignore[attr-defined]
        assert fetched.task.retry == probes.NO_DELAY  # type: ignore[attr-defined]

    def test_an_unregistered_task_path_is_never_imported(self, tmp_path, monkeypatch) -> None:
        marker = tmp_path / "imported"
        (tmp_path / "ledon_trap.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).touch()\ndef fn(): pass\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        payload = {"task": "ledon_trap.fn", "backend": "default", "args": [], "kwargs": {}}
        execution.reserved_scope(SCOPE).submit("trap", JobSubmission.create(HANDLER, payload))
        with pytest.raises(TaskNotRegistered, match=r"'ledon_trap\.fn' is not registered"):
            default_task_backend.get_result("trap")
        assert not marker.exists()

    def test_running_then_interrupted(self) -> None:
        result = probes.record.enqueue("x")
        claim = execution.try_start(job(result.id).scope_hash, result.id, "w-crashed")
        assert claim is not None
        running = default_task_backend.get_result(result.id)
        assert running.status == TaskResultStatus.RUNNING
        assert running.worker_ids == ["w-crashed"]
        assert running.started_at == running.last_attempted_at is not None
        assert running.finished_at is None
        with pytest.raises(ValueError, match="Task has not finished yet"):
            _ = running.return_value
        assert execution.recover(claim.token, requeue=False)
        failed = default_task_backend.get_result(result.id)
        assert failed.status == TaskResultStatus.FAILED
        assert failed.finished_at is not None
        [error] = failed.errors
        assert error.exception_class is TaskInterrupted
        assert "worker stopped" in error.traceback
        with pytest.raises(ValueError, match="Task failed"):
            _ = failed.return_value

    def test_cancelled_before_it_ran(self) -> None:
        result = probes.record.enqueue("x")
        assert default_task_backend.cancel(result.id) is CancelOutcome.CANCELLED
        assert default_task_backend.cancel(result.id) is CancelOutcome.ALREADY_FINISHED
        cancelled = default_task_backend.get_result(result.id)
        assert cancelled.status == TaskResultStatus.FAILED
        [error] = cancelled.errors
        assert error.exception_class is JobCancelled
        assert "cancelled before it ran" in error.traceback
        assert cancelled.worker_ids == []

    def test_cancel_of_a_running_task_is_requested_and_its_result_dropped(self) -> None:
        result = probes.record.enqueue("x")
        claim = execution.try_start(job(result.id).scope_hash, result.id, "w")
        assert claim is not None
        assert async_to_sync(default_task_backend.acancel)(result.id) is CancelOutcome.REQUESTED
        assert execution.complete(claim.token, '"done"')
        cancelled = default_task_backend.get_result(result.id)
        assert cancelled.status == TaskResultStatus.FAILED
        [error] = cancelled.errors
        assert error.exception_class is JobCancelled
        assert "result was dropped" in error.traceback

    def test_cancel_of_an_unknown_result(self) -> None:
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.cancel("missing")


class TestStoredErrors:
    def test_round_trip_keeps_class_path_and_traceback(self) -> None:
        try:
            raise probes.ShippingError("no courier\nsecond line")
        except probes.ShippingError as exc:
            text = format_task_error(exc)
        error = parse_task_error(text)
        assert error is not None
        assert error.exception_class_path == "testproject.tasks_demo.probes.ShippingError"
        assert error.exception_class is probes.ShippingError
        assert error.traceback.startswith("Traceback (most recent call last):")
        assert error.traceback.endswith("ShippingError: no courier\nsecond line\n")

    @pytest.mark.parametrize(
        "text",
        [
            "",
            "no handler registered for 'django.tasks' version 1; is its app's tasks module...",
            "recovered: lease expired (worker stopped or lost)",
            "builtins.ValueError",  # a class path without a traceback
        ],
    )
    def test_other_error_texts_are_not_mistaken_for_task_errors(self, text: str) -> None:
        assert parse_task_error(text) is None

    def test_stored_text_is_bounded_and_valid(self) -> None:
        try:
            raise ValueError("\ud800 lone surrogate, NUL \x00, " + "x" * 300_000)
        except ValueError as exc:
            text = format_task_error(exc)
        assert len(text) <= 100_000
        assert "\x00" not in text
        text.encode("utf-8")  # strict: no lone surrogate left
        error = parse_task_error(text)
        assert error == TaskError(
            exception_class_path="builtins.ValueError", traceback=error.traceback
        )
        # The rule of every stored error: the middle is cut, the type and message stay.
        assert "characters cut" in error.traceback
        assert "\nValueError: \\ud800 lone surrogate" in error.traceback
        assert error.traceback.endswith("x\n")


# --------------------------------------------------------------------------- running


@pytest.mark.django_db(transaction=True)
class TestRunInProcess:
    def test_success_with_return_value_and_signals(self, received) -> None:
        result = email_users.enqueue(
            emails=["user@example.com"], subject="You have a message", message="Hello there!"
        )
        run_burst(worker_id="w-1")
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 1
        assert result.worker_ids == ["w-1"]
        assert result.errors == []
        assert result.enqueued_at <= result.started_at <= result.finished_at
        assert result.last_attempted_at == result.started_at
        assert received == [
            ("enqueued", result.id, TaskResultStatus.READY, 0),
            ("started", result.id, TaskResultStatus.RUNNING, 1),
            ("finished", result.id, TaskResultStatus.SUCCESSFUL, 1),
        ]
        # The signal receivers of the demo app recorded the same in the database.
        assert list(
            TaskEvent.objects.filter(result_id=result.id).values_list("kind", "status", "attempt")
        ) == [
            ("task_enqueued", "READY", 0),
            ("task_started", "RUNNING", 1),
            ("task_finished", "SUCCESSFUL", 1),
        ]

    def test_failure_records_class_path_and_traceback(self, received) -> None:
        result = probes.ship.enqueue(17)
        run_burst()
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        [error] = result.errors
        assert error.exception_class_path == "testproject.tasks_demo.probes.ShippingError"
        assert error.exception_class is probes.ShippingError
        assert "Traceback (most recent call last):" in error.traceback
        assert (
            'in ship\n    raise ShippingError(f"no courier for order {order}")' in error.traceback
        )
        assert error.traceback.endswith("ShippingError: no courier for order 17\n")
        assert received[-1] == ("finished", result.id, TaskResultStatus.FAILED, 1)

    def test_json_round_trip_failure_from_djangos_docs(self) -> None:
        result = double_dictionary.enqueue((1, 2, 3))
        run_burst()
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[0].exception_class is TypeError
        assert result.errors[0].traceback.endswith("TypeError: unhashable type: 'list'\n")

    def test_retries_until_success_with_one_error_per_failed_attempt(self, received) -> None:
        result = probes.flaky.enqueue(2)
        run_burst(worker_id="w-r")
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 3
        assert result.worker_ids == ["w-r"] * 3
        assert [e.exception_class for e in result.errors] == [ConnectionError, ConnectionError]
        assert "outage on attempt 1" in result.errors[0].traceback
        assert "outage on attempt 2" in result.errors[1].traceback
        finished = [(status, n) for (name, _, status, n) in received if name == "finished"]
        assert finished == [
            (TaskResultStatus.READY, 1),
            (TaskResultStatus.READY, 2),
            (TaskResultStatus.SUCCESSFUL, 3),
        ]

    def test_retries_stop_at_max_attempts(self) -> None:
        result = probes.flaky.enqueue(5)
        run_burst()
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert len(result.errors) == len(result.worker_ids) == 3

    def test_the_tasks_backoff_schedules_the_retry(self) -> None:
        result = probes.retried_in_an_hour.enqueue()
        before = timezone.now()
        run_burst()
        result.refresh()
        assert result.status == TaskResultStatus.READY  # ready to run again
        assert len(result.errors) == 1
        assert result.finished_at is None
        snap = job(result.id)
        assert before + timedelta(minutes=59) < snap.next_run_at < before + timedelta(minutes=61)

    def test_async_task(self) -> None:
        result = probes.async_double.enqueue(21)
        run_burst()
        result.refresh()
        assert result.return_value == {"double": 42, "async": True}

    def test_task_taking_context_sees_its_attempt(self) -> None:
        result = probes.introspect.enqueue("ctx")
        run_burst(worker_id="w-ctx")
        result.refresh()
        assert result.return_value == {
            "tag": "ctx",
            "attempt": 1,
            "id": result.id,
            "status": "RUNNING",
            "worker_ids": ["w-ctx"],
            "job_id": result.id,
        }

    def test_base_exceptions_fail_the_task_and_the_worker_goes_on(self) -> None:
        exiting = probes.exits.enqueue()
        after = probes.record.enqueue("after")
        run_burst()
        exiting.refresh()
        after.refresh()
        assert exiting.status == TaskResultStatus.FAILED
        assert exiting.errors[0].exception_class is SystemExit
        assert exiting.errors[0].traceback.endswith("SystemExit: 3\n")
        assert after.status == TaskResultStatus.SUCCESSFUL

    def test_return_value_that_is_not_json_fails_without_retry(self) -> None:
        result = probes.returns_object.using(max_attempts=3).enqueue()
        run_burst()
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert len(result.worker_ids) == 1
        assert result.errors[0].exception_class is InvalidReturnValue
        assert issubclass(InvalidReturnValue, TypeError)
        assert "Unsupported type" in result.errors[0].traceback

    def test_a_failing_signal_receiver_does_not_fail_the_task(self) -> None:
        def broken(**kwargs: Any) -> None:
            raise RuntimeError("receiver bug")

        task_finished.connect(broken, weak=False)
        task_started.connect(broken, weak=False)
        try:
            result = probes.record.enqueue("x")
            run_burst()
        finally:
            task_finished.disconnect(broken)
            task_started.disconnect(broken)
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.errors == []

    @pytest.mark.parametrize("max_attempts", [2, 1])
    def test_worker_shutdown_gives_back_a_task_that_takes_context(
        self, received, tmp_path, max_attempts: int
    ) -> None:
        """A task that stops on the worker's shutdown signal is released: ready
        again, its attempt unused — even with a single attempt — and no error."""
        status = TaskResultStatus.READY
        started = tmp_path / "started"
        held = probes.hold.using(max_attempts=max_attempts)
        result = held.enqueue(str(tmp_path / "never-released"), str(started))
        worker = Worker(listen=False, shutdown_timeout=0, cancel_grace=10)
        thread = threading.Thread(target=worker.run)
        thread.start()
        wait_until(Path(f"{started}.1").exists, 30, "the task to start")
        worker.stop()
        thread.join(30)
        assert not thread.is_alive()
        result.refresh()
        assert result.status == status
        assert result.errors == []
        assert job(result.id).attempt_count == 0
        assert received[-1] == ("finished", result.id, status, 1)

    def test_task_unknown_to_the_worker_fails_clearly(self) -> None:
        payload = {"task": "gone.module.fn", "backend": "default", "args": [], "kwargs": {}}
        execution.reserved_scope(SCOPE).submit("gone", JobSubmission.create(HANDLER, payload))
        run_burst()
        snap = job("gone")
        assert snap.status == JobStatus.FAILED
        assert snap.error.startswith("jobs.backends.exceptions.TaskNotRegistered\n")
        assert "'gone.module.fn' is not registered" in snap.error


@pytest.mark.django_db(transaction=True)
class TestFlowRules:
    """What maps onto a task passes through to its job: a start deadline, a unique
    key (with its mode or time), a debounce."""

    def test_a_unique_task_enqueued_twice_is_one_result(self) -> None:
        unique = email_users.using(unique_key="mail:42")
        first = unique.enqueue(["a@example.com"], "hello")
        again = unique.enqueue(["b@example.com"], "hello")
        assert again.id == first.id
        assert job(first.id).unique_key == "mail:42"

    def test_a_task_limit_key_reaches_its_job(self) -> None:
        result = email_users.using(limit_key="smtp-eu").enqueue(["a@example.com"], "hi")
        assert job(result.id).limit_key == "smtp-eu"

    def test_a_debounced_task_takes_the_latest_arguments(self) -> None:
        debounced = email_users.using(unique_key="digest", debounce=60)
        first = debounced.enqueue(["a@example.com"], "v1")
        latest = debounced.enqueue(["a@example.com"], "v2")
        assert latest.id == first.id
        assert job(first.id).payload["args"] == [["a@example.com"], "v2"]

    def test_a_task_not_started_in_time_fails_as_expired(self) -> None:
        result = email_users.using(start_within=30).enqueue(["a@example.com"], "late")
        snap = job(result.id)
        assert snap.start_by is not None
        execution.expire_jobs(now=snap.start_by)
        expired = default_task_backend.get_result(result.id)
        assert expired.status == TaskResultStatus.FAILED
        assert expired.errors[-1].exception_class_path.endswith("JobExpired")
