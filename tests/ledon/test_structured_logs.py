"""The engines' log lines carry their fields in ``extra=`` — each attempt's
worker, job id, scope hash, attempt, token prefix, queue, handler and duration; the
dispatcher's, the consumer's and the saga runner's own."""

from __future__ import annotations

import logging

import pytest

from jobs import JobSubmission, job_handler, submit_job
from jobs.handlers import unregister
from jobs.models import JobAttempt
from jobs.worker import Worker
from outbox.dispatcher import Dispatcher
from outbox.testing import RecordingTransport

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def handler():
    @job_handler("logs.ok")
    def ok(ctx):
        return "ok"

    yield
    unregister("logs.ok", 1)


def test_an_attempts_log_line_carries_its_fields(handler, caplog):
    snap = submit_job("logs", "l-1", JobSubmission.create("logs.ok", queue="logs-q"))
    with caplog.at_level(logging.INFO, logger="jobs.worker"):
        Worker(burst=True, listen=False, worker_id="log-worker").run()
    [line] = [r for r in caplog.records if r.getMessage() == "job l-1 succeeded"]
    [token] = JobAttempt.objects.filter(job__job_id="l-1").values_list("token", flat=True)
    assert (line.worker, line.job_id, line.scope_hash, line.attempt) == (
        "log-worker", "l-1", snap.scope_hash, 1
    )  # fmt: skip
    assert (line.queue, line.handler, line.outcome) == ("logs-q", "logs.ok", "succeeded")
    assert token.startswith(line.token)
    assert len(line.token) == 8  # a prefix: the token itself is the attempt's capability
    assert 0 <= line.duration < 60
    start = next(r for r in caplog.records if "starting" in r.getMessage())
    assert start.worker == "log-worker"


def test_a_dispatchers_batch_line_carries_its_fields(caplog, settings):
    from dataclasses import dataclass

    from outbox import IntegrationEvent, unit_of_work

    @dataclass(frozen=True)
    class Logged(IntegrationEvent, name="tests.logged"):
        n: int

    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}
    with unit_of_work() as uow:
        uow.add_integration_event(Logged(1))
    with caplog.at_level(logging.INFO, logger="outbox.dispatcher"):
        Dispatcher(
            transport=RecordingTransport(), burst=True, listen=False, dispatcher_id="d-1"
        ).run()
    [line] = [r for r in caplog.records if r.getMessage().startswith("outbox batch")]
    assert (line.worker, line.claimed, line.sent) == ("d-1", 1, 1)
    assert line.duration >= 0


def test_a_consumers_line_carries_its_fields(caplog, settings):
    from tests.outbox.test_brokers_consumer import GROUP, received, run

    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}
    message = received(number="L-1")
    with caplog.at_level(logging.INFO, logger="outbox.consumer"):
        consumer, _ = run(message)
    [line] = [r for r in caplog.records if "handled" in r.getMessage()]
    assert (line.worker, line.group, line.source) == (consumer.consumer_id, GROUP, "scripted")
    assert (line.message_id, line.event_type) == (
        str(message.envelope.message_id),
        message.envelope.event_type,
    )


def test_a_saga_runners_line_carries_its_fields(caplog):
    from sagas import SagaExecutionError, run_saga, saga
    from sagas.registry import unregister

    def declined(ctx):
        raise ValueError("card declined")

    saga("logged-order").step("charge", declined)
    try:
        with caplog.at_level(logging.INFO, logger="sagas"), pytest.raises(SagaExecutionError):
            run_saga("logged-order", data={})
    finally:
        unregister("logged-order")
    [line] = [r for r in caplog.records if "step 'charge' failed" in r.getMessage()]
    assert (line.saga, line.step) == ("logged-order", "charge")
    assert line.instance_id in line.getMessage()
    assert line.runner_id
