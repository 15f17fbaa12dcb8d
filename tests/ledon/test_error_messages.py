"""Error messages read as sentences: the default message taken from a class docstring
carries none of the docstring's line breaks and indentation."""

from __future__ import annotations

import inspect

import pytest
from django.db import transaction

import jobs.backends.exceptions
import jobs.exceptions
import outbox.exceptions
import sagas.exceptions
from jobs import JobSubmission, stage_job, submit_job
from jobs.exceptions import AmbientTransactionError, TransactionRequiredError
from ledon.errors import DocumentedError
from outbox.exceptions import TransactionRequired
from outbox.inbox import consume


def _documented_errors() -> list[type[Exception]]:
    found = []
    for module in (jobs.exceptions, jobs.backends.exceptions, outbox.exceptions, sagas.exceptions):
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not issubclass(cls, DocumentedError):
                continue
            params = inspect.signature(cls.__init__).parameters
            required = [
                p
                for p in list(params.values())[1:]
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
            if not required:
                found.append(cls)
    return found


@pytest.mark.parametrize("cls", _documented_errors(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_default_messages_are_one_line_without_docstring_layout(cls: type[Exception]) -> None:
    message = str(cls())
    assert message, "every error has a default message"
    assert "\n" not in message
    assert "  " not in message


@pytest.mark.django_db(transaction=True)
def test_the_first_errors_a_new_user_meets_read_as_sentences() -> None:
    sub = JobSubmission.create("x.y")
    with transaction.atomic(), pytest.raises(AmbientTransactionError) as inside:
        submit_job("s", "j", sub)
    assert str(inside.value) == (
        "submit_job() runs in its own transaction and refuses to run inside an open "
        "transaction.atomic() block; use stage_job() to create the job as part of it."
    )
    with pytest.raises(TransactionRequiredError) as outside:
        stage_job("s", "j", sub)
    assert str(outside.value) == (
        "stage_job() must be called inside a transaction.atomic() block; use "
        "submit_job() to create a job on its own."
    )
    with pytest.raises(TransactionRequired) as no_tx, consume("billing", "m-1"):
        pass
    assert str(no_tx.value) == (
        "consume() must run inside transaction.atomic() or a unit of work, so that the "
        "inbox record commits or rolls back with the handler's work."
    )
