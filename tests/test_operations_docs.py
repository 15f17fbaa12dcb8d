"""docs/operations.md: its Python examples run as written — the two middlewares in a
real chain, the JSON formatter on a worker's log line — and the page lists every
metric the code defines."""

from __future__ import annotations

import json
import logging
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from jobs import JobScope, JobStatus, JobSubmission, job_handler, submit_job
from jobs.handlers import PermanentFailure, unregister
from jobs.testing import run_jobs_inline
from jobs.worker import Worker

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
