"""Persistence and leases at the store: every transition is one guarded update (version,
state, lease holder); concurrent claims and saves have exactly one winner — on SQLite
and PostgreSQL with real concurrent connections."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from sagas import (
    SagaConcurrencyError,
    SagaStatus,
    compensate_saga,
    resume_saga,
    run_saga,
    start_saga,
    store,
)
from sagas.conf import sagas_settings
from sagas.driver import Driver
from sagas.exceptions import (
    InvalidTransition,
    SagaLeased,
    SagaLeaseLost,
    SagasConfigurationError,
    UnknownSaga,
)
from sagas.registry import get_saga
from sagas.runner import SagaRunner
from sagas.testing import drive_pending_sagas, temporary_saga
from testproject.fulfilment.models import Payment, StepRun
from tests.support.procs import wait_until
from tests.support.sagas import ORDER, instance, order, runs, started

pytestmark = pytest.mark.django_db(transaction=True)

LATER = timedelta(hours=1)


def started_instance(name: str = "fulfilment.order", **data):
    return start_saga(name, data=order(**data))


def test_create_records_the_plan_and_a_key_is_unique_per_saga():
    first = store.create(
        "fulfilment.order",
        ["reserve", "charge", "ship"],
        dict(ORDER),
        idempotency_key="k",
        owner="me",
        lease_seconds=30,
    )
    again = store.create(
        "fulfilment.order", ["x"], dict(ORDER), idempotency_key="k", owner="other", lease_seconds=30
    )
    assert first.created
    assert not again.created
    assert again.instance_id == first.instance_id
    assert again.steps == ("reserve", "charge", "ship")
    assert again.leased_by == "me"
    assert first.leased_until is not None
    # Runs without a key never collide.
    a = store.create("fulfilment.order", ["a"], {}, idempotency_key=None, owner="", lease_seconds=1)
    b = store.create("fulfilment.order", ["a"], {}, idempotency_key=None, owner="", lease_seconds=1)
    assert a.instance_id != b.instance_id
    assert a.leased_until is None


def test_exactly_one_of_several_concurrent_claims_wins(concurrently):
    state = started_instance()
    outcomes = concurrently(
        *[(lambda n=n: store.claim(state, f"runner-{n}", lease_seconds=30)) for n in range(4)]
    )
    assert [o.error for o in outcomes] == [None] * 4
    winners = [o.value for o in outcomes if o.value is not None]
    assert len(winners) == 1
    row = instance(state.instance_id)
    assert row.leased_by == winners[0].leased_by
    assert row.version == state.version + 1


def test_a_live_lease_cannot_be_claimed_and_an_expired_one_can():
    state = started_instance()
    mine = store.claim(state, "first", lease_seconds=30)
    assert mine is not None
    assert store.claim(mine, "second", lease_seconds=30) is None
    assert store.claimable(timezone.now()) == []
    later = timezone.now() + LATER
    assert [s.instance_id for s in store.claimable(later)] == [state.instance_id]
    taken = store.claim(mine, "second", lease_seconds=30, now=later)
    assert taken is not None
    assert taken.leased_by == "second"


def test_renewal_extends_the_lease_without_moving_the_version():
    mine = store.claim(started_instance(), "me", lease_seconds=30)
    assert mine is not None
    assert mine.leased_until is not None
    assert store.renew(mine.instance_id, "me", lease_seconds=600)
    row = instance(mine.instance_id)
    assert row.version == mine.version
    assert row.leased_until > mine.leased_until
    assert not store.renew(mine.instance_id, "someone-else", lease_seconds=600)


def test_a_transition_from_a_stale_version_or_by_another_holder_changes_nothing():
    mine = store.claim(started_instance(), "me", lease_seconds=30)
    assert mine is not None
    version = store.complete_step(mine, "me", "reserve", {"reservation_id": 1})
    before = instance(mine.instance_id)
    assert before.version == version == mine.version + 1

    with pytest.raises(SagaConcurrencyError, match=r"version .* is stale") as stale:
        store.complete_step(mine, "me", "reserve", {"x": 1})  # read before the first mark
    assert not isinstance(stale.value, SagaLeaseLost)
    current = store.require(mine.instance_id)
    with pytest.raises(SagaLeaseLost, match="leased by 'me'"):
        store.complete_step(current, "intruder", "charge", {})
    with pytest.raises(SagaConcurrencyError):
        store.record_compensation(current, "me", "reserve", {})  # not compensating
    after = instance(mine.instance_id)
    assert (after.version, after.completed_steps, after.data) == (
        before.version,
        ["reserve"],
        {"reservation_id": 1},
    )


def test_the_whole_lifecycle_through_the_store():
    state = store.claim(started_instance(), "me", lease_seconds=30)
    assert state is not None
    store.complete_step(state, "me", "reserve", {"r": 1})
    state = store.require(state.instance_id)
    store.begin_compensation(state, "me", "charge", "boom")
    state = store.require(state.instance_id)
    assert (state.status, state.failed_step, state.error) == (
        SagaStatus.COMPENSATING,
        "charge",
        "boom",
    )
    store.record_compensation(state, "me", "reserve", {"r": 1, "released": True})
    state = store.require(state.instance_id)
    store.give_up(state, "me", "could not")
    state = store.require(state.instance_id)
    assert state.status is SagaStatus.FAILED
    assert (state.leased_by, state.leased_until) == ("", None)
    reopened = store.reopen(state, "operator", lease_seconds=30)
    assert reopened is not None
    assert (reopened.status, reopened.leased_by) == (SagaStatus.COMPENSATING, "operator")
    assert store.reopen(state, "operator", lease_seconds=30) is None  # stale
    store.finish_compensation(reopened, "operator")
    final = store.require(state.instance_id)
    assert final.status is SagaStatus.COMPENSATED
    assert final.compensation_error == ""
    assert final.finished_at is not None


def test_a_stale_write_raises_the_concurrency_error():
    state = started_instance()  # both writers read this snapshot
    first = store.complete_step(state, "", "reserve", {"writer": 0})
    assert first == state.version + 1

    with pytest.raises(SagaConcurrencyError, match="stale"):
        store.complete_step(state, "", "reserve", {"writer": 1})
    row = instance(state.instance_id)
    assert (row.completed_steps, row.data, row.version) == (
        ["reserve"],
        {"writer": 0},
        state.version + 1,
    )


def test_of_two_concurrent_writers_the_later_fails(concurrently):
    state = started_instance()

    def write(n: int):
        return lambda: store.complete_step(state, "", "reserve", {"writer": n})

    outcomes = concurrently(write(0), write(1))

    errors = [o.error for o in outcomes]
    assert sorted(e is None for e in errors) == [False, True]
    assert isinstance(next(e for e in errors if e is not None), SagaConcurrencyError)
    winner = next(n for n, e in enumerate(errors) if e is None)
    row = instance(state.instance_id)
    assert (row.data, row.version) == ({"writer": winner}, state.version + 1)


def test_a_takeover_mid_step_fences_the_old_runners_completion(tmp_path: Path, background):
    """Runner A's step is running when runner B takes the instance over (A's lease
    looked expired to B). A's step then writes its payment and tries to mark itself
    completed: the version moved on, so A's whole step transaction rolls back, A stops
    with SagaLeaseLost, and B runs the step once."""
    hold = {"step": "charge", "file": str(tmp_path / "go"), "started_file": str(tmp_path / "in")}
    data = order(hold=hold, journal=str(tmp_path / "journal"))
    run_a = background(lambda: run_saga("fulfilment.order", data=data))
    wait_until((tmp_path / "in").exists, 30, "runner A's charge step to start")

    state = store.require(instance().instance_id)
    taken = store.claim(state, "runner-b", lease_seconds=30, now=timezone.now() + LATER)
    assert taken is not None
    (tmp_path / "go").touch()
    with pytest.raises(SagaLeaseLost):
        run_a.result(timeout=30)
    assert Payment.objects.count() == 0
    assert runs(state.instance_id) == ["reserve"]

    final = Driver(get_saga("fulfilment.order"), "runner-b").drive(taken)
    assert final.status is SagaStatus.SUCCEEDED
    assert runs(state.instance_id) == ["reserve", "charge", "ship"]
    assert Payment.objects.count() == 1
    assert started(tmp_path / "journal") == {"reserve": 1, "charge": 2, "ship": 1}


# --------------------------------------------------------------------------- recovery rules


def test_missing_definition_is_reported_and_the_instance_left_untouched():
    with temporary_saga("retired") as retired:
        retired.step("only", lambda ctx: None)
        state = start_saga("retired", data={"n": 1})
    events: list[tuple[str, str]] = []
    stats = drive_pending_sagas(on_event=lambda e, s, d: events.append((e, d)))

    assert (stats.claimed, stats.untouched) == (0, 1)
    [detail] = [d for e, d in events if e == "untouched"]
    assert "no saga is registered as 'retired'" in detail
    row = instance(state.instance_id)
    assert (row.status, row.version, row.leased_by) == (SagaStatus.RUNNING, state.version, "")
    with pytest.raises(UnknownSaga):
        resume_saga(state.instance_id)


def test_a_definition_without_a_stored_step_leaves_the_instance_untouched():
    with temporary_saga("shrinking") as shrinking:
        shrinking.step("one", lambda ctx: None).step("two", lambda ctx: None)
        state = start_saga("shrinking")
        with temporary_saga("shrinking") as shrunk:
            shrunk.step("one", lambda ctx: None)
            stats = drive_pending_sagas()
    assert stats.untouched == 1
    assert instance(state.instance_id).version == state.version


def test_recovery_resumes_from_the_stored_steps_and_never_reruns_completed_ones(tmp_path):
    """A runner that crashed after reserve: its lease expires; recovery runs charge and
    ship, reading the reservation from the stored data."""
    data = order(journal=str(tmp_path / "journal"))
    state = store.create(
        "fulfilment.order",
        ["reserve", "charge", "ship"],
        data,
        idempotency_key=None,
        owner="crashed",
        lease_seconds=30,
    )
    # Run only the first step, as the crashed runner did.
    stopping = threading.Event()

    def stop_after_first(event: str, snap, detail: str) -> None:
        if event == "step-completed":
            stopping.set()

    Driver(
        get_saga("fulfilment.order"), "crashed", on_event=stop_after_first, stopping=stopping
    ).drive(state)
    row = instance(state.instance_id)
    assert row.completed_steps == ["reserve"]
    assert row.leased_by == ""  # the stopped driver released it
    stats = drive_pending_sagas()
    assert stats.succeeded == 1
    assert runs(state.instance_id) == ["reserve", "charge", "ship"]
    assert started(tmp_path / "journal") == {"reserve": 1, "charge": 1, "ship": 1}


def test_resume_and_compensate_refuse_what_their_state_forbids():
    done = run_saga("fulfilment.order", data=ORDER)
    with pytest.raises(InvalidTransition, match="succeeded"):
        resume_saga(done.instance_id)
    with pytest.raises(InvalidTransition, match="nothing left to compensate"):
        compensate_saga(done.instance_id)
    live = store.claim(started_instance(), "busy-runner", lease_seconds=300)
    assert live is not None
    with pytest.raises(SagaLeased, match="leased by 'busy-runner'"):
        resume_saga(live.instance_id)
    with pytest.raises(SagaLeased):
        compensate_saga(live.instance_id)


def test_compensate_saga_stops_a_running_instance_and_undoes_its_steps():
    state = started_instance()
    stopping = threading.Event()
    Driver(
        get_saga("fulfilment.order"),
        "r",
        on_event=lambda e, s, d: stopping.set() if e == "step-completed" else None,
        stopping=stopping,
    ).drive(store.claim(state, "r", lease_seconds=30))
    final = compensate_saga(state.instance_id, reason="customer cancelled")
    assert final.status is SagaStatus.COMPENSATED
    assert (final.failed_step, final.error) == ("", "customer cancelled")
    assert final.compensated_steps == ("reserve",)


def test_runner_stats_and_stop():
    for n in range(3):
        start_saga("fulfilment.order", data=order(order_id=n))
    events: list[str] = []
    runner = SagaRunner(runner_id="r1", burst=True, on_event=lambda e, s, d: events.append(e))
    stats = runner.run()
    assert (stats.claimed, stats.succeeded, stats.untouched) == (3, 3, 0)
    assert events.count("claimed") == 3
    assert events[0] == "started"
    assert events[-1] == "stopped"
    assert StepRun.objects.filter(kind="action").count() == 9
    assert "succeeded 3" in stats.summary()


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's write lock")
def test_sqlite_a_step_transaction_takes_the_write_lock_only_at_its_first_write():
    import sqlite3

    path = connection.settings_dict["NAME"]
    observed = {}

    def other_writer_can_lock() -> bool:
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            other.close()

    def probe(ctx):
        list(Payment.objects.all())  # a read: no write lock yet
        observed["before_write"] = other_writer_can_lock()
        StepRun.objects.create(instance_id=ctx.instance_id, step="probe", kind="action", pid=0)
        observed["after_write"] = other_writer_can_lock()

    with temporary_saga("lock-probe") as lock_probe:
        lock_probe.step("probe", probe)
        run_saga("lock-probe")
    assert observed == {"before_write": True, "after_write": False}


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's snapshot upgrade")
def test_sqlite_a_step_whose_snapshot_went_stale_before_its_first_write_runs_again():
    import sqlite3

    path = connection.settings_dict["NAME"]
    attempts: list[int] = []

    def read_then_write(ctx):
        attempts.append(1)
        list(Payment.objects.all())  # the step's read snapshot starts here
        if len(attempts) == 1:
            other = sqlite3.connect(path, timeout=5, isolation_level=None)
            other.execute("UPDATE sagas_sagainstance SET updated_at = updated_at WHERE id = -1")
            other.execute("INSERT INTO fulfilment_notice (order_id, text) VALUES (1, 'x')")
            other.close()
        StepRun.objects.create(instance_id=ctx.instance_id, step="rw", kind="action", pid=0)

    with temporary_saga("stale-snapshot") as stale:
        stale.step("rw", read_then_write)
        result = run_saga("stale-snapshot")
    assert result.status is SagaStatus.SUCCEEDED
    assert len(attempts) == 2
    assert StepRun.objects.filter(instance_id=result.instance_id).count() == 1


def test_ids_that_are_not_uuids_are_refused():
    from sagas.exceptions import InvalidInput

    with pytest.raises(InvalidInput):
        store.get("not-a-uuid")
    assert store.get(uuid.uuid4()) is None


def take_over(times: int) -> tuple[uuid.UUID, object]:
    """An instance whose runners died ``times`` times: each later runner found the
    lease expired. Returns its id and the moment after the last lease ran out."""
    state = started_instance()
    now = timezone.now()
    state = store.claim(state, "runner-0", lease_seconds=1, now=now)
    for n in range(1, times + 1):
        now += LATER
        state = store.claim(state, f"runner-{n}", lease_seconds=1, now=now)
        assert state is not None
    return state.instance_id, now + LATER


def test_takeovers_count_expired_leases_only_and_progress_resets_them():
    instance_id, _ = take_over(2)
    state = store.require(instance_id)
    assert state.takeovers == 2
    store.release(state, state.leased_by)
    released = store.claim(store.require(instance_id), "polite", lease_seconds=30)
    assert released is not None
    assert released.takeovers == 2  # a released lease is no takeover
    store.complete_step(released, "polite", "reserve", dict(released.data))
    assert store.require(instance_id).takeovers == 0  # the instance moved on


def test_a_step_whose_runners_keep_dying_fails_and_is_compensated(settings):
    """Past SAGAS['MAX_TAKEOVERS'], the next runner does not run the step again: it
    counts as failed, and compensation begins."""
    settings.SAGAS = {**settings.SAGAS, "MAX_TAKEOVERS": 2}
    instance_id, later = take_over(3)
    events: list[str] = []
    SagaRunner(burst=True, clock=lambda: later, on_event=lambda e, s, d: events.append(e)).run()
    row = instance(instance_id)
    assert row.status == SagaStatus.COMPENSATED
    assert row.failed_step == "reserve"
    # Four runners stopped: three before, and the one whose lease this runner found expired.
    assert "never finished: the runners driving it stopped 4 times" in row.error
    assert runs(instance_id) == []  # the step was not run a fifth time
    assert "step-kept-dying" in events


def test_within_the_limit_a_taken_over_instance_just_goes_on(settings):
    settings.SAGAS = {**settings.SAGAS, "MAX_TAKEOVERS": 3}
    instance_id, later = take_over(2)  # this runner's own takeover is the third
    SagaRunner(burst=True, clock=lambda: later).run()
    assert instance(instance_id).status == SagaStatus.SUCCEEDED
    assert runs(instance_id) == ["reserve", "charge", "ship"]


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "3"])
def test_max_takeovers_is_none_or_a_positive_integer(settings, value):
    settings.SAGAS = {**settings.SAGAS, "MAX_TAKEOVERS": value}
    with pytest.raises(SagasConfigurationError, match="MAX_TAKEOVERS"):
        sagas_settings()


def test_a_runner_releasing_its_instances_skips_one_another_runner_took_over(monkeypatch):
    """A runner restarted after a crash releases the instances still leased to it.
    One of them may be taken over by another runner (its lease expired) between the
    moment it is read and its release: that is a race, not an error. Before, the
    release's SagaLeaseLost escaped the runner's loop and ended the process."""
    state = started_instance()
    now = timezone.now()
    mine = store.claim(state, "crashed", lease_seconds=1, now=now)
    assert mine is not None
    other = started_instance(order_id=2)
    assert store.claim(other, "crashed", lease_seconds=1, now=now) is not None
    read = store.get
    taken: list[object] = []

    def taken_over_meanwhile(instance_id):
        found = read(instance_id)
        if instance_id == mine.instance_id and not taken:
            taken.append(None)  # once (the claim reads the instance too)
            taken[0] = store.claim(found, "survivor", lease_seconds=30, now=now + LATER)
        return found  # as read: still leased to "crashed"

    monkeypatch.setattr(store, "get", taken_over_meanwhile)
    events: list[tuple[str, object]] = []
    runner = SagaRunner(runner_id="crashed", on_event=lambda e, s, d: events.append((e, s)))
    assert runner._release_own() is True
    assert taken[0] is not None
    assert instance(mine.instance_id).leased_by == "survivor"
    assert instance(other.instance_id).leased_by == ""  # its own, released
    assert [(e, s.instance_id) for e, s in events] == [("released", other.instance_id)]
