"""Metrics and tracing are optional layers. No core module imports
prometheus-client or OpenTelemetry — only the modules that the settings (or
``--metrics-port``) load — and the apps start without them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The modules allowed to import them (loaded only when metrics or tracing are on).
OPTIONAL = {
    "ledon/prometheus.py",
    "ledon/otel.py",
    "jobs/observability/metrics.py",
    "jobs/observability/supervisor_metrics.py",
    "outbox/observability/metrics.py",
    "sagas/observability/metrics.py",
}
LIBRARIES = ("prometheus_client", "opentelemetry")


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_only_the_optional_modules_import_prometheus_client_or_opentelemetry():
    offenders = {}
    for package in ("ledon", "jobs", "outbox", "sagas"):
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            found = {n for n in imported(path) if n.split(".")[0] in LIBRARIES}
            if found and relative not in OPTIONAL:
                offenders[relative] = sorted(found)
    assert offenders == {}
    # And the optional ones do import them (the list above is not stale).
    assert all(any(n.split(".")[0] in LIBRARIES for n in imported(ROOT / p)) for p in OPTIONAL)


def test_the_apps_start_and_run_a_job_with_neither_library_importable(tmp_path):
    """A process where importing either library fails (as without the extras)."""
    script = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
            raise ImportError(f"{name} is not installed")

sys.meta_path.insert(0, Refuse())
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from jobs import JobSubmission, JobScope, submit_job
from jobs.testing import run_jobs_inline
submit_job("plain", "j-1", JobSubmission.create("demo.report", {"month": "2026-11"}))
[run] = run_jobs_inline()
print(run.outcome.value, JobScope("plain").get("j-1").result_ref)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("prometheus_client", "opentelemetry")))
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'plain.sqlite3'}",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["succeeded reports/2026-11.csv", "[]"]


@pytest.mark.parametrize(
    ("blocked", "key", "extra"),
    [("opentelemetry", "TRACING", "otel"), ("prometheus_client", "METRICS", "metrics")],
)
def test_a_setting_asking_for_a_missing_library_names_the_extra(monkeypatch, blocked, key, extra):
    """As without the extra: importing the library fails. The error says which extra
    installs it, and nothing is turned on."""
    from django.core.exceptions import ImproperlyConfigured

    import jobs.observability
    import ledon
    from ledon import observability, tracing

    monkeypatch.setitem(sys.modules, blocked, None)  # import raises ImportError
    # Each module is imported again, as in a fresh process: ``from ledon import
    # prometheus`` would find the package's attribute without looking at sys.modules.
    for package, name in ((ledon, "otel"), (ledon, "prometheus"), (jobs.observability, "metrics")):
        monkeypatch.delitem(sys.modules, f"{package.__name__}.{name}", raising=False)
        monkeypatch.delattr(package, name, raising=False)
    tracing.disable("jobs")
    with pytest.raises(
        ImproperlyConfigured, match=rf"JOBS\['{key}'\] needs .*django-ledon\[{extra}\]"
    ):
        observability.configure(
            "jobs",
            metrics=key == "METRICS",
            traced=key == "TRACING",
            metrics_module="jobs.observability.metrics",
        )
    assert tracing.tracer("jobs").enabled is False
    assert "jobs.observability.metrics" not in sys.modules


@pytest.mark.parametrize("label", ["jobs", "outbox", "sagas"])
def test_each_app_runs_on_its_own_config_with_its_layers_and_checks(label):
    from django.apps import apps

    from ledon.apps import LedonAppConfig
    from ledon.observability import OptionalLayers

    config = apps.get_app_config(label)
    # Django picks the app's own config only while apps.py names one AppConfig class.
    assert type(config).__module__ == f"{label}.apps"
    assert isinstance(config, LedonAppConfig)
    assert isinstance(config.optional_layers, OptionalLayers)
    assert config.optional_layers.component == label
    assert f"{label}.checks" in sys.modules
