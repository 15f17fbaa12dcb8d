"""django-ledon workflows: durable, replayed workflow runs driven by ``run_jobs``.

A ``@workflow`` body runs from the top at every advance of a run; each checkpoint
(``wf.step``, ``map``, ``sleep``, ``wait_for_signal``, ``child``, ``start``,
``start_child``, ``now``) is recorded
under its key and returns its recorded value on replay. Runs are advanced by jobs of
the workflows' own handler, activities run as jobs of their own name, so the jobs'
workers, limits, retries and crash recovery carry everything; no new process.

Modules:

- ``registry`` — ``@workflow`` (name, version) and ``@activity`` definitions.
- ``context`` — ``WorkflowContext``: what a body receives; it checks each checkpoint
  call and hands it to its part: ``inline`` (inline steps), ``activities``
  (activities and maps), ``waits`` (timers, signals, children), all on one
  ``replay`` (the replay rule, the fence, the recorded order: ``determinism``);
  ``handles`` — activities and children started side by side (``wf.start``,
  ``wf.start_child``) and the waits for them (``result()``, ``wf.gather``).
- ``engine`` — advancing a run (one driver at a time, fenced) and running an item.
- ``handlers`` — the job handlers: ``workflows.advance`` and one per activity.
- ``receivers`` — what the jobs' signals tell the workflows (an engine job that ended
  for good, or was cancelled, ends what it was staged for).
- ``api`` — ``start_workflow``, ``stage_workflow``, ``send_signal``, ``WorkflowScope``.
- ``store`` — every state transition, one guarded statement each, a package by
  concept (creating, driving, checkpoints, items, signalling, control, retention,
  reads…), returning frozen values.
- ``models`` / ``types`` / ``exceptions`` / ``conf`` / ``checks`` / ``validation`` —
  tables, values, errors, the ``WORKFLOWS`` setting, ``workflows.W001``, input rules.
- ``observability`` (``hooks``, ``metrics``, ``reads``) — spans and signals, and the optional
  Prometheus layer (``WORKFLOWS["TRACING"]``, ``WORKFLOWS["METRICS"]``).
- ``testing`` — run workflows to completion in your tests, with a movable clock.
- ``upkeep`` — beside every ``run_jobs`` worker, deletes finished runs past the
  retention, and ends the items whose job ended without recording them;
  ``manage.py purge_workflows`` deletes on demand.

The errors callers and bodies catch are public here too: ``WorkflowError`` (the root
of every error of the app), ``StepFailed`` and ``SignalTimeout`` (raised in a body),
``WorkflowIdentityConflict``, ``RunNotFound`` and ``SignalConflict``.

Public names are imported lazily so that listing ``"workflows"`` in
``INSTALLED_APPS`` never imports models before the app registry is ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import exported, lazy_attributes

if TYPE_CHECKING:  # for type checkers; ``as`` marks each name as re-exported
    from .api import WorkflowScope as WorkflowScope
    from .api import send_signal as send_signal
    from .api import stage_workflow as stage_workflow
    from .api import start_workflow as start_workflow
    from .context import WorkflowContext as WorkflowContext
    from .context import current_activity as current_activity
    from .exceptions import RunNotFound as RunNotFound
    from .exceptions import SignalConflict as SignalConflict
    from .exceptions import SignalTimeout as SignalTimeout
    from .exceptions import StepFailed as StepFailed
    from .exceptions import WorkflowError as WorkflowError
    from .exceptions import WorkflowIdentityConflict as WorkflowIdentityConflict
    from .handles import StepHandle as StepHandle
    from .registry import activity as activity
    from .registry import workflow as workflow
    from .types import CancelOutcome as CancelOutcome
    from .types import RunSnapshot as RunSnapshot
    from .types import RunStatus as RunStatus
    from .types import SignalOutcome as SignalOutcome
    from .types import StepKind as StepKind
    from .types import StepSnapshot as StepSnapshot
    from .types import StepStatus as StepStatus
    from .types import Wait as Wait
    from .types import WaitKind as WaitKind

_LAZY = exported(
    {
        "api": ("WorkflowScope", "send_signal", "stage_workflow", "start_workflow"),
        "context": ("WorkflowContext", "current_activity"),
        "exceptions": (
            "RunNotFound",
            "SignalConflict",
            "SignalTimeout",
            "StepFailed",
            "WorkflowError",
            "WorkflowIdentityConflict",
        ),
        "handles": ("StepHandle",),
        "registry": ("activity", "workflow"),
        "types": (
            "CancelOutcome",
            "RunSnapshot",
            "RunStatus",
            "SignalOutcome",
            "StepKind",
            "StepSnapshot",
            "StepStatus",
            "Wait",
            "WaitKind",
        ),
    }
)
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
