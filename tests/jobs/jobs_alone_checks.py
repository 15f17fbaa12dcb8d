"""Checks of the jobs-only run (``tests/jobs/test_jobs_alone.py`` passes this file last):
the run really had neither outbox nor sagas, and nothing it did imported them."""

from __future__ import annotations

import sys

from django.apps import apps
from django.conf import settings


def test_neither_outbox_nor_sagas_is_installed():
    assert settings.SETTINGS_MODULE == "testproject.settings_jobs_only"
    assert apps.is_installed("jobs")
    assert not apps.is_installed("outbox")
    assert not apps.is_installed("sagas")


def test_nothing_the_jobs_suite_did_imported_outbox_or_sagas():
    imported = sorted(m for m in sys.modules if m.split(".")[0] in ("outbox", "sagas"))
    assert imported == []
