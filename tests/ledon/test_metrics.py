"""Prometheus metrics: the counters and histograms after a known workload,
the gauges read from the database at scrape time, the view a project routes, and
``--metrics-port`` on an engine's command — on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from prometheus_client import REGISTRY

from jobs import JobSubmission, execution, job_handler, stage_job, submit_job
from jobs.handlers import RetryPolicy, unregister
from jobs.types import FinishOutcome
from jobs.worker import Worker
from outbox import IntegrationEvent, unit_of_work
from outbox.dispatcher import Dispatcher
from outbox.testing import RecordingTransport
from tests.support.procs import WorkerProcess, wait_until

QUEUE = "metrics-q"


def value(name: str, labels: dict[str, str] | None = None, **more: str) -> float:
    """A sample's value now (0 when the series does not exist yet)."""
    return REGISTRY.get_sample_value(name, {**(labels or {}), **more}) or 0.0


@pytest.fixture(autouse=True)
def metrics_on(settings):
    settings.JOBS = {**settings.JOBS, "METRICS": True}
    settings.OUTBOX = {**settings.OUTBOX, "METRICS": True, "ENABLED": True}
    settings.SAGAS = {**settings.SAGAS, "METRICS": True}

    @job_handler("metrics.ok")
    def ok(ctx):
        return "ok"

    @job_handler("metrics.boom", retry=RetryPolicy(base_delay=0, jitter=0))
    def boom(ctx):
        raise ValueError("boom")

    yield
    unregister("metrics.ok", 1)
    unregister("metrics.boom", 1)


def sub(handler: str, **options) -> JobSubmission:
    return JobSubmission.create(handler, queue=QUEUE, **options)


@pytest.mark.django_db(transaction=True)
def test_expired_jobs_are_counted_under_their_own_outcome():
    labels = {"queue": QUEUE, "handler": "metrics.ok", "outcome": "expired"}
    before = value("ledon_jobs_finished_total", labels)
    soon = timezone.now() + timedelta(seconds=5)
    for n in range(2):
        submit_job("m", f"late-{n}", sub("metrics.ok", start_by=soon))
    assert execution.expire_jobs(now=soon) == 2
    assert value("ledon_jobs_finished_total", labels) - before == 2


@pytest.mark.django_db(transaction=True)
def test_jobs_a_limit_holds_back_are_counted_by_its_rule(handler):
    handler("metrics.keyed", rate_per_key=(1, 60, 2))(lambda ctx: None)
    labels = {"queue": QUEUE, "handler": "metrics.keyed", "rule": "handler.rate_per_key"}
    before = value("ledon_jobs_held_back_total", labels)
    for n in range(5):
        submit_job("m", f"k{n}", sub("metrics.keyed", limit_key="acct-a"))
    assert len(execution.claim_due("w", limit=10, queues=[QUEUE])) == 2
    assert value("ledon_jobs_held_back_total", labels) - before == 3


@pytest.mark.django_db(transaction=True)
def test_counters_and_histograms_after_a_known_workload():
    enqueued = ("ledon_jobs_enqueued_total", {"queue": QUEUE, "handler": "metrics.ok"})
    before = {
        "enqueued": value(*enqueued),
        "succeeded": value(
            "ledon_jobs_finished_total", queue=QUEUE, handler="metrics.ok", outcome="succeeded"
        ),
        "retried": value(
            "ledon_jobs_finished_total", queue=QUEUE, handler="metrics.boom", outcome="retried"
        ),
        "failed": value(
            "ledon_jobs_finished_total", queue=QUEUE, handler="metrics.boom", outcome="failed"
        ),
        "runs": value("ledon_job_run_seconds_count", queue=QUEUE, handler="metrics.ok"),
        "waits": value("ledon_job_wait_seconds_count", queue=QUEUE, handler="metrics.boom"),
    }
    for n in range(3):
        submit_job("m", f"ok-{n}", sub("metrics.ok"))
    submit_job("m", "ok-0", sub("metrics.ok"))  # the same job again: not a new one
    with transaction.atomic():
        stage_job("m", "staged", sub("metrics.ok"))
    with transaction.atomic():  # rolled back: never counted
        stage_job("m", "rolled-back", sub("metrics.ok"))
        transaction.set_rollback(True)
    submit_job("m", "boom", sub("metrics.boom", max_attempts=2))
    assert value(*enqueued) - before["enqueued"] == 4

    Worker(burst=True, listen=False, queues=[QUEUE]).run()

    def delta(key: str, name: str, **labels: str) -> float:
        return value(name, **labels) - before[key]

    assert delta("succeeded", "ledon_jobs_finished_total", queue=QUEUE, handler="metrics.ok",
                 outcome="succeeded") == 4  # fmt: skip
    assert delta("retried", "ledon_jobs_finished_total", queue=QUEUE, handler="metrics.boom",
                 outcome="retried") == 1  # fmt: skip
    assert delta("failed", "ledon_jobs_finished_total", queue=QUEUE, handler="metrics.boom",
                 outcome="failed") == 1  # fmt: skip
    assert delta("runs", "ledon_job_run_seconds_count", queue=QUEUE, handler="metrics.ok") == 4
    assert delta("waits", "ledon_job_wait_seconds_count", queue=QUEUE, handler="metrics.boom") == 2


@pytest.mark.django_db(transaction=True)
def test_a_job_that_keeps_killing_its_worker_is_counted(settings):
    """The recovery that reaches the crash budget counts the job, by queue and
    handler; one that queues the job again does not."""
    settings.JOBS = {**settings.JOBS, "MAX_INTERRUPTIONS": 2}
    killing = ("ledon_jobs_keeps_killing_worker_total", {"queue": QUEUE, "handler": "metrics.ok"})
    before = value(*killing)
    submit_job("m", "poison", sub("metrics.ok"))
    outcomes = []
    for _ in range(2):
        [claim] = execution.claim_due("w-killed", limit=1, queues=[QUEUE])
        outcomes.append(execution.recover(claim.token))
        if outcomes[-1] is not FinishOutcome.KEEPS_KILLING_WORKER:
            assert value(*killing) == before
    assert outcomes == [FinishOutcome.REQUEUED, FinishOutcome.KEEPS_KILLING_WORKER]
    assert value(*killing) - before == 1


@pytest.mark.django_db(transaction=True)
def test_gauges_read_the_database_at_scrape_time(make_job):
    now = timezone.now()
    for n in range(3):
        submit_job("g", f"q-{n}", sub("metrics.ok", not_before=now - timedelta(minutes=5)))
    submit_job("g", "later", sub("metrics.ok", not_before=now + timedelta(hours=1)))
    submit_job("g", "other", JobSubmission.create("metrics.ok", queue="metrics-other"))
    [claim] = execution.claim_due("w-gauges", limit=1, queues=["metrics-other"])
    assert value("ledon_jobs_queued", queue=QUEUE) == 4  # due or not
    assert value("ledon_jobs_running", queue="metrics-other") == 1
    assert value("ledon_jobs_queued", queue="metrics-other") == 0
    age = value("ledon_jobs_oldest_due_age_seconds", queue=QUEUE)
    assert 5 * 60 <= age < 5 * 60 + 120
    execution.complete(claim.token)
    assert value("ledon_jobs_running", queue="metrics-other") == 0  # read again: now
    assert value("ledon_scrape_duration_seconds") > 0


@pytest.mark.django_db(transaction=True)
def test_outbox_and_saga_metrics_after_a_known_workload():
    from dataclasses import dataclass

    from sagas import SagaExecutionError, run_saga, saga
    from sagas.registry import unregister as unregister_saga

    @dataclass(frozen=True)
    class Measured(IntegrationEvent, name="tests.measured"):
        n: int

    def outcome(name: str) -> tuple[str, dict[str, str]]:
        return "ledon_outbox_messages_total", {"event_type": "tests.measured", "outcome": name}

    def number(envelope) -> int:
        return json.loads(envelope.payload_json)["n"]

    before = {name: value(*outcome(name)) for name in ("sent", "retried", "parked")}
    with unit_of_work() as uow:
        for n in range(4):
            uow.add_integration_event(Measured(n))
    assert value("ledon_outbox_pending") == 4
    assert value("ledon_outbox_oldest_pending_age_seconds") >= 0
    # Message 3 is refused for good: parked; the others are sent.
    poison = RecordingTransport(fail_with=lambda e: "poison" if number(e) == 3 else None,
                                permanent=True)  # fmt: skip
    Dispatcher(transport=poison, burst=True, listen=False).run()
    # Message 4 is refused for now: a retry is scheduled.
    with unit_of_work() as uow:
        uow.add_integration_event(Measured(4))
    busy = RecordingTransport(fail_with="broker busy")
    Dispatcher(transport=busy, burst=True, listen=False).run()
    assert value(*outcome("sent")) - before["sent"] == 3
    assert value(*outcome("parked")) - before["parked"] == 1
    assert value(*outcome("retried")) - before["retried"] == 1
    assert value("ledon_outbox_pending") == 1  # the retried one
    assert value("ledon_outbox_parked") == 1

    saga("metrics-saga").step("only", lambda ctx: None)
    saga("metrics-declined").step("reserve", lambda ctx: None, compensate=lambda ctx: None).step(
        "charge", _declined
    )
    try:
        done = ("ledon_sagas_finished_total", {"saga": "metrics-saga", "outcome": "succeeded"})
        undone = (
            "ledon_sagas_finished_total",
            {"saga": "metrics-declined", "outcome": "compensated"},
        )
        before_done, before_undone = value(*done), value(*undone)
        run_saga("metrics-saga", data={})
        with pytest.raises(SagaExecutionError):
            run_saga("metrics-declined", data={})
        assert value(*done) - before_done == 1
        assert value(*undone) - before_undone == 1
    finally:
        unregister_saga("metrics-saga")
        unregister_saga("metrics-declined")


def _declined(ctx) -> None:
    raise ValueError("card declined")


@pytest.mark.django_db
def test_the_view_serves_the_text_format(admin_client, settings):
    settings.ROOT_URLCONF = "tests.support.metrics_urls"
    submit_job("v", "v-1", sub("metrics.ok"))
    response = admin_client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert f'ledon_jobs_queued{{queue="{QUEUE}"}} 1.0' in text
    assert "# TYPE ledon_jobs_finished_total counter" in text
    assert "# TYPE ledon_job_run_seconds histogram" in text


def finished(outcome: str, count: int = 2) -> str:
    labels = f'handler="demo.flaky",outcome="{outcome}",queue="{QUEUE}"'
    return f"ledon_jobs_finished_total{{{labels}}} {count:.1f}"


def scrape_until(engine, wanted: str, what: str) -> str:
    """The scrape of ``engine``'s ``--metrics-port`` (the address it prints) once it
    has ``wanted`` in it."""
    found = wait_until(
        lambda: re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", engine.output),
        60,
        "the metrics address",
        engine,
    )
    url = f"http://127.0.0.1:{found.group(1)}/metrics"

    def scraped() -> str | None:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        return text if wanted in text else None

    return wait_until(scraped, 60, what, engine)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_jobs_serves_its_metrics_on_the_port_it_prints(tmp_path):
    for n in range(2):
        submit_job("p", f"p-{n}", JobSubmission.create("demo.flaky", {"fail_times": 1},
                                                       queue=QUEUE, max_attempts=2))  # fmt: skip
    # The worker's settings leave JOBS["METRICS"] off: the port alone turns on all.
    worker = WorkerProcess(tmp_path, "--metrics-port", "0", "--queue", QUEUE)
    try:
        text = scrape_until(worker, finished("succeeded"), "two succeeded jobs in the scrape")
        assert finished("retried") in text
        assert 'ledon_workers{kind="worker",state="live"} 1.0' in text
        labels = f'handler="demo.flaky",queue="{QUEUE}"'
        # Four attempts (two failed once, then succeeded), each waited for and timed.
        assert f"ledon_job_run_seconds_count{{{labels}}} 4.0" in text
        assert f"ledon_job_wait_seconds_count{{{labels}}} 4.0" in text
    finally:
        worker.signal(15)
        assert worker.wait() == 0
        worker.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--metrics-port", "70000"), "--metrics-port must be between 0 and 65535, got 70000"),
        (("--metrics-port", "-1"), "--metrics-port must be between 0 and 65535"),
        (("--metrics-port", "0", "--metrics-address", ""), "--metrics-address must be an"),
    ],
)
@pytest.mark.parametrize("command", ["run_jobs", "dispatch_outbox", "recover_sagas"])
def test_a_bad_metrics_option_is_refused_before_the_engine_starts(command, args, message):
    import io

    from django.core.management import CommandError, call_command

    out = io.StringIO()
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command(command, *args, "--burst", stdout=out)
    assert out.getvalue() == ""  # refused before the banner


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.django_db(transaction=True)
def test_the_metrics_server_listens_on_loopback_and_answers_metrics_only():
    import io

    from ledon.commands import DEFAULT_METRICS_ADDRESS, serve_metrics

    assert DEFAULT_METRICS_ADDRESS == "127.0.0.1"
    out = io.StringIO()
    server = serve_metrics(0, out=out, name="worker t")
    try:
        assert server.server_address[0] == "127.0.0.1"
        port = server.server_port
        assert out.getvalue() == f"worker t: metrics on http://127.0.0.1:{port}/metrics"
        status, text = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert "# TYPE ledon_jobs_queued gauge" in text
        for path in ("/", "/favicon.ico", "/metrics/", "/other"):
            status, text = get(f"http://127.0.0.1:{port}{path}")
            assert (status, "ledon_" in text) == (404, False), path
    finally:
        server.shutdown()
        server.server_close()


def test_the_metrics_address_option_defaults_to_loopback_and_says_how_to_open_it():
    from django.core.management import load_command_class

    for command, app in (("run_jobs", "jobs"), ("dispatch_outbox", "outbox")):
        parser = load_command_class(app, command).create_parser("manage.py", command)
        assert parser.parse_args([]).metrics_address == "127.0.0.1"
        assert "0.0.0.0" in parser.format_help()


@pytest.fixture
def settings_metrics_off(settings):
    """Every app's METRICS setting off, as a project without it; the layers are set
    back to what the settings say afterwards."""
    from django.apps import apps

    settings.JOBS = {**settings.JOBS, "METRICS": False}
    settings.OUTBOX = {**settings.OUTBOX, "METRICS": False}
    settings.SAGAS = {**settings.SAGAS, "METRICS": False}
    yield
    for config in apps.get_app_configs():
        layers = getattr(config, "optional_layers", None)
        if layers is not None:
            layers.configure()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("settings_metrics_off")
def test_metrics_turned_on_by_the_port_alone_time_every_attempt():
    """What ``--metrics-port`` does without ``JOBS["METRICS"]``: the wait and run
    histograms fill, so the documented p95 query has data."""
    from ledon import prometheus

    runs = ("ledon_job_run_seconds_count", {"queue": QUEUE, "handler": "metrics.ok"})
    waits = ("ledon_job_wait_seconds_count", {"queue": QUEUE, "handler": "metrics.ok"})
    # A chain built while the metrics were off must not be reused once they are on.
    submit_job("port", "before", sub("metrics.ok"))
    Worker(burst=True, listen=False, queues=[QUEUE]).run()
    before = value(*runs), value(*waits)
    prometheus.enable_all()
    for n in range(3):
        submit_job("port", f"p-{n}", sub("metrics.ok"))
    Worker(burst=True, listen=False, queues=[QUEUE]).run()
    assert (value(*runs) - before[0], value(*waits) - before[1]) == (3, 3)


@pytest.mark.django_db(transaction=True)
def test_gauges_read_zero_instead_of_disappearing():
    from sagas import saga
    from sagas.registry import unregister as unregister_saga

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    # Known queues, and every kind of engine, have series before anything ran.
    assert sample("ledon_jobs_queued", queue="default") == 0
    assert sample("ledon_jobs_running", queue="default") == 0
    assert sample("ledon_jobs_oldest_due_age_seconds", queue="default") == 0
    for kind in ("worker", "dispatcher", "consumer", "saga runner"):
        for state in ("live", "unhealthy", "silent"):
            assert sample("ledon_workers", kind=kind, state=state) == 0, (kind, state)
    # A queue that drained keeps its series, at 0.
    submit_job("z", "z-1", JobSubmission.create("metrics.ok", queue="metrics-drained"))
    assert sample("ledon_jobs_queued", queue="metrics-drained") == 1
    Worker(burst=True, listen=False, queues=["metrics-drained"]).run()
    assert sample("ledon_jobs_queued", queue="metrics-drained") == 0
    assert sample("ledon_jobs_running", queue="metrics-drained") == 0
    # A registered saga with no instance: each open status reads 0.
    saga("metrics-idle").step("only", lambda ctx: None)
    try:
        for status in ("running", "compensating", "failed"):
            assert sample("ledon_sagas", saga="metrics-idle", status=status) == 0, status
    finally:
        unregister_saga("metrics-idle")


@pytest.mark.django_db
def test_the_view_answers_only_staff_who_may_view_or_the_bearer_token(client, settings):
    from django.contrib.auth.models import Permission, User

    settings.ROOT_URLCONF = "tests.support.metrics_urls"
    settings.LEDON_METRICS_TOKEN = "s3cret-token"
    anonymous = client.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    assert b"ledon_" not in anonymous.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    token = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert token.status_code == 200
    assert b"# TYPE ledon_jobs_queued gauge" in token.content

    staff = User.objects.create_user("metrics-staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get("/metrics").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(User.objects.get(pk=staff.pk))
    assert client.get("/metrics").status_code == 403  # the outbox and sagas' numbers too
    staff.user_permissions.add(
        Permission.objects.get(codename="view_outboxmessage"),
        Permission.objects.get(codename="view_sagainstance"),
    )
    client.force_login(User.objects.get(pk=staff.pk))
    # The workflows' numbers too: runs by name and status.
    refused = client.get("/metrics")
    assert refused.status_code == 403
    assert b"ledon_workflow_runs" not in refused.content
    staff.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    client.force_login(User.objects.get(pk=staff.pk))
    answered = client.get("/metrics")
    assert answered.status_code == 200
    assert b"# TYPE ledon_workflow_runs gauge" in answered.content
    # Not staff: refused whatever the permissions.
    staff.is_staff = False
    staff.save()
    client.force_login(User.objects.get(pk=staff.pk))
    assert client.get("/metrics").status_code == 403


@pytest.mark.django_db
def test_every_app_with_metrics_names_the_permission_that_reads_them():
    """The view asks each installed app's own permission: an app cannot be left out."""
    from django.apps import apps
    from django.contrib.auth.models import Permission

    from ledon.apps import LedonAppConfig
    from ledon.metrics import view_permissions

    with_metrics = [c for c in apps.get_app_configs() if isinstance(c, LedonAppConfig)]
    assert sorted(c.label for c in with_metrics) == ["jobs", "outbox", "sagas", "workflows"]
    assert sorted(view_permissions()) == sorted(c.metrics_permission for c in with_metrics)
    for permission in view_permissions():
        app_label, codename = permission.split(".")
        assert Permission.objects.filter(
            content_type__app_label=app_label, codename=codename
        ).exists(), permission


@pytest.mark.django_db
def test_without_the_extra_the_urlconf_loads_and_the_view_names_it(
    admin_client, client, settings, monkeypatch
):
    """As without ``[metrics]``: importing prometheus-client fails. The URLconf that
    routes the view still loads; the view tells a permitted user what to install and
    still refuses everyone else."""
    import importlib
    import sys

    import ledon
    import tests.support

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    for package, name in (
        (ledon, "prometheus"),
        (ledon, "metrics"),
        (tests.support, "metrics_urls"),
    ):
        monkeypatch.delitem(sys.modules, f"{package.__name__}.{name}", raising=False)
        monkeypatch.delattr(package, name, raising=False)
    importlib.import_module("tests.support.metrics_urls")
    settings.ROOT_URLCONF = "tests.support.metrics_urls"
    answered = admin_client.get("/metrics")
    assert answered.status_code == 501
    assert answered.content.decode() == (
        "The metrics need prometheus-client, which is not installed: "
        "pip install 'django-ledon[metrics]'\n"
    )
    assert client.get("/metrics").status_code == 401
    assert "ledon.prometheus" not in sys.modules


def test_the_test_project_routes_the_protected_view(client):
    from django.urls import resolve

    from ledon.metrics import metrics_view

    assert resolve("/metrics").func is metrics_view


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "kind"), [("dispatch_outbox", "dispatcher"), ("recover_sagas", "saga runner")]
)
@pytest.mark.django_db(transaction=True)
def test_the_other_engines_serve_their_metrics_too(tmp_path, command, kind):
    from tests.support.procs import ManageProcess

    engine = ManageProcess(tmp_path, command, "--metrics-port", "0",
                           env={"JOBS_WORKERS_HEARTBEAT_SECONDS": "0.2"})  # fmt: skip
    try:
        live = f'ledon_workers{{kind="{kind}",state="live"}} 1.0'
        text = scrape_until(engine, live, f"the {kind} live in its own scrape")
        # Every installed app's metrics are on in that process, whatever the settings.
        for family in ("ledon_jobs_finished_total", "ledon_outbox_pending", "ledon_sagas"):
            assert f"# TYPE {family}" in text, family
    finally:
        engine.signal(15)
        assert engine.wait() == 0
        engine.close()
