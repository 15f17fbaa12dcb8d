"""The test project with jobs alone: neither ``outbox`` nor ``sagas`` is installed,
nor the shop apps that use them. ``tests/jobs/test_jobs_alone.py`` runs the core of the
jobs suite with these settings, proving that jobs works without the other two apps.

Its test database has a name of its own, so that this run never meets the test
database of the suite that starts it.
"""

from pathlib import Path

from .settings import *  # noqa: F403
from .settings import DATABASES, INSTALLED_APPS

#: The apps left out: the two other apps, and the test project's apps built on them.
WITHOUT = {"outbox", "sagas", "testproject.shop", "testproject.orders", "testproject.fulfilment"}

INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in WITHOUT]

ROOT_URLCONF = "testproject.urls_jobs_only"

_default = DATABASES["default"]
if _default["ENGINE"] == "django.db.backends.sqlite3":
    _default["TEST"] = {"NAME": str(Path(_default["NAME"]).with_suffix(".jobs-only.sqlite3"))}
else:
    _default["TEST"] = {"NAME": f"test_{_default['NAME']}_jobs_only"}
