"""Saga recovery inside ``run_jobs``: beside every job worker, a
:class:`~sagas.runner.SagaRunner` resumes unfinished saga instances, exactly as
``recover_sagas`` would — unless ``SAGAS["RECOVER_IN_WORKER"]`` is False, or no saga
is registered in the process (there is nothing it could resume, and nothing to say).

The runner's id is the worker's: a worker restarted with the same ``--worker-id``
takes over its runner's row in the workers registry as well as its own, instead of
leaving the old run's row to go silent.

Connected to the worker's signals when both apps are installed (``SagasConfig.ready``);
``jobs`` itself knows nothing of sagas. In ``--burst`` mode the runner takes part in
the worker's burst (:mod:`ledon.burst`): the burst is over once neither the worker
nor the runner finds anything to do, each after the last thing the other did, and
the worker waits for the runner to end; otherwise the runner stops with the worker
and releases the instance it drives after the current step.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ledon.beside import Beside
from ledon.burst import join_burst_of
from ledon.db import DatabaseNotMigrated

from .conf import sagas_settings
from .registry import registered_sagas

if TYPE_CHECKING:
    from .runner import SagaRunner
    from .types import SagaSnapshot

logger = logging.getLogger(__name__)

_beside: Beside[SagaRunner] = Beside("saga-recovery")


def start_recovery(sender: Any, worker: Any, **kwargs: Any) -> None:
    """``jobs.signals.worker_started``: start a saga runner beside ``worker``."""
    if not sagas_settings().RECOVER_IN_WORKER or not registered_sagas():
        return
    # Not at the top: a worker of a project without sagas never loads the runner.
    from .runner import SagaRunner

    def report(event: str, state: SagaSnapshot | None, detail: str) -> None:
        what = f"{state.name} {state.instance_id}" if state is not None else ""
        worker.report(f"saga {event}", " ".join(p for p in (what, detail) if p))

    # In a burst, the runner is one of its engines: the worker and it end together,
    # once neither has anything left (each may give the other work: a step stages a
    # job, a job starts a saga).
    member = join_burst_of(worker, "saga runner", lambda: runner.wake())
    runner = SagaRunner(
        runner_id=worker.worker_id,
        burst=worker.burst,
        burst_member=member,
        on_event=report,
        inline=False,
    )

    def run() -> None:
        try:
            runner.run()
        except DatabaseNotMigrated as exc:
            # The jobs' tables are there (the worker runs), the sagas' are not.
            logger.error("saga recovery does not run in this worker: %s", exc)
            worker.report("saga recovery off", str(exc).splitlines()[0])

    _beside.start(worker, runner, run)


def stop_recovery(sender: Any, worker: Any, **kwargs: Any) -> None:
    """``jobs.signals.worker_stopping``: stop (or, in burst mode, finish) the runner."""
    # A burst ends when nothing is left, saga instances included: the runner ends by
    # itself as the burst is over; wait for it.
    burst_end = worker.burst and not worker.stopping
    runner = _beside.stop(worker, timeout=None if burst_end else max(worker.shutdown_timeout, 1.0))
    if runner is not None:
        logger.warning(
            "saga runner %s is still in a step as the worker stops; its lease will "
            "expire and another runner will resume the instance",
            runner.runner_id,
        )
