"""Batches and sequences in the admin: a batch's page with its counts, its jobs and
its then; a halted sequence, by which job and why; a job's links to both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from jobs import JobSubmission, execution, submit_batch, submit_job
from jobs.models import Batch, Job, Sequence

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-ordering-admin"


def page(client: Client, name: str, pk: int) -> str:
    response = client.get(reverse(name, args=[pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_a_batch_page_shows_its_counts_jobs_and_then(
    admin_client: Client, handler: Callable[..., Any]
) -> None:
    handler("imports.done")(lambda ctx: None)
    jobs = [(f"row-{n}", JobSubmission.create("imports.row", {"n": n})) for n in range(3)]
    submit_batch(SCOPE, "import-7", jobs, then=JobSubmission.create("imports.done"))
    batch = Batch.objects.get()
    open_page = page(admin_client, "admin:jobs_batch_change", batch.pk)
    assert "submitted as &#x27;import-7:then&#x27; when the last job ends" in open_page
    assert "batch_id=import-7" in open_page
    for claim in execution.claim_due("w1", limit=5):
        execution.complete(claim.token)
    done_page = page(admin_client, "admin:jobs_batch_change", batch.pk)
    then = Job.objects.get(job_id="import-7:then")
    assert reverse("admin:jobs_job_change", args=[then.pk]) in done_page
    assert ">done<" in done_page
    listed = admin_client.get(reverse("admin:jobs_batch_changelist")).content.decode()
    assert "import-7" in listed
    # From a job to its batch, and from there to the batch's jobs.
    member = Job.objects.get(job_id="row-1")
    job_page = page(admin_client, "admin:jobs_job_change", member.pk)
    assert reverse("admin:jobs_batch_change", args=[batch.pk]) in job_page
    filtered = admin_client.get(
        reverse("admin:jobs_job_changelist"),
        {"scope_hash": member.scope_hash, "batch_id": "import-7"},
    ).content.decode()
    assert "row-0" in filtered
    assert "import-7:then" not in filtered


def test_a_halted_sequence_says_by_which_job_and_why(
    admin_client: Client, handler: Callable[..., Any]
) -> None:
    handler("ledger.post", sequence_halts_on_failure=True)(lambda ctx: None)
    for n in range(2):
        submit_job(SCOPE, f"p{n}", JobSubmission.create("ledger.post", sequence_key="acct-1"))
    held = Job.objects.get(job_id="p1")
    assert "held: it waits for an earlier job of its sequence" in page(
        admin_client, "admin:jobs_job_change", held.pk
    )
    (claim,) = execution.claim_due("w1", limit=5)
    execution.fail(claim.token, "the ledger is closed")
    sequence = Sequence.objects.get()
    text = page(admin_client, "admin:jobs_sequence_change", sequence.pk)
    assert "job &#x27;p0&#x27; failed" in text
    assert "the ledger is closed" in text
    assert "retry or cancel that job to go on" in text
    halted = admin_client.get(reverse("admin:jobs_sequence_changelist"), {"halted": "yes"})
    assert "acct-1" in halted.content.decode()
    going_on = admin_client.get(reverse("admin:jobs_sequence_changelist"), {"halted": "no"})
    assert "acct-1" not in going_on.content.decode()


def test_the_metrics_count_batches_and_halted_sequences(handler: Callable[..., Any]) -> None:
    from jobs.observability.metrics import gauges

    def samples() -> dict[tuple[str, tuple[str, ...]], float]:
        return {
            (family.name, tuple(sample.labels.values())): sample.value
            for family in gauges()
            for sample in family.samples
            if family.name in ("ledon_jobs_batches", "ledon_jobs_sequences_halted")
        }

    handler("ledger.post", sequence_halts_on_failure=True)(lambda ctx: None)
    submit_batch(SCOPE, "b1", [("r1", JobSubmission.create("imports.row"))])
    submit_batch(SCOPE, "b2", [("r2", JobSubmission.create("ledger.post", sequence_key="k"))])
    assert samples() == {
        ("ledon_jobs_batches", ("done",)): 0,
        ("ledon_jobs_batches", ("open",)): 2,
        ("ledon_jobs_sequences_halted", ()): 0,
    }
    for claim in execution.claim_due("w1", limit=5):
        if claim.job_id == "r2":
            execution.fail(claim.token, "closed")
        else:
            execution.complete(claim.token)
    assert samples() == {
        ("ledon_jobs_batches", ("done",)): 2,
        ("ledon_jobs_batches", ("open",)): 0,
        ("ledon_jobs_sequences_halted", ()): 1,
    }
