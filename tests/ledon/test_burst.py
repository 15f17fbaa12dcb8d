"""A burst's rule: over once every member found nothing in a pass that began after the
last thing any of them did; over for good; an engine that leaves is not waited for."""

from __future__ import annotations

import threading

from ledon.burst import Burst, join_burst_of


def test_a_quiet_pass_that_began_before_the_others_work_does_not_end_the_burst():
    burst = Burst()
    woken = threading.Event()
    worker = burst.join("worker", lambda: None)
    runner = burst.join("runner", woken.set)
    worker_mark, runner_mark = worker.mark(), runner.mark()
    assert not runner.quiet(runner_mark)  # the worker has not found nothing yet
    worker.worked()  # an end the runner's pass could not have seen
    assert woken.is_set()
    assert not worker.quiet(worker_mark)  # its pass began before its own end too
    assert not burst.over
    assert not worker.quiet(worker.mark())  # the runner must look again
    assert runner.quiet(runner.mark())
    assert burst.over
    assert worker.over
    assert runner.over


def test_a_member_that_took_work_again_is_not_quiet():
    burst = Burst()
    worker = burst.join("worker", lambda: None)
    runner = burst.join("runner", lambda: None)
    mark = worker.mark()
    assert not worker.quiet(mark)
    worker.active()  # it claimed a job since
    assert not runner.quiet(mark)
    assert not burst.over


def test_a_member_that_left_is_not_waited_for_and_the_owner_may_end_it():
    burst = Burst()
    worker = burst.join("worker", lambda: None)
    upkeep = burst.join("upkeep", lambda: None)
    assert not worker.quiet(worker.mark())
    upkeep.leave()
    assert burst.over
    stopped = Burst()
    woken = threading.Event()
    stopped.join("runner", woken.set)
    stopped.end()
    assert stopped.over
    assert woken.is_set()


def test_an_owner_without_a_burst_has_no_member():
    assert join_burst_of(object(), "runner", lambda: None) is None
    burst = Burst()

    class Owner:
        burst_round = burst

    member = join_burst_of(Owner(), "runner", lambda: None)
    assert member is not None
    assert member.burst is burst
