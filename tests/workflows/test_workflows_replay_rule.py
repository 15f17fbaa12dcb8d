"""The replay rule, written once: a finished checkpoint (Succeeded or Failed) gives its
recorded value, or raises its recorded failure; any other runs its work."""

from __future__ import annotations

from typing import Any

import pytest

from workflows.exceptions import SignalTimeout, StepFailed
from workflows.replay import recorded
from workflows.types import FINISHED_STEP_STATUSES, Checkpoint, StepKind, StepStatus


def checkpoint(kind: StepKind, status: StepStatus, **fields: Any) -> Checkpoint:
    values: dict[str, Any] = {
        "pk": 1,
        "key": "k",
        "attempts": 1,
        "result_json": None,
        "error_type": "",
        "error": "",
        "wake_at": None,
        "item_count": 0,
        "child_id": None,
    }
    values.update(fields)
    return Checkpoint(kind=kind, status=status, **values)


def test_finished_means_succeeded_or_failed():
    assert {status for status in StepStatus if status.is_finished} == set(FINISHED_STEP_STATUSES)
    assert set(FINISHED_STEP_STATUSES) == {StepStatus.SUCCEEDED, StepStatus.FAILED}


@pytest.mark.parametrize("kind", list(StepKind))
def test_a_succeeded_checkpoint_gives_its_value_whatever_its_kind(kind):
    done = recorded(checkpoint(kind, StepStatus.SUCCEEDED, result_json='{"a": [1, null]}'))
    assert done is not None
    assert done.value == {"a": [1, None]}


def test_a_recorded_null_is_a_value_not_a_missing_record():
    done = recorded(checkpoint(StepKind.STEP, StepStatus.SUCCEEDED, result_json="null"))
    assert done is not None
    assert done.value is None


@pytest.mark.parametrize("kind", [StepKind.STEP, StepKind.ACTIVITY, StepKind.MAP, StepKind.CHILD])
def test_a_failed_checkpoint_raises_step_failed_with_its_cause(kind):
    failed = checkpoint(kind, StepStatus.FAILED, error_type="KeyError", error="'sku'")
    with pytest.raises(StepFailed) as raised:
        recorded(failed)
    assert (raised.value.key, raised.value.cause_type, raised.value.cause_message) == (
        "k",
        "KeyError",
        "'sku'",
    )


def test_a_failed_signal_wait_raises_its_timeout():
    with pytest.raises(SignalTimeout) as raised:
        recorded(checkpoint(StepKind.SIGNAL, StepStatus.FAILED, error_type="SignalTimeout"))
    assert raised.value.key == "k"


@pytest.mark.parametrize("status", [StepStatus.RUNNING, StepStatus.WAITING, StepStatus.CANCELLED])
def test_an_unfinished_checkpoint_has_no_recorded_outcome(status):
    assert recorded(checkpoint(StepKind.STEP, status)) is None
    assert recorded(None) is None
