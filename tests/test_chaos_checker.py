"""The chaos run's checker (``chaos/checker.py``) over made-up histories: a history
in which every promise holds passes every check, and each kind of violation — an
effect twice, an effect missing, a timer early, a saga compensated out of order, a
job lost, late or unfinished work — fails the check that names it, and only that one."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chaos import checker
from testproject.history.workload import (
    COMPENSATED_STEPS,
    ITEMS_PER_RUN,
    RUN_SLEEP,
    RUN_STEPS,
    SAGA_STEPS,
    Unit,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)
UNITS = 2


class Recorder:
    """Effects as the workload records them, with increasing ids and times."""

    def __init__(self) -> None:
        self.effects: Any = defaultdict(lambda: defaultdict(list))
        self.pk = 0

    def add(self, kind: str, subject: str, key: str, at: datetime, attempt: int = 0) -> None:
        self.pk += 1
        self.effects[kind][subject].append((self.pk, key, attempt, at))


def clean_history() -> checker.History:
    """A history in which every promise holds."""
    rec = Recorder()
    jobs, tokens, orders, messages, runs, items, sagas = {}, {}, {}, {}, {}, {}, {}
    signals: Counter[str] = Counter()
    for unit in (Unit(n) for n in range(UNITS)):
        for i, job_id in enumerate(unit.job_ids()):
            delay = unit.delay(i)
            not_before = None if delay is None else T0 + timedelta(seconds=delay)
            jobs[job_id] = ("succeeded", not_before)
            tokens[job_id] = [f"t-{job_id}"]
            rec.add("job", job_id, f"t-{job_id}", (not_before or T0) + timedelta(seconds=1), 1)
        for number, run_id in unit.orders():
            message = f"m-{number}"
            orders[number] = run_id
            messages[number] = [(message, "sent")]
            rec.add("consumed", number, message, T0)
            rec.add("delivered", number, message, T0)
            if run_id:
                rec.add("signal", run_id, message, T0)
                signals[run_id] = 1
                runs[run_id] = ("succeeded", json.dumps({"total": 30, "message": message}))
                items[run_id] = [("succeeded", n) for n in range(ITEMS_PER_RUN)]
                for n in range(ITEMS_PER_RUN):
                    rec.add("activity", run_id, str(n), T0)
                offsets = (0, RUN_SLEEP + 0.5, RUN_SLEEP + 1)
                for offset, step in zip(offsets, RUN_STEPS, strict=True):
                    rec.add("step", run_id, step, T0 + timedelta(seconds=offset))
        for key, fail in unit.sagas():
            done = SAGA_STEPS[:-1] if fail else SAGA_STEPS
            for step in done:
                rec.add("saga-step", key, step, T0)
            if fail:
                for step in reversed(COMPENSATED_STEPS):
                    rec.add("compensation", key, step, T0)
            sagas[key] = ("compensated" if fail else "succeeded", list(done), [])
    return checker.History(
        effects=rec.effects,
        jobs=jobs,
        succeeded_tokens=defaultdict(list, tokens),
        orders=orders,
        messages=defaultdict(list, messages),
        inbox={m for found in messages.values() for m, _ in found},
        runs=runs,
        items=defaultdict(list, items),
        signals=signals,
        sagas=sagas,
        unfinished=dict.fromkeys(checker.UNFINISHED, 0),
    )


def failed(history: checker.History, **kwargs: Any) -> dict[str, checker.Verdict]:
    options = {"time_to_final": 3.0, "bound": 10.0, "terms": [("w1", 0)], "crashed": []}
    verdicts = checker.check(history, UNITS, **{**options, **kwargs})
    return {v.check: v for v in verdicts if not v.ok}


def test_a_history_in_which_every_promise_holds_passes_every_check():
    assert failed(clean_history()) == {}


def duplicate_step(h: checker.History) -> None:
    effect = h.effects["step"]["r-1-2"][0]
    h.effects["step"]["r-1-2"].append(effect)


def lose_consumed(h: checker.History) -> None:
    del h.effects["consumed"]["o-0-7"]


def early_timer(h: checker.History) -> None:
    steps = h.effects["step"]["r-0-3"]
    steps[1] = (*steps[1][:3], steps[0][3] + timedelta(seconds=RUN_SLEEP / 2))


def compensate_in_order(h: checker.History) -> None:
    failing = next(k for k, (status, *_rest) in h.sagas.items() if status == "compensated")
    h.effects["compensation"][failing].reverse()


def lose_job(h: checker.History) -> None:
    del h.jobs["j-1-50"]


def early_job(h: checker.History) -> None:
    job_id = "j-0-3"  # delayed: one job in ten waits
    not_before = h.jobs[job_id][1]
    assert not_before is not None
    h.effects["job"][job_id][0] = ("x", f"t-{job_id}", 1, not_before - timedelta(seconds=1))


def rerun_succeeded_attempt(h: checker.History) -> None:
    h.effects["job"]["j-0-9"].append(h.effects["job"]["j-0-9"][0])


def signal_twice(h: checker.History) -> None:
    h.signals["r-0-1"] = 2


def leave_unfinished(h: checker.History) -> None:
    h.unfinished["runs"] = 1


@pytest.mark.parametrize(
    ("spoil", "check"),
    [
        (duplicate_step, "inline steps' writes"),
        (lose_consumed, "messages consumed through the inbox"),
        (early_timer, "timers fired"),
        (compensate_in_order, "saga compensations, in reverse order"),
        (early_job, "delayed jobs not run before their time"),
        (rerun_succeeded_attempt, "the succeeded attempt's effect"),
        (signal_twice, "signals sent with the inbox record, read"),
        (leave_unfinished, "every job, run, saga and message final"),
    ],
)
def test_each_kind_of_violation_fails_the_check_that_names_it(spoil, check):
    history = clean_history()
    spoil(history)
    found = failed(history)
    assert list(found) == [check]
    assert found[check].violations == 1


def test_a_lost_job_fails_every_check_of_it():
    history = clean_history()
    lose_job(history)
    assert set(failed(history)) == {"jobs submitted", "jobs succeeded with one succeeded attempt"}
    assert failed(history)["jobs submitted"].offenders == ["j-1-50"]


def test_late_or_never_final_crashed_engines_and_bad_exits_fail():
    history = clean_history()
    assert set(failed(history, time_to_final=10.5)) == {"final after the last fault"}
    assert set(failed(history, time_to_final=None)) == {"final after the last fault"}
    assert set(failed(history, crashed=["w2 (1)"])) == {"engines ended only by the faults"}
    bad = failed(history, terms=[("w1", 0), ("d1", -1)])
    assert bad["engines stopped by SIGTERM exited 0"].offenders == ["d1: -1"]


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_checkers_reads_and_descriptions_run_on_the_apps_tables():
    """``read``, ``leftovers`` and ``diagnose`` are raw SQL over the apps' tables: a
    renamed column must fail here, not in a chaos run that needed the description."""
    from django.db import connection
    from django.utils import timezone

    from jobs import JobSubmission, submit_job
    from workflows.models import WorkflowRun

    submit_job("chaos-checker", "left", JobSubmission.create("chaos.left"))
    now = timezone.now()
    WorkflowRun.objects.create(
        scope_hash="0" * 64, run_id="left-run", name="chaos.flow", version=1,
        input_json="null", created_at=now, updated_at=now,
    )  # fmt: skip
    connection.ensure_connection()
    dsn = connection.connection.info.dsn
    history = checker.read(dsn)
    assert history.unfinished["jobs"] == 1
    assert history.unfinished["runs"] == 1
    described = checker.leftovers(dsn)
    assert "jobs not final: 1" in described
    assert "'left'" in described
    assert "runs not final: 1" in described
    assert "'left-run'" in described
    assert checker.diagnose(dsn, ["left-run"]).startswith("run left-run: (")
