"""The workflows admin: a run's page draws its checkpoints in order (a map as one box
with counts by status, waits with what and until when, children linked), input,
output and errors pretty-printed and escaped; cancel and resume are actions offered
only to users who may steer runs; the dashboard counts runs by status and wait."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from workflows.models import WorkflowItem, WorkflowRun, WorkflowStep
from workflows.observability.reads import dashboard_panels, waiting_reason
from workflows.picture import BOLD_CHAR, GEOMETRY, MONO_CHAR, duration, layout
from workflows.types import (
    ItemCounts,
    RunSnapshot,
    RunStatus,
    StepKind,
    StepSnapshot,
    StepStatus,
    Wait,
    WaitKind,
)

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE_HASH = "a" * 64
CHANGELIST = "admin:workflows_workflowrun_changelist"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _run(run_id: str, status: RunStatus = RunStatus.WAITING, **fields: Any) -> WorkflowRun:
    now = timezone.now()
    values: dict[str, Any] = {
        "scope_hash": SCOPE_HASH,
        "run_id": run_id,
        "name": "orders.fulfil",
        "version": 1,
        "input_json": json.dumps({"order_id": 7, "note": "<script>alert(1)</script>"}),
        "status": status,
        "created_at": now - timedelta(minutes=5),
        "updated_at": now,
    }
    values.update(fields)
    return WorkflowRun.objects.create(**values)


def _step(run: WorkflowRun, key: str, kind: StepKind, status: StepStatus, **fields: Any):
    values: dict[str, Any] = {
        "run": run,
        "key": key,
        "kind": kind,
        "status": status,
        "started_at": run.created_at + timedelta(seconds=len(key)),
    }
    values.update(fields)
    return WorkflowStep.objects.create(**values)


@pytest.fixture
def order_run() -> WorkflowRun:
    """A run that reserved stock, priced 5 lines (3 done, 1 failed, 1 running), slept,
    started a child and now waits for a payment signal."""
    run = _run("order-7", wait_kind="signal", wait_key="paid")
    _step(
        run,
        "reserve",
        StepKind.STEP,
        StepStatus.SUCCEEDED,
        attempts=2,
        result_json=json.dumps({"reserved": True}),
        finished_at=run.created_at + timedelta(seconds=9),
    )
    priced = _step(run, "price", StepKind.MAP, StepStatus.RUNNING, item_count=5, attempts=0)
    for index, status in enumerate(["succeeded"] * 3 + ["failed", "running"]):
        WorkflowItem.objects.create(
            step=priced,
            index=index,
            status=status,
            args_json="[]",
            job_id=f"order-7/price/{index}",
        )
    _step(
        run,
        "cool-off",
        StepKind.SLEEP,
        StepStatus.SUCCEEDED,
        wake_at=T0,
        finished_at=run.created_at + timedelta(seconds=60),
    )
    child = _run("order-7/ship", RunStatus.SUCCEEDED, parent=run, parent_key="ship")
    _step(
        run,
        "ship",
        StepKind.CHILD,
        StepStatus.SUCCEEDED,
        child=child,
        finished_at=run.created_at + timedelta(seconds=90),
    )
    _step(run, "paid", StepKind.SIGNAL, StepStatus.WAITING)
    return run


def test_the_run_page_draws_every_checkpoint_in_order(order_run, admin_client):
    page = admin_client.get(reverse("admin:workflows_workflowrun_change", args=[order_run.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "<svg" in html
    assert "</svg>" in html
    positions = [
        html.index(f'data-key="{key}"') for key in ("reserve", "price", "cool-off", "ship", "paid")
    ]
    assert positions == sorted(positions)
    # The map is one box with its items counted by status.
    assert "4 of 5 items ended, 3 succeeded, 1 failed, 1 running" in html
    # Waits say what they wait for.
    assert "waiting for signal &#x27;paid&#x27;" in html
    assert "waiting: signal paid" in html
    # Tries of a step that was retried.
    assert "succeeded, 2 tries" in html
    # The child box links to the child run's page.
    child = WorkflowRun.objects.get(run_id="order-7/ship")
    assert reverse("admin:workflows_workflowrun_change", args=[child.pk]) in html
    # Input pretty-printed and escaped, never run as markup.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)</script>" not in html
    assert "&quot;order_id&quot;: 7" in html


def test_a_child_page_links_back_to_its_parent(order_run, admin_client):
    child = WorkflowRun.objects.get(run_id="order-7/ship")
    html = admin_client.get(reverse("admin:workflows_workflowrun_change", args=[child.pk])).content
    assert reverse("admin:workflows_workflowrun_change", args=[order_run.pk]).encode() in html


def test_a_failed_run_shows_its_error_and_failed_step(admin_client):
    run = _run(
        "order-8",
        RunStatus.FAILED,
        failed_step="charge",
        error="StepFailed: step 'charge' failed: CardDeclined: <b>no</b>",
        finished_at=timezone.now(),
    )
    _step(
        run,
        "charge",
        StepKind.STEP,
        StepStatus.FAILED,
        attempts=3,
        error_type="CardDeclined",
        error="<b>no</b>",
        finished_at=timezone.now(),
    )
    html = admin_client.get(
        reverse("admin:workflows_workflowrun_change", args=[run.pk])
    ).content.decode()
    assert "failed at &#x27;charge&#x27;" in html
    assert "CardDeclined: &lt;b&gt;no&lt;/b&gt;" in html
    assert "<b>no</b>" not in html


def test_the_list_filters_by_name_version_and_status_and_searches_run_ids(order_run, admin_client):
    _run("other", RunStatus.SUCCEEDED, name="billing.close", version=2)
    url = reverse(CHANGELIST)
    assert "order-7" in admin_client.get(url, {"status__exact": "waiting"}).content.decode()
    only_billing = admin_client.get(url, {"name": "billing.close"}).content.decode()
    assert "other" in only_billing
    assert "order-7/ship" not in only_billing
    found = admin_client.get(url, {"q": "order-7/ship"}).content.decode()
    assert "order-7/ship" in found
    assert ">other<" not in found
    assert admin_client.get(url, {"version": "2"}).status_code == 200


def _staff(*codenames: str) -> Client:
    user = User.objects.create_user("viewer-" + "-".join(codenames), password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def _act(client: Client, action: str, *runs: WorkflowRun) -> list[str]:
    response = client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [run.pk for run in runs]},
        follow=True,
    )
    return [str(message) for message in response.context["messages"]]


def test_staff_who_may_only_view_see_the_picture_and_no_actions(order_run):
    viewer = _staff("view_workflowrun")
    page = viewer.get(reverse("admin:workflows_workflowrun_change", args=[order_run.pk]))
    assert page.status_code == 200
    assert b"<svg" in page.content
    listing = viewer.get(reverse(CHANGELIST)).content.decode()
    assert "cancel_runs" not in listing
    assert "resume_runs" not in listing
    viewer.post(reverse(CHANGELIST), {"action": "cancel_runs", "_selected_action": [order_run.pk]})
    order_run.refresh_from_db()
    assert order_run.status == RunStatus.WAITING


def test_cancel_ends_a_waiting_run_and_refuses_finished_ones():
    steer = _staff("view_workflowrun", "change_workflowrun")
    assert "cancel_runs" in steer.get(reverse(CHANGELIST)).content.decode()
    waiting = _run("order-10", wait_kind="signal", wait_key="paid")
    _step(waiting, "paid", StepKind.SIGNAL, StepStatus.WAITING)
    done = _run("done", RunStatus.SUCCEEDED, finished_at=timezone.now())
    messages = _act(steer, "cancel_runs", waiting, done)
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.CANCELLED
    assert messages[0] == "1 cancelled, 1 refused."
    assert messages[1] == "Run done: it had finished already."
    done.refresh_from_db()
    assert done.status == RunStatus.SUCCEEDED


def test_resume_takes_a_failed_run_back_and_refuses_others(order_run):
    steer = _staff("view_workflowrun", "change_workflowrun")
    failed = _run(
        "order-9", RunStatus.FAILED, failed_step="charge", error="boom", finished_at=timezone.now()
    )
    messages = _act(steer, "resume_runs", failed, order_run)
    failed.refresh_from_db()
    assert failed.status in (RunStatus.WAITING, RunStatus.RUNNING)
    assert failed.finished_at is None
    assert messages[0] == "1 resumed, 1 refused."
    assert "not failed" in messages[1]


def test_the_dashboard_counts_runs_by_status_and_what_they_wait_for(order_run, admin_client):
    _run("a", wait_kind="signal", wait_key="approved")
    _run("b", wait_kind="items", wait_key="price")
    _run("c", wait_kind="timer", wait_key="nap", wake_at=T0)
    _run("d", RunStatus.FAILED, failed_step="charge", finished_at=timezone.now())
    (panel,) = dashboard_panels(timezone.now())
    facts = dict(panel.facts)
    assert facts["waiting"] == "4"
    assert facts["failed"] == "1"
    assert facts["waiting for signal"] == "2"
    assert facts["waiting for items"] == "1"
    assert facts["waiting for timer"] == "1"
    assert panel.attention
    assert [cell.text for cell in panel.rows[0]][:3] == ["orders.fulfil", "d", "charge"]
    page = admin_client.get(reverse("admin:jobs_dashboard_changelist"))
    assert "Workflow runs" in page.content.decode()


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        (WaitKind.SIGNAL, "signal"),
        (WaitKind.ITEMS, "items"),
        (WaitKind.ADVANCE, "a new advance"),
        ("", "its next advance"),
    ],
)
def test_waiting_reasons(kind, reason):
    assert waiting_reason(kind) == reason


def _snapshot(status: RunStatus, steps: tuple[StepSnapshot, ...], **fields: Any) -> RunSnapshot:
    values: dict[str, Any] = {
        "scope_hash": SCOPE_HASH,
        "run_id": "r",
        "name": "n",
        "version": 1,
        "status": status,
        "input": None,
        "output": None,
        "error": "",
        "failed_step": "",
        "waiting_for": "",
        "created_at": T0,
        "finished_at": None,
        "steps": steps,
    }
    values.update(fields)
    return RunSnapshot(**values)


def _step_snapshot(
    key: str,
    status: StepStatus = StepStatus.SUCCEEDED,
    *,
    kind: StepKind = StepKind.STEP,
    start: float = 0,
    end: float | None = 1,
    **fields: Any,
) -> StepSnapshot:
    """A checkpoint's snapshot that ran from ``start`` to ``end`` seconds (None: it has
    not ended) after ``T0``."""
    values: dict[str, Any] = {
        "attempts": 1,
        "result": None,
        "error": "",
        "started_at": T0 + timedelta(seconds=start),
        "finished_at": None if end is None else T0 + timedelta(seconds=end),
    }
    values.update(fields)
    return StepSnapshot(key=key, kind=kind, status=status, **values)


def test_layout_places_each_checkpoint_on_the_runs_time_line():
    steps = (
        _step_snapshot("a", end=10, result=1),
        _step_snapshot(
            "b",
            StepStatus.RUNNING,
            kind=StepKind.MAP,
            start=10,
            end=None,
            attempts=0,
            items=ItemCounts(total=4, succeeded=1, failed=1, running=1),
        ),
    )
    run = _snapshot(
        RunStatus.WAITING,
        steps,
        waiting_for="3 of 4 items",
        wait=Wait(kind=WaitKind.ITEMS, key="b"),
    )
    picture = layout(run, now=T0 + timedelta(seconds=20))
    first, second = picture.nodes
    assert first.y < second.y < picture.end_y < picture.height
    # The first step took the first half of the run's 20 s, the map the second.
    assert first.when is not None
    assert second.when is not None
    assert first.when.width == pytest.approx(second.when.width, rel=0.01)
    assert first.when.x < second.when.x
    assert [segment.label for segment in second.items] == [
        "1 succeeded",
        "1 failed",
        "1 running",
        "1 pending",
    ]
    assert sum(segment.width for segment in second.items) == pytest.approx(636)
    assert picture.end_label == "waiting: 3 of 4 items"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.25, "250 ms"),
        (12.4, "12.4 s"),
        (185, "3 min 5 s"),
        (7800, "2 h 10 min"),
        (3 * 86400 + 4 * 3600, "3 d 4 h"),
    ],
)
def test_durations_read_as_a_person_would_say_them(seconds, text):
    assert duration(seconds) == text


LONG_KEY = "charge-the-customers-card-for-the-whole-basket-including-shipping"


@pytest.mark.parametrize(
    ("status", "fields"),
    [
        (RunStatus.FAILED, {"failed_step": LONG_KEY, "finished_at": T0 + timedelta(hours=1)}),
        (
            RunStatus.WAITING,
            {
                "wait": Wait(
                    kind=WaitKind.SIGNAL, key="payment-confirmed-by-the-bank-of-" + "x" * 90
                )
            },
        ),
    ],
)
def test_the_end_label_is_drawn_whole_within_the_picture(status, fields):
    """A long failed step or wait ran past the drawing's right edge and was cut."""
    step = _step_snapshot(
        LONG_KEY, StepStatus.FAILED, end=70, attempts=3, error="RuntimeError: card declined"
    )
    picture = layout(_snapshot(status, (step,), **fields), now=T0 + timedelta(hours=2))
    assert len(picture.end_lines) > 1
    # Every character is drawn (the wrapping drops only the spaces it breaks at).
    drawn = "".join(line for _y, line in picture.end_lines)
    assert drawn.replace(" ", "") == picture.end_label.replace(" ", "")
    for _y, line in picture.end_lines:
        assert GEOMETRY["label_x"] + BOLD_CHAR * len(line) <= picture.width
    baselines = [y for y, _line in picture.end_lines]
    assert baselines == sorted(baselines)
    assert baselines[-1] < picture.legend.y < picture.height
    # The box's key makes room for its state; the whole key is its tooltip.
    (node,) = picture.nodes
    assert node.key == LONG_KEY
    assert node.key_label.endswith("…")
    assert LONG_KEY.startswith(node.key_label[:-1])
    first_line = len(node.kind) * BOLD_CHAR + len(node.key_label) * MONO_CHAR
    assert GEOMETRY["text_x"] + first_line <= GEOMETRY["state_x"] - len(node.state) * BOLD_CHAR


def test_a_legend_says_what_the_time_line_and_the_items_bar_mean(order_run, admin_client):
    html = admin_client.get(
        reverse("admin:workflows_workflowrun_change", args=[order_run.pk])
    ).content.decode()
    legend = html.split('<g class="wf-legend"', 1)[1].split("</g>", 1)[0]
    assert "when each checkpoint ran, on the run&#x27;s time line from its start to now" in legend
    assert "a map&#x27;s items:" in legend
    for name in ("succeeded", "failed", "running", "cancelled", "pending"):
        assert f">{name}</text>" in legend
    # The map's box draws both bars: its items' and its place on the time line.
    price = html.split('data-key="price"', 1)[1].split("</g>", 1)[0]
    assert 'class="wf-items"' in price
    assert 'class="wf-when"' in price


def test_a_run_without_a_map_has_no_items_legend():
    step = _step_snapshot("a", result=1)
    finished = T0 + timedelta(seconds=2)
    picture = layout(_snapshot(RunStatus.SUCCEEDED, (step,), finished_at=finished), now=finished)
    assert picture.legend.items == []
    assert picture.legend.time_line.endswith("from its start to its end")
    assert picture.end_lines == [(picture.end_y + 4, "succeeded · 2.0 s in all")]


@pytest.mark.parametrize(
    ("wait", "label"),
    [
        (Wait(kind=WaitKind.SIGNAL, key="paid"), "waiting: signal paid"),
        (
            Wait(kind=WaitKind.TIMER, key="nap", until=T0 + timedelta(hours=1)),
            "waiting: timer until 2026-12-01 10:00:00 UTC",
        ),
        (
            Wait(kind=WaitKind.RETRY, key="reserve", until=T0 + timedelta(seconds=30)),
            "waiting: retry of reserve at 2026-12-01 09:00:30 UTC",
        ),
        (Wait(kind=WaitKind.CHILD, key="ship"), "waiting: child ship"),
        (Wait(kind=WaitKind.START), "waiting: start"),
    ],
)
def test_the_end_label_says_what_the_run_waits_for_from_its_data(wait, label):
    """The label is built from the wait's kind, key and time, never from a text."""
    run = _snapshot(RunStatus.WAITING, (), waiting_for="not read", wait=wait)
    assert layout(run, now=T0 + timedelta(minutes=1)).end_label == label
