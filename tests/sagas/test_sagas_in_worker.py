"""Saga recovery inside the worker: every ``run_jobs`` worker also resumes unfinished saga
instances (``SAGAS["RECOVER_IN_WORKER"]``), through the worker's signals."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from jobs import JobScope, JobStatus
from jobs.handlers import autodiscover
from jobs.signals import worker_started, worker_stopping
from jobs.worker import Worker
from outbox.testing import fault_at
from sagas import SagaStatus, start_saga
from sagas.conf import sagas_settings
from sagas.exceptions import SagasConfigurationError
from sagas.in_worker import stop_recovery
from tests.support.procs import wait_until
from tests.support.sagas import instance, order, runs

pytestmark = pytest.mark.django_db(transaction=True)


def run_worker(
    events: list[tuple[str, str]] | None = None, **kwargs: Any
) -> tuple[Worker, list[tuple[str, str]]]:
    """A burst worker run to its end; its events (and the runner's beside it) are
    appended to ``events`` as they are said."""
    events = [] if events is None else events
    worker = Worker(
        burst=True,
        listen=False,
        on_event=lambda event, claim, detail: events.append((event, detail)),
        **kwargs,
    )
    worker.run()
    return worker, events


def assert_the_burst_ended_last(events: list[tuple[str, str]]) -> None:
    """What a burst promises about its end: the worker's ``stopped`` comes last, after
    the runner beside it ended (``saga stopped``), which was after the saga succeeded.
    Nothing is promised about how the worker's other events and the runner's, each
    said on its own thread, interleave before that."""
    said = [event for event, _ in events]
    assert said[-1] == "stopped", said
    assert said.index("saga succeeded") < said.index("saga stopped") < len(said) - 1, said


@contextmanager
def on_worker_stopping_before_the_runner_is_waited_for(
    receiver: Callable[..., None],
) -> Iterator[None]:
    """Connect ``receiver`` to ``worker_stopping`` ahead of the sagas app's own
    receiver (which waits for the runner in a burst)."""
    worker_stopping.disconnect(dispatch_uid="sagas.stop_recovery")
    worker_stopping.connect(receiver, dispatch_uid="test.stopping")
    worker_stopping.connect(stop_recovery, dispatch_uid="sagas.stop_recovery")
    try:
        yield
    finally:
        worker_stopping.disconnect(dispatch_uid="test.stopping")


def test_a_burst_worker_resumes_a_started_saga_and_waits_for_it() -> None:
    """The burst finds no job to run while the saga is still between two of its
    steps: it stops claiming, then waits for the runner to finish the saga."""
    state = start_saga("fulfilment.order", data=order())
    assert instance(state.instance_id).status == SagaStatus.RUNNING
    claiming_stopped = threading.Event()

    def stopped_claiming(sender: Any, worker: Worker, **kwargs: Any) -> None:
        claiming_stopped.set()

    with (
        on_worker_stopping_before_the_runner_is_waited_for(stopped_claiming),
        fault_at(
            "sagas.step.committed",
            lambda context: claiming_stopped.wait(30),
            when=lambda context: context["step"] == "charge",
        ),
    ):
        _worker, events = run_worker()
    assert claiming_stopped.is_set()
    row = instance(state.instance_id)
    assert row.status == SagaStatus.SUCCEEDED
    assert runs(state.instance_id) == ["reserve", "charge", "ship"]
    instance_id = str(state.instance_id)
    assert ("saga succeeded", f"fulfilment.order {instance_id}") in events
    assert_the_burst_ended_last(events)


def test_a_burst_worker_runs_the_job_a_saga_it_resumed_staged_before_it_claimed() -> None:
    """The other order, as on a loaded machine: the runner finishes the saga (whose
    last step stages a job) and ends before the worker's first claim. The burst runs
    that job, and still ends last."""
    autodiscover()  # what run_jobs does first: the saga's job has a handler
    state = start_saga("fulfilment.order", data=order())
    events: list[tuple[str, str]] = []

    def after_the_runner(sender: Any, worker: Worker, **kwargs: Any) -> None:
        wait_until(
            lambda: any(event == "saga stopped" for event, _ in events), 30, "the runner to end"
        )

    worker_started.connect(after_the_runner, dispatch_uid="test.after_the_runner")
    try:
        run_worker(events)
    finally:
        worker_started.disconnect(dispatch_uid="test.after_the_runner")
    job = JobScope("fulfilment").get(f"dispatch-{state.instance_id}")
    assert job.status == JobStatus.SUCCEEDED
    assert_the_burst_ended_last(events)
    said = [event for event, _ in events]
    assert said.index("saga stopped") < said.index("claimed"), said


def test_off_leaves_saga_instances_to_recover_sagas(settings) -> None:
    settings.SAGAS = {**settings.SAGAS, "RECOVER_IN_WORKER": False}
    state = start_saga("fulfilment.order", data=order())
    _worker, events = run_worker()
    assert instance(state.instance_id).status == SagaStatus.RUNNING
    assert runs(state.instance_id) == []
    assert not any(event.startswith("saga ") for event, _ in events)


def test_a_worker_stopped_on_request_stops_its_runner_too() -> None:
    """Not a burst: the runner polls beside the worker and ends when the worker does."""
    started = threading.Event()
    worker = Worker(listen=False)

    def on_started(sender, worker, **kwargs) -> None:
        started.set()

    worker_started.connect(on_started, dispatch_uid="test.on_started")
    try:
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert started.wait(60)
        assert any(t.name == "saga-recovery" for t in threading.enumerate())
        worker.stop()
        thread.join(60)
        assert not thread.is_alive()
    finally:
        worker_started.disconnect(dispatch_uid="test.on_started")
    assert not any(t.name == "saga-recovery" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_the_setting_must_be_true_or_false(settings, value) -> None:
    settings.SAGAS = {**settings.SAGAS, "RECOVER_IN_WORKER": value}
    with pytest.raises(SagasConfigurationError, match="RECOVER_IN_WORKER"):
        sagas_settings()


@pytest.fixture
def no_saga_registered():
    """This process with no saga defined (as a project that uses jobs alone)."""
    from sagas import registry

    with registry._registry_lock:
        saved = dict(registry._registry)
        registry._registry.clear()
    try:
        yield
    finally:
        with registry._registry_lock:
            registry._registry.update(saved)


@pytest.mark.usefixtures("no_saga_registered")
def test_without_any_saga_defined_the_worker_says_nothing_of_sagas() -> None:
    import io

    from django.core.management import call_command

    _worker, events = run_worker()
    assert [event for event, _ in events if event.startswith("saga")] == []
    out = io.StringIO()
    call_command("run_jobs", "--burst", stdout=out)
    assert "saga" not in out.getvalue()
    assert not any(t.name == "saga-recovery" for t in threading.enumerate())


def test_the_runner_beside_a_worker_goes_by_the_workers_id() -> None:
    from jobs.models import WorkerRecord

    seen: list[tuple[str, str]] = []
    started = threading.Event()

    def on_started(sender, worker, **kwargs) -> None:
        started.set()

    worker = Worker(listen=False, worker_id="in-worker-id")
    worker_started.connect(on_started, dispatch_uid="test.on_started")
    try:
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert started.wait(60)
        wait_until(lambda: WorkerRecord.objects.count() == 2, 30, "the two rows")
        seen = list(WorkerRecord.objects.values_list("kind", "engine_id").order_by("kind"))
    finally:
        worker.stop()
        thread.join(60)
        worker_started.disconnect(dispatch_uid="test.on_started")
    assert seen == [("saga runner", "in-worker-id"), ("worker", "in-worker-id")]
