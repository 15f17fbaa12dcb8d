"""The Python examples of README.md and of docs/quickstart.md, workers.md, scopes.md,
testing.md and django-tasks.md, run as they are written. (docs/outbox.md and
docs/sagas.md are checked by their own test modules against the code the
suite runs.)

Each page's blocks run in order in one namespace, which starts with stand-ins for
what the examples take from the reader's project (an ``Order`` model, a request).
The test then calls what the examples define and checks what they promise.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import transaction

from jobs import JobScope, JobStatus, tasks_framework
from jobs.backends import compat
from jobs.handlers import unregister
from jobs.models import Job
from jobs.worker import Worker

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
TASKS_IMPORT = re.compile(r"^from django\.tasks import", re.M)
TASK_IMPORT = re.compile(r"^from django\.tasks import task\n", re.M)

pytestmark = pytest.mark.django_db(transaction=True)


def python_blocks(page: str) -> list[str]:
    """The page's Python blocks, as a reader on this Django runs them: on Django 5.2
    the tasks framework is the backport, imported from ``django_tasks`` where the
    pages write ``django.tasks``; on Django 6.0, whose ``@task`` takes no options for
    the task class, ``task`` comes from ``jobs.backends.compat`` (as
    docs/django-tasks.md tells such a reader)."""
    blocks = BLOCK.findall((ROOT / page).read_text())
    if not tasks_framework.BUILT_IN:
        return [TASKS_IMPORT.sub(f"from {tasks_framework.PACKAGE} import", b) for b in blocks]
    if compat.task is compat._framework_task:
        return blocks
    return [TASK_IMPORT.sub("from jobs.backends.compat import task\n", b) for b in blocks]


class _Orders:
    """Stands in for the reader's ``Order`` model: ``Order.objects.create``."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.created: list[SimpleNamespace] = []

    def create(self, **fields: Any) -> SimpleNamespace:
        order = SimpleNamespace(pk=next(self._ids), **fields)
        self.created.append(order)
        return order


def run_page(
    page: str,
    *,
    skip_last: bool = False,
    before: dict[int, Callable[[], object]] | None = None,
    **prelude: Any,
) -> dict[str, Any]:
    """Run the page's blocks in order; ``before[i]`` runs just before block ``i``."""
    namespace: dict[str, Any] = {"__name__": f"docs_{Path(page).stem.replace('-', '_')}"}
    namespace.update(prelude)
    blocks = python_blocks(page)
    for index, block in enumerate(blocks[:-1] if skip_last else blocks):
        if before and index in before:
            before[index]()
        exec(compile(block, page, "exec"), namespace)
    return namespace


@pytest.fixture
def reader_project():
    orders = _Orders()
    yield {
        "Order": SimpleNamespace(objects=orders),
        "request": SimpleNamespace(user=SimpleNamespace(pk=42)),
    }
    for name in ("invoices.render", "reports.generate", "partners.sync"):
        unregister(name, 1)


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_place_order_example_stages_a_job_that_a_worker_runs(page, reader_project):
    reads_back = page == "docs/quickstart.md"  # its last block needs a placed order
    namespace = run_page(page, skip_last=reads_back, **reader_project)

    def place_then_fail() -> None:
        with transaction.atomic():
            namespace["place_order"](reader_project["request"])
            raise RuntimeError("rolled back on purpose")

    with pytest.raises(RuntimeError, match="rolled back on purpose"):
        place_then_fail()
    scope = JobScope("account-42" if page == "README.md" else "customer-42")
    assert scope.list() == []  # the job went with the rolled-back transaction

    namespace["place_order"](reader_project["request"])
    (job,) = scope.list()
    assert job.handler == "invoices.render"
    Worker(burst=True, listen=False).run()
    done = scope.get(job.job_id)
    assert done.status == JobStatus.SUCCEEDED
    assert done.result_ref == f"invoices/{done.payload['order_id']}.pdf"

    if reads_back:
        order = reader_project["Order"].objects.created[-1]
        namespace.update(user=reader_project["request"].user, order=order)
        exec(compile(python_blocks(page)[-1], page, "exec"), namespace)
        assert namespace["snap"].status == JobStatus.SUCCEEDED


def test_workers_handler_example_reports_progress_and_fails_permanently(reader_project):
    built: list[str] = []
    namespace = run_page(
        "docs/workers.md", build=built.append, nothing_to_do=False, **reader_project
    )
    assert namespace["JOBS"]["LEASE_SECONDS"] == 30

    from jobs import JobSubmission, submit_job

    submit_job("docs", "report", JobSubmission.create("reports.generate", {"months": ["2026-11"]}))
    Worker(burst=True, listen=False).run()
    snap = JobScope("docs").get("report")
    assert snap.status == JobStatus.SUCCEEDED
    assert snap.result_ref == "reports/2026-11.csv"
    assert snap.progress == 50
    assert built == ["2026-11"]

    namespace["nothing_to_do"] = True
    submit_job(
        "docs",
        "empty",
        JobSubmission.create("reports.generate", {"months": []}, max_attempts=3),
    )
    Worker(burst=True, listen=False).run()
    empty = JobScope("docs").get("empty")
    assert empty.status == JobStatus.FAILED
    assert empty.attempt_count == 1  # PermanentFailure: no automatic retry
    assert "no data" in empty.error


def test_workers_flow_control_examples_snooze_limit_and_pause(reader_project, settings):
    """The handler of "Timeouts, snoozing and flow control" registers its timeout and
    limits, snoozes without consuming an attempt while the partner is busy, then
    runs; the QUEUES block is valid settings; the pause block leaves the queue
    running."""
    from django.utils import timezone

    from jobs import JobSubmission, submit_job
    from jobs.conf import jobs_settings, queue_limits
    from jobs.flow_control import Limits
    from jobs.handlers import get_handler
    from jobs.models import Queue
    from jobs.types import AttemptStatus

    busy = {"acme": True}
    fetched: list[str] = []
    namespace = run_page(
        "docs/workers.md",
        build=lambda month: None,
        nothing_to_do=False,
        partner_busy=busy.__getitem__,
        pages=lambda partner: [f"{partner}-1", f"{partner}-2"],
        fetch=fetched.append,
        save_where_we_are=lambda page: None,
        **reader_project,
    )
    spec = get_handler("partners.sync", 1)
    assert spec.timeout_seconds() == 30
    assert spec.limits == Limits(max_running=4, max_running_per_scope=1, rate=(20, 1))
    assert namespace["execution"].pause_queue("emails")  # the page resumed it
    assert namespace["execution"].resume_queue("emails")
    assert not Queue.objects.get(name="emails").paused

    submit_job("docs", "sync", JobSubmission.create("partners.sync", {"partner": "acme"}))
    Worker(burst=True, listen=False).run()
    job = Job.objects.get(job_id="sync")
    assert (job.status, job.attempt_count, job.snooze_count) == (JobStatus.QUEUED, 0, 1)
    assert job.next_run_at > timezone.now() + timedelta(seconds=290)
    assert [a.status for a in job.attempts.all()] == [AttemptStatus.SNOOZED]

    busy["acme"] = False
    Job.objects.filter(pk=job.pk).update(next_run_at=timezone.now())
    Worker(burst=True, listen=False).run()
    job.refresh_from_db()
    assert (job.status, job.result_ref, job.attempt_count) == (JobStatus.SUCCEEDED, "synced", 1)
    assert fetched == ["acme-1", "acme-2"]

    [queues] = [b for b in python_blocks("docs/workers.md") if '"max_running": 4' in b]
    exec(compile(queues, "docs/workers.md", "exec"), block := {})
    settings.JOBS = block["JOBS"]
    assert block["JOBS"]["QUEUES"] == jobs_settings().QUEUES
    assert queue_limits()["emails"] == Limits(max_running=4, rate=(10, 1))
    assert queue_limits()["imports"] == Limits(max_running_per_scope=1)


def test_scopes_example_keeps_tenants_apart():
    namespace = run_page("docs/scopes.md")
    assert [j.job_id for j in namespace["JobScope"]("tenant-43").list()] == ["monthly-report"]
    first = namespace["JobScope"]("tenant-42").get("monthly-report")
    second = namespace["JobScope"]("tenant-43").get("monthly-report")
    assert first.scope_hash != second.scope_hash
    results = namespace["results"]  # submit_jobs: many at once
    assert [r.created for r in results] == [True, True, True, False]
    assert results[3].conflict is not None
    assert results[3].conflict.fields == ("handler",)
    assert results[0].job().job_id == "reminder-0"
    # The reserved scope of schedule periods is not the tenant "periodic".
    assert namespace["periods"].scope_hash != namespace["JobScope"]("periodic").scope_hash


def test_testing_page_example_imports_and_defines_its_test():
    namespace = run_page("docs/testing.md")
    assert callable(namespace["test_placing_an_order_renders_its_invoice"])
    assert namespace["run_jobs_inline"]() == []


def test_django_tasks_page_examples_enqueue_run_read_back_and_cancel(mailoutbox):
    def run_worker() -> None:
        Worker(burst=True, listen=False).run()

    # A worker runs between "enqueue" and "later, anywhere".
    namespace = run_page("docs/django-tasks.md", before={3: run_worker})
    assert namespace["TASKS"]["default"]["BACKEND"] == "jobs.backends.JobsBackend"
    result = namespace["result"]
    assert result.status == "SUCCESSFUL"
    assert result.return_value == 1
    assert [m.to for m in mailoutbox] == [["user@example.com"]]
    # The retrying task was enqueued with its five attempts.
    retrying = Job.objects.get(payload_json__contains="sync_invoice")
    assert retrying.max_attempts == 5
    # The last block cancels by id: the e-mail task had already succeeded, so it stays so.
    assert namespace["email_users"].get_result(result.id).status == "SUCCESSFUL"


def test_every_name_jobs_exports_is_in_the_reference_and_a_how_to():
    import jobs

    reference = (ROOT / "docs" / "reference.md").read_text()
    how_tos = " ".join(
        (ROOT / "docs" / page).read_text()
        for page in (
            "quickstart.md",
            "workers.md",
            "scopes.md",
            "testing.md",
            "lifecycle.md",
            "batches-and-sequences.md",
        )
    )
    assert [n for n in jobs.__all__ if not re.search(rf"\b{n}\b", reference)] == []
    assert [n for n in jobs.__all__ if not re.search(rf"\b{n}\b", how_tos)] == []


def test_install_page_sets_up_sqlite_as_the_check_asks_and_its_example_runs(reader_project):
    from ledon.checks import RECOMMENDED_SQLITE_OPTIONS, sqlite_warnings

    namespace = run_page("docs/install.md", BASE_DIR=Path("/srv/site"))
    apps = namespace["INSTALLED_APPS"]
    assert {"jobs", "outbox", "sagas"} <= set(apps)
    [sqlite] = [b for b in python_blocks("docs/install.md") if "sqlite3" in b]
    databases = {"BASE_DIR": Path("/srv/site")}
    exec(compile(sqlite, "docs/install.md", "exec"), databases)
    assert databases["DATABASES"]["default"]["OPTIONS"] == RECOMMENDED_SQLITE_OPTIONS
    assert sqlite_warnings(databases["DATABASES"]) == []
    assert namespace["DATABASES"]["default"]["ENGINE"] == "django.db.backends.postgresql"
    Worker(burst=True, listen=False).run()
    done = JobScope("customer-7").get("invoice-1")
    assert (done.status, done.result_ref) == (JobStatus.SUCCEEDED, "invoices/1.pdf")
    text = (ROOT / "docs" / "install.md").read_text()
    for step in ("pip install django-ledon", '"django-ledon[postgres]"', "migrate", "run_jobs"):
        assert step in text


REPOSITORY_ONLY = re.compile(
    r"testproject/|tests/|scripts/|\.venv/|\bmake (demo|test|docs|bench|venv)\b|manage\.py demo"
)


@pytest.mark.parametrize(
    "page",
    sorted(
        p.name
        for p in (ROOT / "docs").glob("*.md")
        if p.name not in ("architecture.md", "benchmarks.md", "changelog.md")  # this repository
    ),
)
def test_pages_are_readable_without_this_repository(page):
    """No page sends a pip user to paths of this repository, except in a section that
    says it is about a clone of it."""
    text = re.sub(r"<!--.*?-->", "", (ROOT / "docs" / page).read_text(), flags=re.S)
    kept = []
    skipping_level = 0
    for line in text.splitlines():
        heading = re.match(r"(#+) ", line)
        if heading:
            level = len(heading.group(1))
            if skipping_level and level <= skipping_level:
                skipping_level = 0
            if "from a clone of this repository" in line.lower():
                skipping_level = level
        if not skipping_level:
            kept.append(line)
    assert [line for line in kept if REPOSITORY_ONLY.search(line)] == []


PUBLISHED = "https://django-ledon.readthedocs.io/en/latest/"


def test_the_readme_links_to_published_pages_that_exist():
    """The README is the package index's page, where a relative link leads nowhere:
    every link is absolute, and each one into the documentation names a page of
    docs/."""
    links = re.findall(r"\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    assert links
    assert [link for link in links if not link.startswith("https://")] == []
    pages = [link.removeprefix(PUBLISHED) for link in links if link.startswith(PUBLISHED)]
    assert [p for p in pages if not (ROOT / "docs" / p.replace(".html", ".md")).is_file()] == []


def test_the_readme_installs_every_extra_a_user_may_want():
    """Each optional-dependency group meant for users has its install line."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for_developers = {"demo", "test-run", "test", "bench", "docs", "brokers-test"}
    readme = (ROOT / "README.md").read_text()
    missing = [e for e in extras if e not in for_developers and f"django-ledon[{e}]" not in readme]
    assert missing == []
