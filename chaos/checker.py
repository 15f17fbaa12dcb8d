"""The checker: plain Python over the rows a chaos run recorded.

:func:`read` takes one consistent snapshot of the effect table and of the apps'
tables; :func:`check` turns it into verdicts, one per promise:

- **once** — an effect the product promises exactly once (a job's success, an inline
  step's writes, a message consumed through the inbox, a signal sent with it, a saga
  step or compensation) was recorded exactly once;
- **at least once** — an effect it promises at least once (a job handler's run, an
  activity's run, a delivery) was recorded at least once, and the run that counted
  (the succeeded attempt's) exactly once;
- **nothing lost** — every job, order, message, run and saga that the feeder had
  acknowledged exists and ended as it should;
- **no earlier than asked** — no delayed job and no timer fired early, both read on
  the database's clock;
- **final in time** — every job, run and saga was final within a lease plus 5 s of
  the last fault.

Each verdict names up to five offending ids, so that a violation can be looked up.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from testproject.history.workload import (
    COMPENSATED_STEPS,
    CONSUMER,
    ITEMS_PER_RUN,
    JOB_HANDLER,
    MESSAGE,
    RUN_SLEEP,
    RUN_STEPS,
    SAGA,
    SAGA_STEPS,
    WORKFLOW,
    Unit,
)

ONCE = "once"
AT_LEAST_ONCE = "at least once"
NOTHING_LOST = "nothing lost"
NOT_EARLY = "no earlier than asked"
IN_TIME = "final in time"


@dataclass
class Verdict:
    check: str
    promise: str
    expected: str
    found: str
    offenders: list[str] = field(default_factory=list)
    violations: int = 0

    @property
    def ok(self) -> bool:
        return self.violations == 0


@dataclass
class History:
    """What the run recorded, read in one snapshot."""

    effects: dict[str, dict[str, list[tuple[int, str, int, datetime]]]]
    jobs: dict[str, tuple[str, datetime | None]]
    succeeded_tokens: dict[str, list[str]]
    orders: dict[str, str]
    messages: dict[str, list[tuple[str, str]]]
    inbox: set[str]
    runs: dict[str, tuple[str, str | None]]
    items: dict[str, list[tuple[str, int]]]
    signals: Counter[str]
    sagas: dict[str, tuple[str, list[str], list[str]]]
    unfinished: dict[str, int]


def read(conninfo: str) -> History:
    import psycopg

    with psycopg.connect(conninfo) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        effects: dict[str, dict[str, list[tuple[int, str, int, datetime]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for pk, kind, subject, key, attempt, at in conn.execute(
            "SELECT id, kind, subject, key, attempt, at FROM history_effect ORDER BY id"
        ):
            effects[kind][subject].append((pk, key, attempt, at))
        jobs = {
            job_id: (status, not_before)
            for job_id, status, not_before in conn.execute(
                "SELECT job_id, status, initial_not_before FROM jobs_job WHERE handler = %s",
                [JOB_HANDLER],
            )
        }
        succeeded: dict[str, list[str]] = defaultdict(list)
        for job_id, token in conn.execute(
            "SELECT j.job_id, a.token FROM jobs_jobattempt a JOIN jobs_job j ON j.id = a.job_id"
            " WHERE j.handler = %s AND a.status = 'succeeded'",
            [JOB_HANDLER],
        ):
            succeeded[job_id].append(token)
        orders = dict(conn.execute("SELECT number, run_id FROM history_order").fetchall())
        messages: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for key, message_id, status in conn.execute(
            "SELECT key, message_id, status FROM outbox_outboxmessage WHERE event_type = %s",
            [MESSAGE],
        ):
            messages[key].append((str(message_id), status))
        inbox = {
            row[0]
            for row in conn.execute(
                "SELECT message_id FROM outbox_inboxmessage WHERE consumer = %s", [CONSUMER]
            )
        }
        runs = {
            run_id: (status, output)
            for run_id, status, output in conn.execute(
                "SELECT run_id, status, output_json FROM workflows_workflowrun WHERE name = %s",
                [WORKFLOW],
            )
        }
        items: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for run_id, status, index in conn.execute(
            "SELECT r.run_id, i.status, i.index FROM workflows_workflowitem i"
            " JOIN workflows_workflowstep s ON s.id = i.step_id"
            " JOIN workflows_workflowrun r ON r.id = s.run_id WHERE r.name = %s",
            [WORKFLOW],
        ):
            items[run_id].append((status, index))
        signals = Counter(
            row[0]
            for row in conn.execute(
                "SELECT r.run_id FROM workflows_workflowsignal s"
                " JOIN workflows_workflowrun r ON r.id = s.run_id WHERE r.name = %s",
                [WORKFLOW],
            )
        )
        sagas = {
            key: (status, completed, compensated)
            for key, status, completed, compensated in conn.execute(
                "SELECT idempotency_key, status, completed_steps, compensated_steps"
                " FROM sagas_sagainstance WHERE name = %s",
                [SAGA],
            )
        }
        unfinished = unfinished_counts(conn)
    return History(
        effects, jobs, succeeded, orders, messages, inbox, runs, items, signals, sagas, unfinished
    )


#: What is not final yet, each kind's table and condition (:data:`UNFINISHED`
#: counts them, :data:`LEFTOVERS` describes them): every job (the workload's, the
#: workflows' advances and activity items), run and saga, and every message not sent
#: or not consumed.
NOT_FINAL = {
    "jobs": ("jobs_job", "status IN ('queued', 'running')"),
    "runs": ("workflows_workflowrun", "status IN ('running', 'waiting')"),
    "sagas": ("sagas_sagainstance", "status IN ('running', 'compensating')"),
    "messages": (
        "outbox_outboxmessage",
        f"event_type = '{MESSAGE}' AND (status <> 'sent' OR message_id::text NOT IN"
        f" (SELECT message_id FROM outbox_inboxmessage WHERE consumer = '{CONSUMER}'))",
    ),
}
UNFINISHED = {
    what: f"SELECT count(*) FROM {table} t WHERE {where}"
    for what, (table, where) in NOT_FINAL.items()
}


def unfinished_counts(conn: Any) -> dict[str, int]:
    return {what: int(conn.execute(sql).fetchone()[0]) for what, sql in UNFINISHED.items()}


def check(history: History, units: int, *, time_to_final: float | None, bound: float,
          terms: list[tuple[str, int]], crashed: list[str]) -> list[Verdict]:  # fmt: skip
    """Every verdict of the run."""
    plan = [Unit(n) for n in range(units)]
    h = history
    verdicts: list[Verdict] = []

    # Jobs.
    job_ids = [job_id for unit in plan for job_id in unit.job_ids()]
    verdicts.append(_expect_all("jobs submitted", NOTHING_LOST, job_ids, lambda j: j in h.jobs))
    verdicts.append(
        _expect_all(
            "jobs succeeded with one succeeded attempt",
            ONCE,
            job_ids,
            lambda j: h.jobs.get(j, ("",))[0] == "succeeded" and len(h.succeeded_tokens[j]) == 1,
        )
    )
    job_effects = h.effects["job"]
    runs_total = sum(len(job_effects[j]) for j in job_ids)
    verdicts.append(
        _expect_all(
            "job handler ran (its effect)",
            AT_LEAST_ONCE,
            job_ids,
            lambda j: bool(job_effects[j]),
            found=f"{runs_total:,} runs",
        )
    )
    verdicts.append(
        _expect_all(
            "the succeeded attempt's effect",
            ONCE,
            job_ids,
            lambda j: (
                len(h.succeeded_tokens[j]) == 1
                and sum(1 for e in job_effects[j] if e[1] == h.succeeded_tokens[j][0]) == 1
            ),
        )
    )
    delayed = [
        (job_id, not_before) for job_id, (_, not_before) in h.jobs.items() if not_before is not None
    ]
    verdicts.append(
        _expect_all(
            "delayed jobs not run before their time",
            NOT_EARLY,
            [j for j, _ in delayed],
            lambda j: all(e[3] >= h.jobs[j][1] for e in job_effects[j]),  # type: ignore[operator]
        )
    )

    # Messages, through the inbox.
    numbers = [number for unit in plan for number, _ in unit.orders()]
    verdicts.append(
        _expect_all(
            "orders with one message, sent",
            NOTHING_LOST,
            numbers,
            lambda n: n in h.orders and len(h.messages[n]) == 1 and h.messages[n][0][1] == "sent",
        )
    )
    consumed = h.effects["consumed"]
    verdicts.append(
        _expect_all(
            "messages consumed through the inbox",
            ONCE,
            numbers,
            lambda n: (
                len(consumed[n]) == 1
                and len(h.messages[n]) == 1
                and consumed[n][0][1] == h.messages[n][0][0]
                and h.messages[n][0][0] in h.inbox
            ),
        )
    )
    delivered = h.effects["delivered"]
    verdicts.append(
        _expect_all(
            "messages delivered",
            AT_LEAST_ONCE,
            numbers,
            lambda n: bool(delivered[n]),
            found=f"{sum(len(delivered[n]) for n in numbers):,} deliveries",
        )
    )

    # Workflow runs.
    run_ids = [run_id for unit in plan for _, run_id in unit.orders() if run_id]
    message_of = {run_id: h.messages[n][0][0] for n, run_id in h.orders.items() if run_id and
                  h.messages.get(n)}  # fmt: skip
    verdicts.append(
        _expect_all(
            "workflow runs succeeded",
            NOTHING_LOST,
            run_ids,
            lambda r: h.runs.get(r, ("",))[0] == "succeeded",
        )
    )
    steps = h.effects["step"]
    verdicts.append(
        _expect_all(
            "inline steps' writes",
            ONCE,
            run_ids,
            lambda r: Counter(e[1] for e in steps[r]) == Counter(RUN_STEPS),
        )
    )
    activities = h.effects["activity"]
    verdicts.append(
        _expect_all(
            "activity items ran, items succeeded",
            AT_LEAST_ONCE,
            run_ids,
            lambda r: (
                {e[1] for e in activities[r]} == {str(n) for n in range(ITEMS_PER_RUN)}
                and sorted(h.items[r]) == [("succeeded", n) for n in range(ITEMS_PER_RUN)]
            ),
            found=f"{sum(len(activities[r]) for r in run_ids):,} runs",
        )
    )

    def slept(run_id: str) -> bool:
        at = {e[1]: e[3] for e in steps[run_id]}
        return (
            "reserve" in at
            and "after-sleep" in at
            and at["after-sleep"] - at["reserve"] >= timedelta(seconds=RUN_SLEEP)
        )

    verdicts.append(_expect_all("timers fired", NOT_EARLY, run_ids, slept))
    signals = h.effects["signal"]

    def signalled(run_id: str) -> bool:
        _status, output = h.runs.get(run_id, ("", None))
        message = message_of.get(run_id)
        return (
            len(signals[run_id]) == 1
            and h.signals[run_id] == 1
            and signals[run_id][0][1] == message
            and output is not None
            and json.loads(output).get("message") == message
        )

    verdicts.append(_expect_all("signals sent with the inbox record, read", ONCE, run_ids,
                                signalled))  # fmt: skip

    # Sagas.
    plan_sagas = [saga for unit in plan for saga in unit.sagas()]
    failing = dict(plan_sagas)
    verdicts.append(
        _expect_all(
            "sagas succeeded or compensated",
            NOTHING_LOST,
            [k for k, _ in plan_sagas],
            lambda k: h.sagas.get(k, ("",))[0] == ("compensated" if failing[k] else "succeeded"),
        )
    )
    actions, compensations = h.effects["saga-step"], h.effects["compensation"]

    def saga_steps(key: str) -> bool:
        done = list(SAGA_STEPS[:-1] if failing[key] else SAGA_STEPS)
        return [e[1] for e in actions[key]] == done

    def saga_compensations(key: str) -> bool:
        undone = list(reversed(COMPENSATED_STEPS)) if failing[key] else []
        return [e[1] for e in compensations[key]] == undone

    keys = [k for k, _ in plan_sagas]
    verdicts.append(_expect_all("saga steps", ONCE, keys, saga_steps))
    verdicts.append(
        _expect_all("saga compensations, in reverse order", ONCE, keys, saga_compensations)
    )

    # Final, and in time.
    left = {what: n for what, n in h.unfinished.items() if n}
    verdicts.append(
        Verdict(
            "every job, run, saga and message final",
            NOTHING_LOST,
            "0 left",
            ", ".join(f"{n} {what}" for what, n in left.items()) or "0 left",
            [f"{what}: {n}" for what, n in left.items()],
            len(left),
        )
    )
    late = time_to_final is None or time_to_final > bound
    verdicts.append(
        Verdict(
            "final after the last fault",
            IN_TIME,
            f"<= {bound:g} s (a lease + 5 s)",
            "never" if time_to_final is None else f"{time_to_final:.1f} s",
            [],
            int(late),
        )
    )
    verdicts.append(
        Verdict(
            "engines ended only by the faults",
            "no crash",
            "0",
            str(len(crashed)),
            crashed[:5],
            len(crashed),
        )
    )
    bad_exits = [f"{name}: {code}" for name, code in terms if code != 0]
    verdicts.append(
        Verdict(
            "engines stopped by SIGTERM exited 0",
            "clean stop",
            f"{len(terms)} x 0",
            f"{len(terms) - len(bad_exits)} x 0",
            bad_exits[:5],
            len(bad_exits),
        )
    )
    return verdicts


def _expect_all(check: str, promise: str, ids: Iterable[str], holds: Any, *,
                found: str = "") -> Verdict:  # fmt: skip
    """A verdict that ``holds(id)`` for every id (``found``: what else to say)."""
    ids = list(ids)
    bad = [i for i in ids if not holds(i)]
    return Verdict(
        check,
        promise,
        f"{len(ids):,}",
        f"{len(ids) - len(bad):,}" + (f" ({found})" if found else ""),
        bad[:5],
        len(bad),
    )


def diagnose(conninfo: str, run_ids: list[str]) -> str:
    """What the database holds about the runs ``run_ids`` (the offenders of a failed
    check): each run's row, its checkpoints, and every advance and item job of it
    with its attempts — enough to tell where a run stopped."""
    import psycopg

    lines: list[str] = []
    with psycopg.connect(conninfo) as conn:
        for run_id in run_ids:
            row = conn.execute(
                "SELECT id, status, wait_kind, wait_key, wake_at, wake_pending, driver_job,"
                " generation, advances, updated_at FROM workflows_workflowrun WHERE run_id = %s",
                [run_id],
            ).fetchone()
            lines.append(f"run {run_id}: {row}")
            if row is None:
                continue
            pk = row[0]
            for step in conn.execute(
                "SELECT key, kind, status, attempts, wake_at, item_count, started_at, finished_at"
                " FROM workflows_workflowstep WHERE run_id = %s ORDER BY id",
                [pk],
            ):
                lines.append(f"  step {step}")
            for job in conn.execute(
                "SELECT j.job_id, j.status, j.attempt_count, j.next_run_at,"
                " array_agg(a.number || ' ' || a.status || ' ' || a.worker_id || ' '"
                " || left(a.error, 80) ORDER BY a.number)"
                " FROM jobs_job j LEFT JOIN jobs_jobattempt a ON a.job_id = j.id"
                " WHERE j.job_id LIKE %s OR j.job_id LIKE %s GROUP BY j.id ORDER BY j.id",
                [f"wf:{pk}.%", f"wf-item:{pk}.%"],
            ):
                lines.append(f"  job {job}")
    return "\n".join(lines)


#: What is left when a run never became final: each kind's rows that are not, with
#: what tells where they stopped (at most ``LEFTOVERS_SHOWN`` of each).
LEFTOVERS_SHOWN = 20
_LEFTOVER_COLUMNS = {
    "jobs": (
        "job_id, handler, status, queue, attempt_count, next_run_at, lease_expires_at,"
        " (SELECT a.worker_id FROM jobs_jobattempt a WHERE a.job_id = t.id"
        " ORDER BY a.number DESC LIMIT 1)"
    ),
    "runs": "run_id, status, wait_kind, wait_key, wake_at, wake_pending, driver_job, updated_at",
    "sagas": "idempotency_key, status, completed_steps, compensated_steps, updated_at",
    "messages": "message_id, key, status, attempts, available_at",
}
LEFTOVERS = {
    what: f"SELECT {_LEFTOVER_COLUMNS[what]} FROM {table} t WHERE {where} ORDER BY t.id"
    for what, (table, where) in NOT_FINAL.items()
}


def leftovers(conninfo: str) -> str:
    """The rows :data:`UNFINISHED` counts, described (:data:`LEFTOVERS`)."""
    import psycopg

    lines: list[str] = []
    with psycopg.connect(conninfo) as conn:
        for what, sql in LEFTOVERS.items():
            rows = conn.execute(sql).fetchall()
            lines.append(f"{what} not final: {len(rows)}")
            lines.extend(f"  {row}" for row in rows[:LEFTOVERS_SHOWN])
    return "\n".join(lines)
