"""Saga recovery inside the worker: every ``run_jobs`` worker also resumes unfinished saga
instances (``SAGAS["RECOVER_IN_WORKER"]``), through the worker's signals."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from jobs import JobScope, JobStatus
from jobs.handlers import autodiscover
from jobs.signals import worker_started
from jobs.worker import Worker
from outbox.testing import fault_at
from sagas import SagaStatus, start_saga
from sagas.conf import sagas_settings
from sagas.exceptions import SagasConfigurationError
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


def test_a_burst_worker_runs_the_job_a_saga_staged_after_its_claims_found_nothing() -> None:
    """The worker's claims find no job while the runner beside it is between two steps
    of a saga whose last step stages a job. The burst is not over while the runner
    has work: the worker waits for it, then runs that job, and ends last."""
    autodiscover()  # what run_jobs does first: the saga's job has a handler
    state = start_saga("fulfilment.order", data=order())
    assert instance(state.instance_id).status == SagaStatus.RUNNING
    found_nothing = threading.Event()
    with (
        fault_at("jobs.worker.nothing_claimed", lambda context: found_nothing.set()),
        fault_at(
            "sagas.step.committed",
            lambda context: found_nothing.wait(30),
            when=lambda context: context["step"] == "charge",
        ),
    ):
        _worker, events = run_worker()
    assert found_nothing.is_set()
    row = instance(state.instance_id)
    assert row.status == SagaStatus.SUCCEEDED
    assert runs(state.instance_id) == ["reserve", "charge", "ship"]
    instance_id = str(state.instance_id)
    assert ("saga succeeded", f"fulfilment.order {instance_id}") in events
    job = JobScope("fulfilment").get(f"dispatch-{instance_id}")
    assert job.status == JobStatus.SUCCEEDED
    assert_the_burst_ended_last(events)
    said = [event for event, _ in events]
    assert said.index("saga succeeded") < said.index("claimed"), said


def test_a_burst_worker_runs_the_job_a_saga_it_resumed_staged_before_it_claimed() -> None:
    """The other order, as on a loaded machine: the runner finishes the saga (whose
    last step stages a job) before the worker's first claim. The runner waits for the
    worker to find nothing left; the burst runs that job, and still ends last."""
    autodiscover()  # what run_jobs does first: the saga's job has a handler
    state = start_saga("fulfilment.order", data=order())
    events: list[tuple[str, str]] = []

    def after_the_saga(sender: Any, worker: Worker, **kwargs: Any) -> None:
        wait_until(
            lambda: any(event == "saga succeeded" for event, _ in events),
            30,
            "the runner to finish the saga",
        )

    worker_started.connect(after_the_saga, dispatch_uid="test.after_the_saga")
    try:
        run_worker(events)
    finally:
        worker_started.disconnect(dispatch_uid="test.after_the_saga")
    job = JobScope("fulfilment").get(f"dispatch-{state.instance_id}")
    assert job.status == JobStatus.SUCCEEDED
    assert_the_burst_ended_last(events)
    said = [event for event, _ in events]
    assert said.index("saga succeeded") < said.index("claimed") < said.index("saga stopped"), said


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
