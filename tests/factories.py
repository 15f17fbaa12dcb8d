"""factory-boy factories for the values the job store accepts."""

from __future__ import annotations

from typing import Any

import factory

from jobs.types import JobSubmission


class JobSubmissionFactory(factory.Factory):
    """A valid ``JobSubmission``, built through ``JobSubmission.create`` like a caller would.

    The defaults are constant, so two submissions built with the same arguments are the
    same request (a duplicate, not a conflict).
    """

    class Meta:
        model = JobSubmission

    handler = "reports.generate"
    payload = factory.LazyFunction(lambda: {"month": "2026-11"})
    version = 1
    queue = "default"
    max_attempts = 1
    not_before = None
    priority = 0

    @classmethod
    def _build(cls, model_class: type[JobSubmission], *args: Any, **kwargs: Any) -> JobSubmission:
        return model_class.create(*args, **kwargs)

    @classmethod
    def _create(cls, model_class: type[JobSubmission], *args: Any, **kwargs: Any) -> JobSubmission:
        return model_class.create(*args, **kwargs)
