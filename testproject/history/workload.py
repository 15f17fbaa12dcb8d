"""What the chaos workload consists of, unit by unit: plain data, no Django, so that
the feeder (``manage.py chaos_feed``) and the checker (``chaos.checker``) read the
same ids.

A unit is 100 jobs, 20 orders (each an outbox message consumed through the inbox),
5 of them with a workflow run that waits for its order's message as a signal, and
2 sagas, one of every 4 of which fails at its last step and is compensated. A job in
ten waits before it may start (``not_before``), which the checker holds it to.
"""

from __future__ import annotations

from dataclasses import dataclass

SCOPE = "chaos"
JOB_HANDLER = "history.job"
WORKFLOW = "history.order"
SAGA = "history.saga"
#: The integration event of an order (its outbox message).
MESSAGE = "history.order_placed"
#: The consumer name of the workload's inbox records.
CONSUMER = "history.consumer"
SIGNAL = "paid"

JOBS_PER_UNIT = 100
ORDERS_PER_UNIT = 20
RUNS_PER_UNIT = 5
SAGAS_PER_UNIT = 2
#: Activity items per run (a ``map``).
ITEMS_PER_RUN = 2
#: Seconds a run sleeps between its first and its last steps.
RUN_SLEEP = 1.0
#: The saga's steps, and those with a compensation.
SAGA_STEPS = ("reserve", "charge", "ship")
COMPENSATED_STEPS = ("reserve", "charge")
#: The inline steps of a run, in order.
RUN_STEPS = ("reserve", "after-sleep", "payment")
#: ``history.rated``: at most this many starts in any window of so many seconds.
RATE_COUNT = 6
RATE_SECONDS = 3
#: The period of the ``history-tick`` schedule, in seconds.
TICK_SECONDS = 2


@dataclass(frozen=True, slots=True)
class Unit:
    """The ids of unit ``number``."""

    number: int

    def job_ids(self) -> list[str]:
        return [f"j-{self.number}-{i}" for i in range(JOBS_PER_UNIT)]

    def delay(self, job_index: int) -> float | None:
        """Seconds job ``job_index`` waits before it may start (one in ten), else None."""
        if job_index % 10 != 3:
            return None
        return 1.0 + (self.number + job_index) % 3

    def orders(self) -> list[tuple[str, str]]:
        """(order number, run id or "") of each order."""
        return [
            (f"o-{self.number}-{k}", f"r-{self.number}-{k}" if k < RUNS_PER_UNIT else "")
            for k in range(ORDERS_PER_UNIT)
        ]

    def sagas(self) -> list[tuple[str, bool]]:
        """(saga key, whether it fails at its last step) of each saga."""
        return [
            (f"s-{self.number}-{k}", (self.number * SAGAS_PER_UNIT + k) % 4 == 3)
            for k in range(SAGAS_PER_UNIT)
        ]


def units(count: int) -> list[Unit]:
    return [Unit(n) for n in range(count)]
