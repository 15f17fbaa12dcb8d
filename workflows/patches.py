"""Patch markers: changing the body of a version while runs of it are in flight.

``if wf.patched("tax-2027"):`` guards the new code. A run that reaches the marker for
the first time (nothing recorded beyond it) takes the new path, and the marker is
recorded (a checkpoint of kind ``patch`` under the key ``"patch:" + patch_id``), so
every later replay of that run takes it again. A run that replays a part it had
already passed under the older code (it has recorded checkpoints beyond this point)
gets False and keeps the old path, recording nothing: old runs keep the old path,
new runs take the new one, in one version.

A marker stands outside the order rule (:mod:`workflows.determinism`): once no run
in flight predates a patch, the call can be removed and the new code kept
unguarded; the markers recorded by earlier runs are then skipped without error.
"""

from __future__ import annotations

from . import validation
from .replay import Replay
from .types import StepKind, StepStatus

#: What a patch marker's key starts with (the rest is the patch id).
MARKER_PREFIX = "patch:"


def marker_key(patch_id: object) -> str:
    """The checkpoint key of patch ``patch_id``'s marker (InvalidInput for a patch id
    that is not a valid key, or one too long to be prefixed)."""
    checked = validation.key(patch_id, "patch id")
    return validation.key(MARKER_PREFIX + checked, "patch id (with its 'patch:' prefix)")


def patched(replay: Replay, key: str) -> bool:
    """Whether this run takes the new path of the patch whose marker is ``key`` (see
    :func:`marker_key` and the module docstring); records the marker the first time
    the run takes it."""
    if replay.step_of(key) is None and replay.beyond():
        return False
    checked, step = replay.reach(key, StepKind.PATCH)
    if step is None:
        step = replay.settle_alone(
            checked, None, StepKind.PATCH, StepStatus.SUCCEEDED, replay.now(), result_json="true"
        )
        replay.record(step)
    return True
