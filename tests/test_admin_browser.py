"""The admin in a real browser (headless Chromium): log in, open the jobs, cancel one,
retry one. Screenshots of each step are kept in ``test-artifacts/``.

Runs when a Chromium is available (``CHROMIUM`` or Debian's ``/usr/bin/chromium``);
with ``CI=true`` a missing browser is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.db import connections

from jobs import JobScope, JobStatus, JobSubmission, execution, submit_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "admin-browser"
SCOPE = "browser"


def _chromium() -> str:
    for candidate in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if candidate and Path(candidate).exists():
            return candidate
    found = shutil.which("chromium")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("no Chromium for the browser test (scripts/ensure-chromium.sh installs it)")
    pytest.skip("no Chromium installed")


@pytest.fixture
def page(live_server, admin_user, request):
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop in this thread; the ORM calls made by
    # the test itself are plain synchronous calls.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=_chromium(),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(base_url=live_server.url)
        yield page
        browser.close()
        # The test's own ORM calls ran inside Playwright's event loop, whose context
        # has connections of its own: close them here, or the session keeps one open
        # to the test database until the end (and cannot drop it).
        connections.close_all()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def _shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_admin_login_list_cancel_and_retry_in_a_browser(page):
    submit_job(SCOPE, "to-retry", JobSubmission.create("demo.flaky", {}, max_attempts=2))
    (claim,) = execution.claim_due("browser-worker", limit=5)
    execution.fail(claim.token, "RuntimeError: simulated outage")
    submit_job(SCOPE, "to-cancel", JobSubmission.create("demo.report", {"month": "2026-10"}))

    page.goto("/admin/login/?next=/admin/jobs/job/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "password")
    _shot(page, "01-login")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    _shot(page, "02-jobs")
    assert page.locator("#result_list").get_by_text("to-cancel").count() == 1

    page.locator("tr", has_text="to-cancel").locator("input.action-select").check()
    page.select_option("select[name=action]", "cancel_jobs")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    _shot(page, "03-cancelled")
    assert "cancelled" in page.locator(".messagelist").inner_text()
    assert JobScope(SCOPE).get("to-cancel").status == JobStatus.CANCELLED

    page.locator("tr", has_text="to-retry").locator("input.action-select").check()
    page.select_option("select[name=action]", "retry_jobs")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    _shot(page, "04-retried")
    assert "re-queued" in page.locator(".messagelist").inner_text()
    assert JobScope(SCOPE).get("to-retry").status == JobStatus.QUEUED

    page.locator("#result_list").get_by_text("to-retry").click()
    page.wait_for_selector("pre")
    _shot(page, "05-job-page")
    assert "simulated outage" in page.content()


def test_dashboard_shows_a_known_workload_and_reloads_itself(page, live_server, settings):
    """The dashboard's numbers for a known workload, nothing requested from
    another site, and a reload by itself; its screenshot is kept."""
    from tests.support.dashboard import make_workload

    make_workload(settings)
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    # First with reloading off (?refresh=0), so that no reload replaces the page while
    # its numbers are read; then with a reload every 2 s.
    page.goto("/admin/login/?next=/admin/jobs/dashboard/%3Frefresh%3D0")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_selector("#queues")
    page.set_viewport_size({"width": 1400, "height": 1000})
    _shot(page, "10-dashboard")

    row = page.locator('#queues tr[data-queue="dash-a"]')
    assert row.locator(".queued").inner_text() == "2"
    assert row.locator(".running").inner_text() == "1"
    assert "5 min" in row.locator(".oldest").inner_text()
    chart = page.locator('#throughput figure[data-queue="dash-a"]')
    assert chart.locator(".succeeded").inner_text() == "3"
    assert chart.locator(".failed").inner_text() == "1"
    # The bars add up to the workload (one minute's bar, or two across a minute's end).
    for bar, count in (("bar-ok", 3), ("bar-failed", 1)):
        titles = chart.locator(f"svg rect.{bar} title").all_text_contents()
        assert 1 <= len(titles) <= 2
        assert sum(int(title.split()[0]) for title in titles) == count
    assert "waiting-long" in page.locator("#oldest-job").inner_text()
    assert page.locator("#workers h2").inner_text() == "Workers: 1 live, 1 silent"
    outbox = page.locator('section[data-panel="Outbox"]')
    assert outbox.locator('[data-fact="pending"] strong').inner_text() == "2"
    assert outbox.locator('[data-fact="parked"] strong').inner_text() == "1"
    sagas = page.locator('section[data-panel="Sagas needing attention"]')
    assert sagas.locator('[data-fact="needing attention"] strong').inner_text() == "1"

    # It reloads by itself (every 2 s here), reading the database again.
    page.goto("/admin/jobs/dashboard/?refresh=2")
    page.wait_for_selector("#queues")
    before = page.locator("#dashboard-time").inner_text()
    submit_job("dash", "arrived", JobSubmission.create("demo.report", {}, queue="dash-a"))
    page.wait_for_function(
        "document.querySelector('#queues tr[data-queue=\"dash-a\"] .queued').textContent === '3'",
        timeout=15_000,
    )
    assert page.locator("#dashboard-time").inner_text() != before
    assert [url for url in requests if not url.startswith(live_server.url)] == []


def test_a_workflow_run_page_draws_the_run_in_a_browser(page):
    """The shop's basket run, waiting for its payment, then finished: the run page
    draws each checkpoint as a box in order, the map with its items' bar."""
    from decimal import Decimal

    from testproject.shop.models import Product
    from testproject.shop.services import pay_basket, place_basket
    from workflows.models import WorkflowRun
    from workflows.testing import run_workflows_inline

    Product.objects.create(sku="MUG-1", name="Mug", price=Decimal("12.50"), stock=10)
    Product.objects.create(sku="TEE-1", name="Tee", price=Decimal("25.00"), stock=5)
    basket = place_basket(
        email="cy@example.com",
        lines=[{"sku": "MUG-1", "quantity": 2}, {"sku": "TEE-1", "quantity": 1}],
    )
    run_workflows_inline()
    run = WorkflowRun.objects.get(run_id=basket.number)

    page.goto(f"/admin/login/?next=/admin/workflows/workflowrun/{run.pk}/change/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_selector("svg .wf-node")
    keys = page.eval_on_selector_all("svg .wf-node", "nodes => nodes.map(n => n.dataset.key)")
    assert keys == ["reserve", "price", "total", "paid"]
    assert page.locator("svg .wf-waiting").count() == 1
    # The run's picture, not the admin's own icons (the theme toggle's come first).
    assert "waiting: signal paid" in page.text_content("svg.wf-picture")
    _shot(page, "workflow-run-waiting")

    pay_basket(basket.number, card="4242")
    run_workflows_inline()
    page.reload()
    page.wait_for_selector("svg .wf-node[data-key=ship]")
    assert page.locator("svg .wf-succeeded").count() == 5
    # The child's box links to the child run's own page.
    page.click("svg .wf-node[data-key=ship] a")
    page.wait_for_selector("svg .wf-node[data-key=label]")
    _shot(page, "workflow-run-finished-child")


def test_a_failed_runs_picture_keeps_its_labels_inside_in_a_browser(page):
    """Measured by the browser: a long failed step's end label stays inside the
    drawing (it was cut at its right edge), the box's key does not run into its
    state, and the legend says what the bars mean."""
    from workflows import start_workflow, workflow
    from workflows.models import WorkflowRun
    from workflows.registry import unregister_workflow
    from workflows.testing import run_workflow

    key = "charge-the-customers-card-for-the-whole-basket-including-shipping"

    def declined() -> None:
        raise RuntimeError("card declined")

    @workflow("browser.long_key", version=1)
    def long_key(wf):
        wf.step(key, declined)

    try:
        start_workflow(SCOPE, "long-key", "browser.long_key")
        assert run_workflow(SCOPE, "long-key").status == "failed"
    finally:
        unregister_workflow("browser.long_key", 1)
    run = WorkflowRun.objects.get(run_id="long-key")

    page.goto(f"/admin/login/?next=/admin/workflows/workflowrun/{run.pk}/change/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_selector("svg .wf-node")
    _shot(page, "workflow-run-long-key")
    boxes = page.eval_on_selector(
        "svg.wf-picture",
        """svg => {
            const box = el => {
                const b = el.getBBox();
                return [b.x, b.y, b.x + b.width, b.y + b.height];
            };
            const node = svg.querySelector('.wf-node');
            const texts = node.querySelectorAll('text');
            return {
                width: svg.viewBox.baseVal.width,
                height: svg.viewBox.baseVal.height,
                end: box(svg.querySelector('.wf-end-label')),
                legend: box(svg.querySelector('.wf-legend')),
                key: box(texts[0]),
                state: box(texts[1]),
            };
        }""",
    )
    assert boxes["end"][2] <= boxes["width"], boxes
    assert boxes["legend"][2] <= boxes["width"], boxes
    assert boxes["legend"][3] <= boxes["height"], boxes
    assert boxes["end"][3] < boxes["legend"][1], boxes
    assert boxes["key"][2] < boxes["state"][0], boxes
    # Wrapped at spaces, whole: every character of the label is drawn.
    assert f"failedat'{key}'" in page.text_content("svg .wf-end-label").replace(" ", "")
    assert "when each checkpoint ran" in page.text_content("svg .wf-legend")
