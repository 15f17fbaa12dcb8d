"""Signals of the job worker, for apps that run beside it in every ``run_jobs``
process (``sagas`` recovers unfinished saga instances there, SPEC S5).

Both are sent with ``sender=Worker`` and ``worker=<the Worker>``. A receiver that
raises is logged and does not stop the worker.
"""

from __future__ import annotations

from django.dispatch import Signal

#: A worker has started: its start-up recovery is done, it is about to claim jobs.
worker_started = Signal()

#: A worker is stopping: its handlers have ended (or were re-queued). Receivers stop
#: what they started for it; in ``burst`` mode they may first let it finish.
worker_stopping = Signal()
