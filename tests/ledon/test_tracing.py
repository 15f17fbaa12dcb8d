"""OpenTelemetry tracing, with the SDK's in-memory exporter: a web request,
the job it staged, the job's attempts (retries linked), the outbox message the
attempt added, its publish to RabbitMQ and its consumption — one trace; saga steps and
compensations; errors on spans; nothing when tracing is off."""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from jobs import JobScope, job_handler
from jobs.handlers import RetryPolicy, unregister
from jobs.models import Job
from jobs.testing import run_jobs_inline
from jobs.worker import Worker
from outbox import IntegrationEvent, event_bus, unit_of_work
from sagas import SagaExecutionError, run_saga, saga
from sagas.registry import unregister as unregister_saga
from tests.support.brokers import EACH_BROKER
from tests.support.otel import named, one, parent_of

TRACED = {"TRACING": True}


@dataclass(frozen=True)
class TracePing(IntegrationEvent, name="tests.trace_ping"):
    order: str


#: What the consumer's subscriber saw: the trace it ran in.
consumed: list[tuple[str, int]] = []


def on_ping(event: TracePing) -> None:
    consumed.append((event.order, trace.get_current_span().get_span_context().trace_id))


@pytest.fixture(autouse=True)
def traced(settings):
    settings.JOBS = {**settings.JOBS, **TRACED}
    settings.OUTBOX = {**settings.OUTBOX, **TRACED, "ENABLED": True}
    settings.SAGAS = {**settings.SAGAS, **TRACED}
    settings.ROOT_URLCONF = "tests.support.tracing_urls"

    @job_handler("traced.ping")
    def ping(ctx):
        with unit_of_work() as uow:
            uow.add_integration_event(TracePing(ctx.payload["order"]), key=ctx.payload["order"])
        return "pinged"

    @job_handler("traced.flaky", retry=RetryPolicy(base_delay=0, jitter=0))
    def flaky(ctx):
        if ctx.attempt == 1:
            raise ConnectionError("first attempt fails")
        return "second time lucky"

    event_bus.subscribe(TracePing, on_ping)
    consumed.clear()
    yield
    event_bus.unsubscribe(TracePing, on_ping)
    unregister("traced.ping", 1)
    unregister("traced.flaky", 1)


def place(client, order: str, handler: str, **extra) -> dict:
    response = client.post(
        "/place",
        json.dumps({"order": order, "handler": handler, **extra}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    return response.json()


@pytest.mark.django_db(transaction=True)
def test_a_staged_jobs_attempts_are_children_of_the_stage_span_and_retries_are_linked(
    client, spans
):
    answer = place(client, "o-1", "traced.flaky", attempts=2)
    stored = Job.objects.get(job_id="o-1").trace_context
    assert json.loads(stored)["traceparent"].split("-")[1] == answer["trace_id"]

    Worker(burst=True, listen=False).run()
    assert JobScope("web").get("o-1").result_ref == "second time lucky"

    found = spans.get_finished_spans()
    request = one(found, "POST /place")
    stage = one(found, "jobs.stage traced.flaky")
    first, second = sorted(named(found, "jobs.attempt"), key=lambda s: s.start_time)
    assert {s.context.trace_id for s in (request, stage, first, second)} == {
        request.context.trace_id
    }
    assert parent_of(stage) == request.context.span_id
    assert stage.kind is SpanKind.PRODUCER
    assert stage.attributes["ledon.job.id"] == "o-1"
    # Both attempts are children of the stage span; the retry links to the first.
    assert parent_of(first) == parent_of(second) == stage.context.span_id
    assert first.kind is SpanKind.CONSUMER
    assert (first.attributes["ledon.job.attempt"], second.attributes["ledon.job.attempt"]) == (1, 2)
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    # The first attempt's error is on its span.
    assert first.status.status_code is StatusCode.ERROR
    [event] = first.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "ConnectionError"
    assert second.status.status_code is not StatusCode.ERROR


@pytest.mark.django_db
def test_a_submitted_job_run_inline_keeps_its_submitters_trace(spans):
    from jobs import JobSubmission, submit_job

    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("a management command") as outer:
        submit_job("inline", "p-1", JobSubmission.create("traced.ping", {"order": "p-1"}))
    run_jobs_inline()
    found = spans.get_finished_spans()
    submit = one(found, "jobs.submit traced.ping")
    attempt = one(found, "jobs.attempt traced.ping")
    assert parent_of(submit) == outer.get_span_context().span_id
    assert parent_of(attempt) == submit.context.span_id
    # The attempt's outbox message carries the attempt's context for the dispatcher.
    from outbox.models import OutboxMessage

    [message] = OutboxMessage.objects.all()
    assert message.headers["traceparent"].split("-")[2] == format(attempt.context.span_id, "016x")


@pytest.mark.django_db
def test_without_tracing_nothing_is_stored_and_no_span_is_made(settings, spans):
    from jobs import JobSubmission, submit_job

    settings.JOBS = {**settings.JOBS, "TRACING": False}
    settings.OUTBOX = {**settings.OUTBOX, "TRACING": False}
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("outer"):
        submit_job("inline", "p-2", JobSubmission.create("traced.ping", {"order": "p-2"}))
    run_jobs_inline()
    assert [s.name for s in spans.get_finished_spans()] == ["outer"]
    assert Job.objects.get(job_id="p-2").trace_context is None
    from outbox.models import OutboxMessage

    assert "traceparent" not in OutboxMessage.objects.get().headers


# --------------------------------------------------------------------------- sagas


def reserve(ctx):
    ctx.data["reserved"] = True


def release(ctx):
    ctx.data["released"] = True


def charge(ctx):
    raise ValueError("card declined")


@pytest.fixture
def declined_saga():
    saga("traced-order").step("reserve", reserve, compensate=release).step("charge", charge)
    yield
    unregister_saga("traced-order")


@pytest.mark.django_db(transaction=True)
def test_each_saga_step_and_compensation_has_its_span_with_errors_recorded(spans, declined_saga):
    tracer = trace.get_tracer("tests")
    with (
        tracer.start_as_current_span("checkout") as outer,
        pytest.raises(SagaExecutionError),
    ):
        run_saga("traced-order", data={"order": 1})
    found = spans.get_finished_spans()
    step_reserve = one(found, "sagas.step traced-order.reserve")
    step_charge = one(found, "sagas.step traced-order.charge")
    compensation = one(found, "sagas.compensate traced-order.reserve")
    for span in (step_reserve, step_charge, compensation):
        assert span.context.trace_id == outer.get_span_context().trace_id
        assert parent_of(span) == outer.get_span_context().span_id
    assert step_reserve.status.status_code is not StatusCode.ERROR
    assert step_charge.status.status_code is StatusCode.ERROR
    assert step_charge.events[0].attributes["exception.message"] == "card declined"
    assert compensation.attributes["ledon.saga.compensating"] is True
    assert step_reserve.start_time < step_charge.start_time < compensation.start_time


# --------------------------------------------------------------------------- end to end


def broker_transports(kind: str, name: str):
    """A transport to publish with and one to subscribe through, on the real broker
    ``kind``, private to this test (``name``: its exchange or topic)."""
    from tests.support.brokers import broker

    address = broker(kind).address
    if kind == "rabbitmq":
        from outbox.transports.rabbitmq import RabbitMQTransport

        return (
            RabbitMQTransport(url=address, exchange=name),
            RabbitMQTransport(url=address, exchange=name),
        )
    from outbox.transports.kafka import KafkaTransport

    # The topic is created by the first publish, after the consumer subscribed: the
    # consumer looks for it again every second (librdkafka's default is 5 minutes).
    # Short sessions make the group join quick.
    consumer_config = {
        "topic.metadata.refresh.interval.ms": 1000,
        "session.timeout.ms": 2000,
        "heartbeat.interval.ms": 200,
    }
    return (
        KafkaTransport(bootstrap_servers=address, topic=name, delivery_timeout=20),
        KafkaTransport(bootstrap_servers=address, topic=name, consumer_config=consumer_config),
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", EACH_BROKER)
@pytest.mark.django_db(transaction=True)
def test_web_view_to_job_to_outbox_to_broker_to_consumer_is_one_trace(
    client, spans, kind, settings
):
    """The headline: a request stages a job, its attempt adds an integration
    event, a dispatcher publishes it to a real broker, a consumer handles it — every
    span in the request's trace, each the child of the one before, the context carried
    in the job row and in the broker message's headers."""
    from prometheus_client import REGISTRY

    from outbox.consumer import EventConsumer
    from outbox.dispatcher import Dispatcher
    from tests.support.brokers import unique

    settings.OUTBOX = {**settings.OUTBOX, "METRICS": True}  # the consumer counts too
    transport, consuming = broker_transports(kind, unique("traced"))
    group = unique("traced-consumer")
    handled = {"group": group, "event_type": TracePing.event_name, "outcome": "handled"}
    arrived = threading.Event()
    event_bus.subscribe(TracePing, lambda event: arrived.set())
    consumer = EventConsumer(
        group,
        subscription=consuming.subscribe(
            group=group, sources=[], event_types=[TracePing.event_name]
        ),
        event_types=[TracePing.event_name],
    )
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert consumer.started.wait(60), "the consumer never opened its subscription"
        answer = place(client, "o-9", "traced.ping")
        Worker(burst=True, listen=False).run()
        Dispatcher(transport=transport, burst=True, listen=False).run()
        assert arrived.wait(60), "the consumer never handled the message"
    finally:
        consumer.stop()
        thread.join(60)
        transport.close()
    assert consumed == [("o-9", int(answer["trace_id"], 16))]
    found = spans.get_finished_spans()
    chain = [
        one(found, "POST /place"),
        one(found, "jobs.stage traced.ping"),
        one(found, "jobs.attempt traced.ping"),
        one(found, "outbox.publish tests.trace_ping"),
        one(found, "outbox.consume tests.trace_ping"),
    ]
    assert {s.context.trace_id for s in chain} == {int(answer["trace_id"], 16)}
    for parent, child in itertools.pairwise(chain):
        assert parent_of(child) == parent.context.span_id, (parent.name, child.name)
    publish, consume = chain[3], chain[4]
    assert publish.kind is SpanKind.PRODUCER
    assert publish.attributes["messaging.system"] == kind
    assert consume.kind is SpanKind.CONSUMER
    assert consume.attributes["messaging.consumer.group.name"] == group
    assert consume.attributes["ledon.outbox.outcome"] == "handled"
    assert REGISTRY.get_sample_value("ledon_outbox_consumed_total", handled) == 1


@pytest.mark.parametrize("kind", ["rabbitmq", "kafka"])
def test_the_publish_spans_context_is_what_each_broker_puts_in_its_headers(kind):
    """Without a broker: the headers each transport writes carry ``traceparent`` and
    ``tracestate`` (the user's headers travel as they are), and a received message's
    headers give them back, so the consumer's span finds its parent."""
    import uuid
    from datetime import UTC, datetime

    from outbox.transports import wire
    from outbox.types import Envelope

    carrier = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=1",
    }
    envelope = Envelope(
        message_id=uuid.uuid4(),
        event_type=TracePing.event_name,
        payload_json='{"order": "o-1"}',
        key="o-1",
        headers=carrier,
        created_at=datetime(2026, 12, 1, tzinfo=UTC),
        attempt=1,
    )
    sent = wire.envelope_headers(envelope)
    if kind == "kafka":  # bytes on the wire, as the Kafka transport sends them
        on_wire: dict[str, object] = {k: v.encode() for k, v in sent.items()}
    else:  # an AMQP table of str
        on_wire = dict(sent)
    back = wire.read_envelope(envelope.payload_json.encode(), wire.text_headers(on_wire))
    assert {k: back.headers[k] for k in carrier} == carrier
    assert back.message_id == envelope.message_id


@pytest.mark.django_db(transaction=True)
def test_a_refused_publish_is_an_error_on_its_span(spans):
    from outbox.dispatcher import Dispatcher
    from outbox.testing import RecordingTransport

    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("placing") as outer, unit_of_work() as uow:
        uow.add_integration_event(TracePing("o-5"), key="o-5")
    refusing = RecordingTransport(fail_with="no route to the billing exchange", permanent=True)
    Dispatcher(transport=refusing, burst=True, listen=False).run()
    publish = one(spans.get_finished_spans(), "outbox.publish tests.trace_ping")
    assert parent_of(publish) == outer.get_span_context().span_id
    assert publish.status.status_code is StatusCode.ERROR
    assert "no route to the billing exchange" in publish.status.description
    assert publish.attributes["messaging.system"] == "recording"
