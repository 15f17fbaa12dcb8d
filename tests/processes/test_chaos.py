"""The chaos run's short profile (``python -m chaos --profile short``; ``chaos/``):
2,000 jobs, 400 messages consumed through the inbox by ``consume_events`` over
RabbitMQ, 100 workflow runs and 40 sagas, on a private PostgreSQL, under a seeded
schedule of every kind of fault — SIGKILL, SIGTERM, PostgreSQL restarts (one during a
worker's start-up recovery, one while a dispatcher recovers its leased batch),
partitions and lost COMMIT replies. The checker's verdict must be clean: every effect
that must happen once happened once, every at-least-once effect at least once,
nothing lost, everything final within a lease plus 5 s of the last fault.

The verdict table is printed (``pytest -s``). ``LEDON_CHAOS_SEED`` draws another
schedule; a failure names its seed.
"""

from __future__ import annotations

import os

import pytest

from chaos.profiles import SHORT
from chaos.run import Run
from tests.support.brokers import broker, uses_broker

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.timeout(900)]

SEED = int(os.environ.get("LEDON_CHAOS_SEED", "1"))

#: How long the run waits for everything to be final after its last fault before it
#: gives up and says what was left: the short profile is final within seconds, and
#: the test's own timeout must leave room for the checker's verdict.
FINAL_TIMEOUT = 240.0


@uses_broker("rabbitmq")
def test_a_short_chaos_run_ends_with_a_clean_verdict(tmp_path):
    rabbit = broker("rabbitmq")
    said: list[str] = []
    outcome = Run(
        SHORT,
        seed=SEED,
        work_dir=tmp_path,
        rabbitmq_url=rabbit.address,
        say=said.append,
        final_timeout=FINAL_TIMEOUT,
    ).run()
    print(f"\n{outcome.render()}")
    timeline = "\n".join(said)
    assert outcome.ok, f"seed {SEED}:\n{outcome.render()}\n\n{timeline}"
