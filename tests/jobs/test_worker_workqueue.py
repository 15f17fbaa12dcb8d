"""The slots' work queue and the look-ahead's hand-back: a handler thread is woken
only for work it may take now, and the claims waiting for a slot stay queued while
the main loop looks for those that waited too long."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from jobs.types import Claim
from jobs.worker import slots as slots_module
from jobs.worker.holdings import Holdings
from jobs.worker.slots import AUTO_PREFETCH, AUTO_PREFETCH_SMALL, Slots
from jobs.worker.workqueue import STOP, WorkQueue


def claim(n: int) -> Claim:
    return Claim(
        scope_hash="s",
        job_id=f"j{n}",
        token=f"t{n}",
        attempt=1,
        max_attempts=3,
        handler="h",
        handler_version=1,
        payload_json="{}",
        queue="default",
        worker_id="w",
        lease_expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )


class CountedCondition(threading.Condition):
    """A condition that counts the threads its ``notify`` was asked to wake."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self.woken = 0

    def notify(self, n: int = 1) -> None:
        self.woken += n
        super().notify(n)


def counted(queue: WorkQueue) -> CountedCondition:
    queue._ready = condition = CountedCondition()
    return condition


def waiting_thread(queue: WorkQueue) -> tuple[threading.Thread, list[Any]]:
    """A thread blocked in ``queue.get()``, and where it puts what it took."""
    took: list[Any] = []
    thread = threading.Thread(target=lambda: took.append(queue.get()))
    thread.start()
    while True:
        with queue._ready:
            if queue._waiting:
                return thread, took


def test_a_claim_that_must_wait_for_a_handler_wakes_no_thread() -> None:
    queue = WorkQueue(limit=1)
    condition = counted(queue)
    assert queue.try_run()  # the one handler allowed runs
    thread, took = waiting_thread(queue)
    queue.put_many([claim(1)])
    assert condition.woken == 0
    held = SimpleNamespace(running=True)
    queue.handler_returned(held)  # type: ignore[arg-type]
    thread.join(10)
    assert took == [claim(1)]
    assert condition.woken == 1


def test_a_batch_wakes_one_waiting_thread_per_item_it_may_take() -> None:
    queue = WorkQueue(limit=2)
    condition = counted(queue)
    threads = [waiting_thread(queue) for _ in range(3)]
    queue.put_many([claim(n) for n in range(4)])
    assert condition.woken == 2  # two may run at once
    queue.put_many([STOP])  # a stop is taken whatever runs
    assert condition.woken == 3
    for thread, _took in threads:
        thread.join(10)
    assert sorted(repr(took[0]) for _t, took in threads) == sorted(
        [repr(claim(0)), repr(claim(1)), repr(STOP)]
    )


def test_take_removes_only_the_claims_still_waiting_and_keeps_the_order() -> None:
    queue = WorkQueue(limit=4)
    queue.put_many([claim(0), claim(1), STOP, claim(2)])
    first = queue.get()
    assert first == claim(0)
    assert queue.take([claim(0), claim(2)]) == [claim(2)]
    assert queue.claims() == [claim(1)]
    assert queue.get() == claim(1)
    assert queue.get() is STOP


def test_the_hand_back_of_stale_look_ahead_leaves_the_fresh_claims_queued() -> None:
    holdings = Holdings()
    settings = SimpleNamespace(PREFETCH=4, PREFETCH_MAX_WAIT=60.0)
    worker = SimpleNamespace(holdings=holdings, concurrency=1, settings=settings)
    slots = Slots(worker)  # type: ignore[arg-type]
    condition = counted(slots._work)
    claims = [claim(n) for n in range(3)]
    with holdings.lock:
        for each in claims:
            holdings.add_locked(each)
    assert slots._work.try_run()  # the one slot is busy: the claims wait for it
    slots._work.put_many(claims)
    taken: list[Any] = []
    real_take = slots._work.take
    slots._work.take = lambda wanted: taken.append(list(wanted)) or real_take(wanted)  # type: ignore[method-assign]

    assert slots.hand_back_stale() is not None  # the next hand-back is due later
    assert taken == [[]]  # none was stale; none was taken out, even for a moment
    assert slots._work.claims() == claims
    assert condition.woken == 0


def test_a_success_waiting_for_its_settle_holds_no_slot_nor_look_ahead_place() -> None:
    """A slot is free once its handler returned: the successes waiting for the next
    settle's commit leave the look-ahead to the slots, which find their next job
    waiting instead of waiting for that commit."""
    holdings = Holdings()
    settings = SimpleNamespace(PREFETCH=2, PREFETCH_MAX_WAIT=60.0)
    worker = SimpleNamespace(holdings=holdings, concurrency=2, settings=settings)
    slots = Slots(worker)  # type: ignore[arg-type]
    with holdings.lock:
        first, second = (holdings.add_locked(claim(n)) for n in range(2))
        for held in (first, second):
            held.running = True
            held.started_at = time.monotonic()
        for n in range(2, 4):
            holdings.add_locked(claim(n))  # looked ahead: waiting for a slot
        assert slots.claimable_locked(reserved=0) == 0  # two running, two waiting
        first.running, first.returned = False, True  # returned; its finish not committed
        # Its slot takes a job waiting, and the look-ahead has a place again.
        assert slots.claimable_locked(reserved=0) == 1
        assert slots.claimable_locked(reserved=1) == 0  # a settle under way took it
        second.running, second.returned = False, True
        assert slots.claimable_locked(reserved=0) == 2


def test_a_slot_looks_ahead_no_further_than_it_runs_while_its_next_claim_comes() -> None:
    """Each young slot stands for the jobs it starts during two of the settles'
    typical round trips at the handlers' typical run time (``PREFETCH`` at most):
    a worker of few slots with a large look-ahead does not keep jobs waiting in its
    memory longer than the claim it hides takes."""
    holdings = Holdings()
    settings = SimpleNamespace(PREFETCH=64, PREFETCH_MAX_WAIT=60.0)
    worker = SimpleNamespace(holdings=holdings, concurrency=2, settings=settings)
    slots = Slots(worker)  # type: ignore[arg-type]
    with holdings.lock:
        for n in range(2):
            held = holdings.add_locked(claim(n))
            held.running, held.started_at = True, time.monotonic()
        assert slots.claimable_locked(reserved=0) == 64  # nothing measured yet
        slots._note_run_time_locked(0.010)
        assert slots.claimable_locked(reserved=0) == 64
        slots.note_round_trip_locked(0.012)  # two round trips: 2.4 handlers a slot
        assert slots.claimable_locked(reserved=0) == 6
        slots.note_round_trip_locked(0.5)  # the average moves toward a slow settle:
        assert slots.claimable_locked(reserved=0) == 44  # 0.1096 s, 22 handlers a slot


def test_a_chosen_look_ahead_batches_quick_handlers_instead(monkeypatch: Any) -> None:
    """With ``PREFETCH`` unset and no flow limit, a worker looks ahead up to the larger
    look-ahead for handlers a slot runs a few of during two round trips, and keeps to
    the smaller one for quick handlers, which it batches instead."""
    # No flow limit, whatever handlers other tests of the process registered.
    no_limits = SimpleNamespace(for_queues=lambda queues: ())
    monkeypatch.setattr(slots_module.execution, "claim_limits", lambda: no_limits)
    holdings = Holdings()
    settings = SimpleNamespace(PREFETCH=None, PREFETCH_MAX_WAIT=60.0)
    worker = SimpleNamespace(holdings=holdings, concurrency=16, settings=settings, queues=[])
    slots = Slots(worker)  # type: ignore[arg-type]
    with holdings.lock:
        for n in range(16):
            held = holdings.add_locked(claim(n))
            held.running, held.started_at = True, time.monotonic()
        assert slots.claimable_locked(reserved=0) == AUTO_PREFETCH  # nothing measured
        slots._note_run_time_locked(0.0055)  # a 5 ms handler
        slots.note_round_trip_locked(0.008)  # three jobs a slot during two round trips
        assert slots.claimable_locked(reserved=0) == 48
        slots._note_run_time_locked(0.0)  # quicker: 0.0044 s, four jobs a slot
        assert slots.claimable_locked(reserved=0) == AUTO_PREFETCH
        for _ in range(20):  # a no-op handler: hundreds of jobs a slot
            slots._note_run_time_locked(0.00002)
        assert slots.claimable_locked(reserved=0) == AUTO_PREFETCH_SMALL
