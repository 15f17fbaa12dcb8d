"""docs/operations.md: its Python examples run as written — the two middlewares in a
real chain, the JSON formatter on a worker's log line —, its bulk commands' console
examples print what it shows, and the page lists every metric the code defines."""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
import types
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone
from prometheus_client import REGISTRY

from jobs import JobScope, JobStatus, JobSubmission, job_handler, submit_job
from jobs.handlers import PermanentFailure, unregister
from jobs.testing import run_jobs_inline
from jobs.worker import Worker
from sagas import SagaSnapshot
from sagas import store as saga_store
from workflows import RunStatus, WorkflowScope, start_workflow
from workflows.testing import run_workflows_inline

PAGE = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


@pytest.fixture
def page_module():
    """The page's blocks, run in order in one module the settings can name."""
    module = types.ModuleType("docs_operations")
    module.__dict__.update(SUSPENDED={"acme"}, PermanentFailure=PermanentFailure)
    for block in BLOCKS:
        exec(compile(block, str(PAGE), "exec"), module.__dict__)
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


@pytest.fixture
def handler():
    @job_handler("ops.echo")
    def echo(ctx):
        return f"echo {ctx.payload['tenant']}"

    yield
    unregister("ops.echo", 1)


@pytest.mark.django_db
def test_the_middleware_examples_wrap_a_handler(page_module, handler, settings, caplog):
    settings.JOBS = {
        **settings.JOBS,
        "MIDDLEWARE": ["docs_operations.timing", "docs_operations.tenant_tag"],
    }
    submit_job("ops", "ok", JobSubmission.create("ops.echo", {"tenant": "globex"}))
    submit_job("ops", "no", JobSubmission.create("ops.echo", {"tenant": "acme"}, max_attempts=3))
    with caplog.at_level(logging.INFO, logger="myproject.jobs"):
        run_jobs_inline()
    assert JobScope("ops").get("ok").result_ref == "echo globex"
    refused = JobScope("ops").get("no")
    assert refused.status is JobStatus.FAILED
    assert refused.attempt_count == 1  # PermanentFailure: no retry
    assert "tenant acme is suspended" in refused.error
    timed = sorted(r.job_id for r in caplog.records if r.getMessage().startswith("ops.echo took"))
    assert timed == ["no", "ok"]  # the outer middleware saw both, the refusal too


@pytest.mark.django_db(transaction=True)
def test_the_json_formatter_gives_each_field_its_key(page_module, handler, caplog):
    submit_job("ops", "j-1", JobSubmission.create("ops.echo", {"tenant": "t"}))
    with caplog.at_level(logging.INFO, logger="jobs.worker"):
        Worker(burst=True, listen=False, worker_id="ops-worker").run()
    [record] = [r for r in caplog.records if r.getMessage() == "job j-1 succeeded"]
    line = json.loads(page_module.JSONFormatter().format(record))
    assert line["message"] == "job j-1 succeeded"
    assert (line["worker"], line["job_id"], line["handler"], line["outcome"]) == (
        "ops-worker", "j-1", "ops.echo", "succeeded"
    )  # fmt: skip
    assert {"scope_hash", "attempt", "token", "queue", "duration"} <= set(line)
    assert "args" not in line
    assert page_module.LOGGING["handlers"]["json"]["formatter"] == "json"


@pytest.fixture
def all_metrics_on() -> Iterator[None]:
    """Every app's metrics on, as a scrape turns them on; afterwards what the settings
    say again (off), so that no later test of this process counts."""
    from django.apps import apps

    from ledon import prometheus

    prometheus.enable_all()
    yield
    for config in apps.get_app_configs():
        layers = getattr(config, "optional_layers", None)
        if layers is not None:
            layers.configure()


@pytest.mark.django_db
@pytest.mark.usefixtures("all_metrics_on")
def test_the_page_lists_every_metric_the_code_exports_and_no_other():
    """Every family a scrape returns (counters, histograms, the database gauges of all
    three apps), named as Prometheus shows them, against the page's metrics table."""
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in REGISTRY.collect()
        if family.name.startswith("ledon_")
    }
    documented = set(re.findall(r"^\| `(ledon_\w+)` \|", PAGE.read_text(), re.M))
    assert exported == documented
    # Each row's type column says what the code exports.
    types_ = dict(re.findall(r"^\| `(ledon_\w+)` \| (\w+) \|", PAGE.read_text(), re.M))
    for family in REGISTRY.collect():
        if family.name.startswith("ledon_"):
            name = family.name + ("_total" if family.type == "counter" else "")
            assert types_[name] == family.type, name


# --------------------------------------------------------------------------- bulk commands

CONSOLE = re.findall(r"```console\n(.*?)```", PAGE.read_text(), re.S)


def session(command: str) -> list[tuple[list[str], list[str]]]:
    """The page's console example of ``command`` (the block whose first line runs
    it): each ``$ python manage.py …`` line's arguments, and the lines it prints."""
    [block] = [b for b in CONSOLE if b.startswith(f"$ python manage.py {command}")]
    steps: list[tuple[list[str], list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ python manage.py "):
            steps.append((shlex.split(line.removeprefix("$ python manage.py ")), []))
        else:
            steps[-1][1].append(line)
    return steps


def replay(command: str) -> None:
    """Run the page's example of ``command`` as written: each command prints the lines
    shown, but for the time a run took."""
    for args, shown in session(command):
        out = StringIO()
        call_command(*args, stdout=out)
        printed = re.sub(r"in \d+\.\d s$", "in 0.0 s", out.getvalue().rstrip("\n"), flags=re.M)
        assert printed.splitlines() == shown, " ".join(args)


@pytest.mark.django_db(transaction=True)
def test_the_bulk_sagas_example_prints_what_the_page_shows():
    """Four instances of the order saga: a runner died in each of two (one was
    compensating), one a live runner holds, one succeeded; another saga's stopped
    instance is not named."""
    long_ago = timezone.now() - timedelta(hours=1)

    def started(name: str, owner: str = "gone") -> SagaSnapshot:
        return saga_store.create(
            name, ["reserve"], {}, idempotency_key=None, owner=owner, lease_seconds=60,
            now=long_ago,
        )  # fmt: skip

    started("fulfilment.order")
    undoing = started("fulfilment.order")
    saga_store.begin_compensation(undoing, "gone", "reserve", "out of stock", now=long_ago)
    live = started("fulfilment.order", owner="node-1")
    assert saga_store.renew(live.instance_id, "node-1", lease_seconds=600)
    saga_store.complete_step(started("fulfilment.order"), "gone", "reserve", {}, now=long_ago)
    other = started("billing.charge")

    replay("bulk_sagas")

    assert saga_store.require(other.instance_id).leased_by == "gone"


@pytest.mark.django_db(transaction=True)
def test_the_bulk_workflows_tag_example_prints_what_the_page_shows():
    """Customer 42's runs in the EU: two wait for a signal, one finished; runs of the
    same customer elsewhere, or of another in the EU, are not selected."""
    eu42 = {"customer": "42", "region": "eu"}
    for run_id, tags in (
        ("order-1", eu42),
        ("order-2", eu42),
        ("order-3", {"customer": "42", "region": "us"}),
        ("order-4", {"customer": "7", "region": "eu"}),
    ):
        start_workflow("shop", run_id, "checks.signals", {}, tags=tags)
    start_workflow("shop", "done", "checks.linear", {"start": 1}, tags=eu42)
    run_workflows_inline()

    replay("bulk_workflows cancel --tag")

    statuses = {run.run_id: run.status for run in WorkflowScope("shop").list()}
    assert statuses == {
        "order-1": RunStatus.CANCELLED,
        "order-2": RunStatus.CANCELLED,
        "order-3": RunStatus.WAITING,
        "order-4": RunStatus.WAITING,
        "done": RunStatus.SUCCEEDED,
    }
