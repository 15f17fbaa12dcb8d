"""Errors of the tasks backend. Each is both a jobs error and a Django task error, so
code may catch either family."""

from __future__ import annotations

from ..exceptions import JobsError
from ..handlers import PermanentFailure
from .compat import TaskException


class TaskNotRegistered(JobsError, TaskException, LookupError):
    """The task is not registered in this process: define it with @task in a module
    this process imports (an app's tasks module, or the backend's OPTIONS["MODULES"])."""


class TaskInterrupted(JobsError, TaskException):
    """The attempt was interrupted before the task finished (its worker stopped or
    lost its lease)."""


class InvalidReturnValue(PermanentFailure, TypeError):
    """The task's return value cannot be stored: it must be JSON and at most
    100,000 characters once serialised. The task is not run again for this."""
