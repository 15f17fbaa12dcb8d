"""Recovery, leases and crash safety with real processes: a saga runner killed with
SIGKILL between steps, inside a step, after a step's mark, or while compensating;
``recover_sagas`` finishes the instance, no completed step runs twice, and later steps
read what earlier ones wrote. Several runners never drive one instance together — on
SQLite and PostgreSQL. Crashes happen at named fault points (``FULFILMENT_FAULT``),
never after a sleep."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.utils import timezone

from sagas import SagaStatus, start_saga, store
from testproject.fulfilment.models import Payment, Reservation, StepRun
from tests.support.procs import ManageProcess, wait_until
from tests.support.sagas import FAST, instance, order, runs, started

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., ManageProcess]]:
    started_processes: list[ManageProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ManageProcess:
        proc = ManageProcess(tmp_path, *args, env={**FAST, **(env or {})})
        started_processes.append(proc)
        return proc

    yield start
    for proc in started_processes:
        proc.close()


def run_until_killed(spawn, data: dict, fault: str) -> None:
    victim = spawn(
        "run_test_saga", "fulfilment.order", "--data", json.dumps(data),
        env={"FULFILMENT_FAULT": fault},
    )  # fmt: skip
    assert victim.wait() == -signal.SIGKILL, victim.output


def recover(spawn, *args: str) -> ManageProcess:
    """Wait until the dead runner's lease expired, then recover in a new process."""
    row = instance()
    wait_until(
        lambda: store.claimable(timezone.now()) or instance(row.instance_id).leased_by == "",
        15,
        "the dead runner's lease to expire",
    )
    recovery = spawn("recover_sagas", "--burst", "-v", "2", *args)
    assert recovery.wait() == 0, recovery.output
    return recovery


def pids(instance_id, kind: str = "action") -> dict[str, int]:
    rows = StepRun.objects.filter(instance_id=instance_id, kind=kind)
    return dict(rows.values_list("step", "pid"))


def test_sigkill_between_steps_and_recovery_finishes_without_rerunning(spawn, tmp_path):
    journal = tmp_path / "journal"
    run_until_killed(spawn, order(journal=str(journal)), "sagas.step.committed/reserve@1:kill")
    row = instance()
    assert row.status == SagaStatus.RUNNING
    assert row.completed_steps == ["reserve"]
    assert row.leased_by  # the dead runner's lease, until it expires

    recovery = recover(spawn)

    row.refresh_from_db()
    assert row.status == SagaStatus.SUCCEEDED, recovery.output
    assert runs(row.instance_id) == ["reserve", "charge", "ship"]
    assert started(journal) == {"reserve": 1, "charge": 1, "ship": 1}
    # charge ran in the recovery process and read the reservation reserve stored.
    assert Payment.objects.get().reservation_id == Reservation.objects.get().pk
    assert Payment.objects.get().reservation_id == row.data["reservation_id"]
    by = pids(row.instance_id)
    assert by["charge"] == by["ship"] == recovery.pid != by["reserve"]
    assert "claimed saga fulfilment.order" in recovery.output


def test_a_step_that_kills_every_runner_is_failed_after_max_takeovers(spawn, tmp_path):
    """A poison step: every process that runs ``charge`` dies. After
    ``MAX_TAKEOVERS`` (here 1) takeovers without progress, the next runner counts the
    step as failed and compensates instead of dying once more."""
    journal = tmp_path / "journal"
    poison = {"FULFILMENT_FAULT": "sagas.step.started/charge@1:kill", "SAGAS_MAX_TAKEOVERS": "1"}
    run_until_killed(spawn, order(journal=str(journal)), poison["FULFILMENT_FAULT"])
    row = instance()
    for expected in ("killed", "compensates"):
        wait_until(
            lambda: bool(store.claimable(timezone.now())), 15, "the dead runner's lease to expire"
        )
        runner = spawn("recover_sagas", "--burst", "-v", "2", env=poison)
        if expected == "killed":
            assert runner.wait() == -signal.SIGKILL, runner.output
        else:
            assert runner.wait() == 0, runner.output
    row.refresh_from_db()
    assert row.status == SagaStatus.COMPENSATED, runner.output
    assert row.failed_step == "charge"
    assert "stopped 2 times" in row.error
    # Two runners died as charge started (before its body ran); the third did not run it.
    assert started(journal) == {"reserve": 1}
    assert runs(row.instance_id, "compensation") == ["reserve"]
    assert "step-kept-dying" in runner.output


def test_run_jobs_resumes_a_killed_saga_too_unless_told_not_to(spawn, tmp_path):
    """Recovery "inside the worker": after SIGKILL between two steps, a ``run_jobs``
    burst resumes the instance (and waits for it); with ``RECOVER_IN_WORKER`` off, a
    worker leaves it alone for ``recover_sagas``."""
    journal = tmp_path / "journal"
    run_until_killed(spawn, order(journal=str(journal)), "sagas.step.committed/reserve@1:kill")
    row = instance()
    wait_until(
        lambda: bool(store.claimable(timezone.now())), 15, "the dead runner's lease to expire"
    )

    off = spawn("run_jobs", "--burst", "-v", "2", env={"SAGAS_RECOVER_IN_WORKER": "0"})
    assert off.wait() == 0, off.output
    row.refresh_from_db()
    assert (row.status, row.completed_steps) == (SagaStatus.RUNNING, ["reserve"])

    worker = spawn("run_jobs", "--burst", "-v", "2")
    assert worker.wait() == 0, worker.output
    row.refresh_from_db()
    assert row.status == SagaStatus.SUCCEEDED, worker.output
    assert runs(row.instance_id) == ["reserve", "charge", "ship"]
    assert started(journal) == {"reserve": 1, "charge": 1, "ship": 1}
    by = pids(row.instance_id)
    assert by["charge"] == by["ship"] == worker.pid != by["reserve"]
    assert f"saga succeeded fulfilment.order {row.instance_id}" in worker.output


@pytest.mark.parametrize(
    "fault",
    ["fulfilment.charge.inside@1:kill", "sagas.step.marked/charge@1:kill"],
    ids=["inside-the-step", "after-the-mark-before-commit"],
)
def test_sigkill_inside_a_step_rolls_it_back_and_recovery_runs_it_once_more(spawn, tmp_path, fault):
    journal = tmp_path / "journal"
    run_until_killed(spawn, order(journal=str(journal)), fault)
    row = instance()
    assert row.completed_steps == ["reserve"]  # the killed step left nothing
    assert Payment.objects.count() == 0

    recover(spawn)

    row.refresh_from_db()
    assert row.status == SagaStatus.SUCCEEDED
    assert runs(row.instance_id) == ["reserve", "charge", "ship"]
    # charge started twice (killed, then recovered) and committed once; reserve, which
    # had completed, never ran again.
    assert started(journal) == {"reserve": 1, "charge": 2, "ship": 1}
    assert Payment.objects.count() == 1
    assert Payment.objects.get().reservation_id == row.data["reservation_id"]


def test_sigkill_while_compensating_and_recovery_finishes_the_compensation(spawn, tmp_path):
    journal = tmp_path / "journal"
    data = order(journal=str(journal), fail_at="ship")
    run_until_killed(spawn, data, "sagas.compensation.committed/charge@1:kill")
    row = instance()
    assert row.status == SagaStatus.COMPENSATING
    assert row.compensated_steps == ["charge"]

    recover(spawn)

    row.refresh_from_db()
    assert row.status == SagaStatus.COMPENSATED
    assert row.failed_step == "ship"
    assert row.compensated_steps == ["charge", "reserve"]
    assert runs(row.instance_id, "compensation") == ["charge", "reserve"]
    assert started(journal, "compensation") == {"charge": 1, "reserve": 1}
    assert Payment.objects.get().refunded
    assert Reservation.objects.get().released


def test_a_runner_renews_its_lease_and_a_second_runner_never_takes_over(spawn, tmp_path):
    hold = {"step": "charge", "file": str(tmp_path / "go"), "started_file": str(tmp_path / "in")}
    state = start_saga("fulfilment.order", data=order(hold=hold))
    # Renewed every 0.2 s: a renewal late by a few seconds (a busy machine) loses nothing.
    leases = {"SAGAS_LEASE_SECONDS": "5", "SAGAS_HEARTBEAT_SECONDS": "0.2"}
    first = spawn("recover_sagas", "--runner-id", "first", "-v", "2", env=leases)
    wait_until((tmp_path / "in").exists, 30, "charge to start in the first runner", first)
    claimed_until = instance(state.instance_id).leased_until
    second = spawn("recover_sagas", "--runner-id", "second", "-v", "2", env=leases)
    second.wait_for_output("started")

    # Two 5 s lease periods pass while the second runner polls every 0.1 s: renewals
    # keep the instance the first runner's.
    def renewed_well_past_the_first_lease() -> bool:
        until = instance(state.instance_id).leased_until
        return until is not None and (until - claimed_until).total_seconds() > 10

    wait_until(renewed_well_past_the_first_lease, 60, "several renewals", first)
    assert instance(state.instance_id).leased_by == "first"
    (tmp_path / "go").touch()
    wait_until(
        lambda: instance(state.instance_id).status == SagaStatus.SUCCEEDED, 30, "success", first
    )
    assert set(pids(state.instance_id).values()) == {first.pid}
    assert "claimed" not in second.output
    for runner in (first, second):
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == 0, runner.output


def test_sigterm_stops_a_runner_after_its_current_step_and_frees_the_instance(spawn, tmp_path):
    hold = {"step": "charge", "file": str(tmp_path / "go"), "started_file": str(tmp_path / "in")}
    state = start_saga("fulfilment.order", data=order(hold=hold))
    runner = spawn("recover_sagas", "--runner-id", "r", "-v", "2")
    wait_until((tmp_path / "in").exists, 30, "charge to start", runner)
    runner.proc.send_signal(signal.SIGTERM)
    runner.wait_for_output("stopping after the current step")
    (tmp_path / "go").touch()
    assert runner.wait() == 0, runner.output
    row = instance(state.instance_id)
    assert row.status == SagaStatus.RUNNING
    assert row.completed_steps == ["reserve", "charge"]
    assert (row.leased_by, row.leased_until) == ("", None)  # free for the next runner at once

    recover(spawn)
    assert instance(state.instance_id).status == SagaStatus.SUCCEEDED
    assert runs(state.instance_id) == ["reserve", "charge", "ship"]


def test_two_recovery_processes_racing_drive_each_instance_from_one_node(spawn, tmp_path):
    """30 instances, two runners released together (a barrier at start-up): every
    instance is claimed by exactly one of them and each step commits once, by the
    runner that claimed it."""
    ids = [start_saga("fulfilment.order", data=order(order_id=n)).instance_id for n in range(30)]
    meet = tmp_path / "meet"
    meet.mkdir()
    env = {
        "FULFILMENT_FAULT": f"sagas.runner.started@1:barrier:{meet}:2",
        # Leases long enough that a runner stalled by a busy machine is never robbed.
        "SAGAS_LEASE_SECONDS": "30",
    }
    runners = [spawn("recover_sagas", "--burst", "-v", "2", env=env) for _ in range(2)]
    for runner in runners:
        assert runner.wait(120) == 0, runner.output

    claimed = [
        int(re.search(r"stopped: claimed (\d+)", r.output).group(1))  # type: ignore[union-attr]
        for r in runners
    ]
    assert sum(claimed) == 30, [r.output for r in runners]
    for instance_id in ids:
        row = instance(instance_id)
        assert row.status == SagaStatus.SUCCEEDED
        assert runs(instance_id) == ["reserve", "charge", "ship"]
        assert len(set(pids(instance_id).values())) == 1
    assert {p for i in ids for p in pids(i).values()} <= {r.pid for r in runners}


def test_an_instance_whose_saga_is_not_registered_is_reported_and_left_untouched(spawn):
    state = store.create(
        "retired-saga",
        ["one", "two"],
        {"n": 1},
        idempotency_key=None,
        owner="",
        lease_seconds=1,
    )
    recovery = recover(spawn)
    assert "untouched saga retired-saga" in recovery.output
    assert "no saga is registered as 'retired-saga'" in recovery.output
    assert "left untouched 1" in recovery.output
    row = instance(state.instance_id)
    assert (row.status, row.version, row.leased_by, row.completed_steps) == (
        SagaStatus.RUNNING,
        state.version,
        "",
        [],
    )
