"""The engines' shared base (``ledon``): the back-off, the outage reporter, stop
levels, signals through the wake-up fd, guarded database steps and the start-up
check — in process, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import random
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DataError, OperationalError, connection

from ledon import db as ledon_db
from ledon.backoff import Backoff, retry_delay
from ledon.db import DatabaseNotMigrated, missing_tables
from ledon.engine import FAILED, Engine, EngineStats, StopLevel
from ledon.outage import OutageReporter

log = logging.getLogger("tests.engine")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def raising(exc: Exception) -> Callable[[], Any]:
    def call() -> Any:
        raise exc

    return call


def boom(message: str = "connection refused") -> OperationalError:
    """An error with a traceback, as a failed statement raises it."""
    try:
        raise OperationalError(message)
    except OperationalError as exc:
        return exc


class FastEngine(Engine):
    kind = "test engine"
    app_label = "jobs"

    def __init__(self) -> None:
        super().__init__(alias="default", log=log, backoff=Backoff(base=0.001, cap=0.004, jitter=0))
        self.levels: list[StopLevel] = []

    def _stop_level_reached(self, level: StopLevel) -> None:
        self.levels.append(level)


# --------------------------------------------------------------------------- back-off


class TestBackoff:
    def test_grows_exponentially_to_its_cap_and_resets_on_success(self):
        backoff = Backoff(base=0.1, factor=2, cap=1.0, jitter=0)
        assert [backoff.next_delay() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
        assert backoff.failures == 6
        assert backoff.ceiling == 1.0
        backoff.reset()
        assert backoff.next_delay() == 0.1

    def test_jitter_spreads_delays_below_the_raw_value(self):
        backoff = Backoff(base=1.0, factor=1, cap=1.0, jitter=0.5, rng=random.Random(3))
        delays = [backoff.next_delay() for _ in range(300)]
        assert min(delays) >= 0.5
        assert max(delays) <= 1.0
        assert len(set(delays)) > 200

    def test_never_overflows_after_a_long_outage(self):
        backoff = Backoff(base=0.1, cap=2.0, jitter=0)
        for _ in range(5000):
            delay = backoff.next_delay()
        assert delay == 2.0

    @pytest.mark.parametrize(
        "kwargs", [{"base": 0}, {"factor": 0.5}, {"cap": 0.01}, {"jitter": 1.0}]
    )
    def test_bad_parameters_are_refused(self, kwargs):
        with pytest.raises(ValueError, match="back-off"):
            Backoff(**kwargs)


class TestRetryDelay:
    """The one formula of automatic retries (jobs, outbox, consumer, compensations)."""

    def test_grows_from_the_first_retry_to_its_cap(self):
        delays = [retry_delay(n, base=2, factor=3, cap=100, jitter=0) for n in (1, 2, 3, 4, 5, 6)]
        assert delays == [2, 6, 18, 54, 100, 100]

    def test_jitter_spreads_both_ways_and_never_below_zero(self):
        rng = random.Random(7)
        delays = [
            retry_delay(1, base=10, factor=2, cap=100, jitter=0.25, rng=rng) for _ in range(300)
        ]
        assert min(delays) >= 7.5
        assert max(delays) <= 12.5
        assert min(delays) < 10 < max(delays)

    def test_a_huge_attempt_number_neither_overflows_nor_passes_the_cap(self):
        assert retry_delay(10_000, base=1, factor=10, cap=3600, jitter=0) == 3600
        assert retry_delay(10_000, base=0, factor=10, cap=3600, jitter=0) == 0


# --------------------------------------------------------------------------- stats


class _Outcome(enum.Enum):
    DONE = "done"
    TRY_AGAIN = "try-again"


@dataclasses.dataclass(slots=True)
class _Stats(EngineStats):
    done: int = 0
    retried: int = 0

    counters = {_Outcome.TRY_AGAIN: "retried"}

    def summary(self) -> str:
        return f"done {self.done}, retried {self.retried}"


def test_stats_count_each_outcome_on_its_counter():
    stats = _Stats()
    for outcome in (_Outcome.DONE, _Outcome.TRY_AGAIN, _Outcome.DONE):
        stats.count(outcome)
    assert (stats.done, stats.retried) == (2, 1)
    assert stats.summary() == "done 2, retried 1"
    assert not hasattr(stats, "__dict__")  # the base keeps the counters slotted


# --------------------------------------------------------------------------- reporter


class TestOutageReporter:
    @pytest.fixture
    def clock(self) -> Clock:
        return Clock()

    @pytest.fixture
    def reporter(self, clock: Clock) -> OutageReporter:
        return OutageReporter(log, "database", summary_interval=10, clock=clock)

    def lines(self, caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, bool]]:
        return [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]

    def test_an_outage_is_one_error_line_then_a_summary_every_interval(
        self, reporter, clock, caplog
    ):
        caplog.set_level(logging.INFO, logger="tests.engine")
        for _ in range(36):  # 36 attempts within 12 s
            reporter.failed(boom(), doing="claiming jobs", retry_in=2.0)
            clock.now += 1 / 3
        reporter.failed(boom(), doing="claiming jobs", retry_in=2.0)
        lines = self.lines(caplog)
        assert lines[0] == (
            "ERROR",
            "database unreachable: claiming jobs failed: OperationalError: connection "
            "refused; retrying in 2.0 s",
            True,
        )
        assert [level for level, _, _ in lines] == ["ERROR", "WARNING"]
        assert lines[1][1].startswith(
            "database unreachable for 10 s, 31 attempts, retrying every 2.0 s"
        )
        assert reporter.active
        assert reporter.attempts == 37

    def test_the_end_of_an_outage_is_said_once(self, reporter, clock, caplog):
        caplog.set_level(logging.INFO, logger="tests.engine")
        reporter.recovered()  # no outage: nothing to say
        reporter.failed(boom(), doing="x", retry_in=0.1)
        clock.now += 14
        reporter.failed(boom(), doing="x", retry_in=0.1)
        reporter.recovered()
        reporter.recovered()
        messages = [m for _, m, _ in self.lines(caplog)]
        assert messages[-1] == "database reachable again after 14.0 s (2 failed attempts)"
        assert sum("again" in m for m in messages) == 1
        assert not reporter.active

    def test_each_distinct_error_gets_its_traceback_once_per_process(self, reporter, clock, caplog):
        caplog.set_level(logging.INFO, logger="tests.engine")
        reporter.failed(boom("connection refused"), doing="x", retry_in=1)
        reporter.failed(boom("server closed the connection"), doing="y", retry_in=1)
        reporter.failed(boom("server closed the connection"), doing="y", retry_in=1)
        reporter.recovered()
        # The next outage: its first line again, but no traceback seen before.
        reporter.failed(boom("connection refused"), doing="x", retry_in=1)
        lines = self.lines(caplog)
        assert [(level, traced) for level, _, traced in lines] == [
            ("ERROR", True),
            ("WARNING", True),
            ("WARNING", False),
            ("ERROR", False),
        ]
        assert "another error: OperationalError: server closed the connection" in lines[1][1]

    def test_an_attempt_begun_during_an_outage_that_fails_after_it_is_no_new_outage(
        self, reporter, clock, caplog
    ):
        caplog.set_level(logging.INFO, logger="tests.engine")
        reporter.failed(boom(), doing="claiming jobs", retry_in=2.0)
        began = clock.now + 3  # a slot starts to connect while the outage lasts
        clock.now += 10
        reporter.recovered()  # another thread got through
        clock.now += 1.5  # the slot's connect timeout runs out
        reporter.failed(boom(), doing="finishing a job", retry_in=2.0, began=began)
        assert not reporter.active
        # An attempt begun after the end fails: that is a new outage.
        began = clock.now
        clock.now += 1
        reporter.failed(boom(), doing="claiming jobs", retry_in=2.0, began=began)
        assert reporter.active
        lines = self.lines(caplog)
        assert [level for level, _, _ in lines] == ["ERROR", "WARNING", "WARNING", "ERROR"]
        assert lines[2][1] == (
            "database reachable again 1.5 s ago, but finishing a job, begun before, failed: "
            "OperationalError: connection refused (the end of the outage, not a new one)"
        )

    def test_a_failing_statement_is_worded_as_failing_not_unreachable(self, reporter, caplog):
        caplog.set_level(logging.INFO, logger="tests.engine")
        reporter.failed(DataError("value too long"), doing="x", retry_in=1, unreachable=False)
        reporter.recovered()
        messages = [m for _, m, _ in self.lines(caplog)]
        assert messages[0].startswith("database failing: x failed: DataError: value too long")
        assert messages[1].startswith("database working again")


# --------------------------------------------------------------------------- stop levels


def test_each_stop_request_goes_one_level_further_and_the_hook_hears_each():
    engine = FastEngine()
    assert engine.stop_level is StopLevel.RUNNING
    assert [engine.request_stop() for _ in range(4)] == [
        StopLevel.GRACEFUL,
        StopLevel.CANCEL,
        StopLevel.ABORT,
        StopLevel.ABORT,
    ]
    assert engine.levels == [StopLevel.GRACEFUL, StopLevel.CANCEL, StopLevel.ABORT]
    assert engine._stopping.is_set()
    assert engine._cancelling.is_set()
    assert engine._aborting.is_set()
    assert engine._wake.is_set()


def test_escalating_to_a_lower_level_changes_nothing():
    engine = FastEngine()
    engine.escalate(StopLevel.CANCEL)
    engine.escalate(StopLevel.GRACEFUL)
    assert engine.stop_level is StopLevel.CANCEL
    assert engine.levels == [StopLevel.CANCEL]
    assert engine.request_stop() is StopLevel.ABORT


def test_signals_reach_the_engine_through_the_watcher_and_handlers_are_restored():
    """SIGTERM sent to this very process inside ``stop_on_signals``: the handler runs
    nothing; the watcher thread requests the stop and announces it."""
    engine = FastEngine()
    heard: list[tuple[signal.Signals, StopLevel]] = []
    announced = threading.Semaphore(0)

    def announce(signum: signal.Signals, level: StopLevel) -> None:
        heard.append((signum, level))
        announced.release()

    before = signal.getsignal(signal.SIGTERM)
    with engine.stop_on_signals(announce):
        assert signal.getsignal(signal.SIGTERM) is not before
        os.kill(os.getpid(), signal.SIGTERM)
        assert announced.acquire(timeout=10)
        os.kill(os.getpid(), signal.SIGINT)
        assert announced.acquire(timeout=10)
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.set_wakeup_fd(-1) == -1  # the wake-up fd was given back
    assert heard == [(signal.SIGTERM, StopLevel.GRACEFUL), (signal.SIGINT, StopLevel.CANCEL)]
    assert engine.stop_level is StopLevel.CANCEL


def test_a_signal_landing_while_the_main_thread_holds_the_wake_events_lock_cannot_deadlock():
    """The hang of the issue: SIGTERM lands while the main thread is inside
    ``Event.wait()``, holding the Event's lock; a handler that set that Event waited
    for the lock for ever. Here the main thread holds the engine's wake-up Event's
    lock as the signal arrives: the handler returns at once (it does nothing), and
    the stop request is processed meanwhile on the watcher thread."""
    engine = FastEngine()
    announced = threading.Event()
    with engine.stop_on_signals(lambda signum, level: announced.set()):
        with engine._wake._cond:  # as Event.wait() does between its lock and its wait
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # bytecodes: the Python-level handler runs here
                pass
            assert engine._stopping.wait(10)  # requested while this thread holds the lock
        assert announced.wait(10)
    assert engine.stop_level is StopLevel.GRACEFUL


def test_outside_the_main_thread_signals_are_left_alone():
    engine = FastEngine()
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with engine.stop_on_signals():
                pass
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(10)
    assert not errors


# --------------------------------------------------------------------------- database


@pytest.mark.django_db
class TestGuardedSteps:
    def test_a_failed_step_backs_off_and_skips_steps_until_the_pause(self, caplog):
        caplog.set_level(logging.INFO, logger="tests.engine")
        engine = FastEngine()
        calls: list[str] = []

        def failing() -> int:
            calls.append("failing")
            raise boom()

        def working() -> int:
            calls.append("working")
            return 7

        assert engine.guarded("claiming", failing) is FAILED
        assert engine.backing_off
        assert engine.guarded("renewing", working) is FAILED  # skipped: not called
        assert calls == ["failing"]
        engine.pause(60)  # the back-off (4 ms at most), not the 60 s poll
        assert not engine.backing_off
        assert engine.guarded("renewing", working) == 7
        assert calls == ["failing", "working"]
        assert not engine.outage.active
        assert engine.backoff.failures == 0
        levels = [r.levelname for r in caplog.records]
        assert levels == ["ERROR", "WARNING"]  # the outage, then its end

    def test_a_stop_cuts_the_back_off_short(self):
        engine = Engine(alias="default", log=log, backoff=Backoff(base=600, cap=600))
        assert engine.guarded("claiming", raising(boom())) is FAILED
        engine.escalate(StopLevel.GRACEFUL)
        engine.pause(600)  # would wait 300-600 s without the stop
        assert not engine.backing_off

    def test_retry_database_retries_what_says_not_now_and_gives_up_on_the_rest(self):
        engine = FastEngine()
        results = iter([boom(), boom(), boom(), "done"])

        def flaky() -> str:
            value = next(results)
            if isinstance(value, Exception):
                raise value
            return value

        assert engine.retry_database("finishing", flaky, attempts=2) == "done"
        tries: list[int] = []

        def bad_data() -> str:
            tries.append(1)
            raise DataError("invalid byte sequence")

        with pytest.raises(DataError):
            engine.retry_database("finishing", bad_data, attempts=3)
        assert len(tries) == 3

    def test_retry_database_gives_up_when_aborted(self):
        engine = FastEngine()
        engine.escalate(StopLevel.ABORT)
        tries: list[int] = []

        def down() -> None:
            tries.append(1)
            raise boom()

        with pytest.raises(OperationalError):
            engine.retry_database("finishing", down)
        assert tries == [1]


@pytest.mark.django_db
class TestStartUp:
    def test_the_tables_are_read_through_introspection(self):
        assert missing_tables("default", ["jobs_job", "no_such_table"]) == ["no_such_table"]

    def test_a_database_without_the_apps_tables_is_a_clear_fatal_error(self, monkeypatch):
        real = connection.introspection.table_names
        monkeypatch.setattr(
            connection.introspection,
            "table_names",
            lambda *a, **k: [t for t in real(*a, **k) if not t.startswith("jobs_")],
        )
        with pytest.raises(DatabaseNotMigrated) as caught:
            FastEngine().wait_for_database()
        message = str(caught.value)
        assert "database 'default' lacks the tables of the 'jobs' app (jobs_job" in message
        assert message.splitlines()[1] == (
            "Run 'python manage.py migrate', then start the test engine again."
        )

    def test_an_unreachable_database_is_waited_for(self, monkeypatch, caplog):
        caplog.set_level(logging.INFO, logger="tests.engine")
        answers = [raising(boom("connection refused")), raising(boom("connection refused"))]
        real = ledon_db.missing_tables

        def flaky(alias: str, tables: Any) -> list[str]:
            if answers:
                answers.pop(0)()
            return real(alias, tables)

        monkeypatch.setattr("ledon.engine.missing_tables", flaky)
        assert FastEngine().wait_for_database() is True
        assert not answers
        assert [r.levelname for r in caplog.records] == ["ERROR", "WARNING"]
        assert "connecting to database 'default' failed" in caplog.records[0].getMessage()

    def test_a_stop_during_the_wait_returns_false(self, monkeypatch):
        engine = FastEngine()

        def down(alias: str, tables: Any) -> list[str]:
            engine.escalate(StopLevel.GRACEFUL)
            raise boom()

        monkeypatch.setattr("ledon.engine.missing_tables", down)
        assert engine.wait_for_database() is False


def test_a_row_becomes_its_value_field_by_field_with_the_conversions_the_store_gives():
    from types import SimpleNamespace

    from ledon.values import from_row

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Value:
        name: str
        steps: tuple[str, ...]
        created: bool = False

    row = SimpleNamespace(name="order", steps=["reserve", "charge"], unrelated=1)
    assert from_row(Value, row, steps=tuple(row.steps), created=True) == Value(
        name="order", steps=("reserve", "charge"), created=True
    )
    # A field the row does not hold and the store does not give is a mistake, even one
    # with a default: it is never filled in silently.
    with pytest.raises(AttributeError, match="created"):
        from_row(Value, row, steps=())


def test_each_engine_of_the_outbox_tells_its_command_what_it_does():
    from ledon.engine import EmitsEvents
    from outbox.consumer import EventConsumer
    from outbox.dispatcher import Dispatcher

    heard: list[tuple[str, str]] = []

    class Probe(EmitsEvents):
        on_event = None

    probe = Probe()
    probe._emit("silent")  # no callback: nothing to tell, nothing raised
    probe.on_event = lambda event, detail: heard.append((event, detail))
    probe._emit("batch", "3 sent")
    probe._emit("idle")
    assert heard == [("batch", "3 sent"), ("idle", "")]
    assert issubclass(Dispatcher, EmitsEvents)
    assert issubclass(EventConsumer, EmitsEvents)
