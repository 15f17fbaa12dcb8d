"""Saga recovery inside the worker: every ``run_jobs`` worker also resumes unfinished saga
instances (``SAGAS["RECOVER_IN_WORKER"]``), through the worker's signals."""

from __future__ import annotations

import threading

import pytest

from jobs.signals import worker_started
from jobs.worker import Worker
from sagas import SagaStatus, start_saga
from sagas.conf import sagas_settings
from sagas.exceptions import SagasConfigurationError
from tests.support.procs import wait_until
from tests.support.sagas import instance, order, runs

pytestmark = pytest.mark.django_db(transaction=True)


def run_worker(**kwargs) -> tuple[Worker, list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []
    worker = Worker(
        burst=True,
        listen=False,
        on_event=lambda event, claim, detail: events.append((event, detail)),
        **kwargs,
    )
    worker.run()
    return worker, events


def test_a_burst_worker_resumes_a_started_saga_and_waits_for_it() -> None:
    state = start_saga("fulfilment.order", data=order())
    assert instance(state.instance_id).status == SagaStatus.RUNNING
    _worker, events = run_worker()
    row = instance(state.instance_id)
    assert row.status == SagaStatus.SUCCEEDED
    assert runs(state.instance_id) == ["reserve", "charge", "ship"]
    instance_id = str(state.instance_id)
    assert ("saga succeeded", f"fulfilment.order {instance_id}") in events
    # The burst waited for the saga: it ended after the runner's last step.
    assert [event for event, _ in events][-2:] == ["saga stopped", "stopped"]


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
        assert started.wait(10)
        assert any(t.name == "saga-recovery" for t in threading.enumerate())
        worker.stop()
        thread.join(10)
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
        assert started.wait(10)
        wait_until(lambda: WorkerRecord.objects.count() == 2, 30, "the two rows")
        seen = list(WorkerRecord.objects.values_list("kind", "engine_id").order_by("kind"))
    finally:
        worker.stop()
        thread.join(10)
        worker_started.disconnect(dispatch_uid="test.on_started")
    assert seen == [("saga runner", "in-worker-id"), ("worker", "in-worker-id")]
