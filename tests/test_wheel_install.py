"""A new user's first hour, for real: the wheel built from this tree, installed into a
new virtualenv outside the repository, driving a fresh ``django-admin startproject``
on the database of this test session (SQLite or PostgreSQL).

The virtualenv is built once per session, or once per CI run when
``LEDON_WHEEL_CACHE`` names a directory to keep it in (``scripts/test.sh`` does, so
that the SQLite and the PostgreSQL sessions share it).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import django
import pytest
from django.db import connection

from tests.support.procs import wait_until

# One xdist worker runs them all, so that one builds the virtualenv; building it
# (pip installing Django and psycopg) may take minutes on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel"), pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "jobs",
    "outbox",
    "sagas",
    "workflows",
    "ledon",
)


def _run(*args: str | Path, cwd: Path | None = None, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this tree, built from a copy (so no build files land in it)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    dist = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, source)
    [built] = dist.glob("django_ledon-*.whl")
    return built


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with the wheel and its [postgres] extra installed, and the
    Django of this session (each CI leg's): a user of Django 5.2 installs just this
    too, without the tasks backport."""
    # The wheel's contents, not its bytes: each build stamps its files with the time.
    content = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for member in sorted(archive.namelist()):
            content.update(member.encode() + b"\0" + archive.read(member))
    digest = content.hexdigest()[:16]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    name = f"venv-py{python}-django{django.get_version()}-{digest}"
    cache = os.environ.get("LEDON_WHEEL_CACHE")
    home = Path(cache) if cache else tmp_path_factory.mktemp("venvs")
    target = home / name
    with (home / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it
        if not (target / "ready").exists():
            shutil.rmtree(target, ignore_errors=True)  # a build that was cut short
            _run(sys.executable, "-m", "venv", target)
            _run(
                target / "bin" / "python",
                "-m",
                "pip",
                "install",
                "-q",
                f"{wheel}[postgres]",
                f"Django=={django.get_version()}",
            )
            (target / "ready").touch()
    return target


def test_the_wheel_ships_migrations_types_license_and_metadata(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for app in ("jobs", "outbox", "sagas", "workflows"):
        assert f"{app}/migrations/0001_initial.py" in names
        assert f"{app}/py.typed" in names
    assert "ledon/__init__.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "testproject/")) for n in names)
    [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
    metadata = zipfile.ZipFile(wheel).read(meta).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "extra ==" not in r] == ["Requires-Dist: Django<6.2,>=5.2"]
    assert any("cronsim" in r and 'extra == "cron"' in r for r in requires)
    assert any("django-tasks" in r and 'extra == "tasks-backport"' in r for r in requires)
    for version in ("5.2", "6.0", "6.1"):
        assert f"Classifier: Framework :: Django :: {version}" in metadata
    assert any("psycopg" in r and 'extra == "postgres"' in r for r in requires)
    assert any("django-environ" in r and 'extra == "demo"' in r for r in requires)
    assert "License-Expression: MIT" in metadata
    assert "Project-URL: Documentation, https://" in metadata
    assert "Project-URL: Source, https://" in metadata


# --------------------------------------------------------------------------- a project


TASKS_PY = """
from pathlib import Path

from jobs import JobContext, job_handler


@job_handler("shop.receipt", version=1)
def receipt(ctx: JobContext) -> str:
    ctx.report_progress(50, "writing")
    return f"receipts/{ctx.payload['order']}.txt"
"""

SUBMIT = """
from jobs import JobSubmission, submit_job

submit_job("shop-1", sys.argv[-1], JobSubmission.create("shop.receipt", {"order": 7}))
"""
STATUS = """
from jobs import JobScope

job = JobScope("shop-1").get(sys.argv[-1])
print(job.status, job.result_ref, job.attempt_count)
"""


@dataclass
class Project:
    """A ``startproject`` site with one app, run with the virtualenv's Python."""

    path: Path
    python: Path

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.python), "manage.py", *args],
            cwd=self.path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_clean_env(),
        )

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    def shell(self, code: str, *argv: str) -> str:
        """Run ``code`` as a script of the project (Django set up), with ``argv``."""
        script = self.path / "snippet.py"
        script.write_text(
            "import os, sys\nimport django\n"
            "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'mysite.settings')\n"
            "django.setup()\n" + code
        )
        done = subprocess.run(
            [str(self.python), str(script), *argv],
            cwd=self.path,
            capture_output=True,
            text=True,
            timeout=120,
            env=_clean_env(),
        )
        assert done.returncode == 0, f"{code}:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def _clean_env() -> dict[str, str]:
    """The environment without this repository's settings: the project's own only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_"))}
    env.pop("PYTHONPATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _database_settings(tmp: Path) -> Iterator[str]:
    """``DATABASES`` for the new project on this session's database, and clean-up."""
    if connection.vendor == "sqlite":
        yield textwrap.dedent(
            f"""
            DATABASES = {{
                "default": {{
                    "ENGINE": "django.db.backends.sqlite3",
                    "NAME": {str(tmp / "site.sqlite3")!r},
                    "OPTIONS": {{
                        "transaction_mode": "IMMEDIATE",
                        "timeout": 20,
                        "init_command": "PRAGMA journal_mode=WAL;",
                    }},
                }}
            }}
            """
        )
        return
    import psycopg

    s = connection.settings_dict
    server = {"host": s["HOST"], "port": s["PORT"], "user": s["USER"], "dbname": "postgres"}
    if s.get("PASSWORD"):
        server["password"] = s["PASSWORD"]
    name = f"fresh_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(**server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield textwrap.dedent(
            f"""
            DATABASES = {{
                "default": {{
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": {name!r},
                    "USER": {s["USER"]!r},
                    "PASSWORD": {s.get("PASSWORD") or ""!r},
                    "HOST": {s["HOST"]!r},
                    "PORT": {str(s["PORT"])!r},
                }}
            }}
            """
        )
    finally:
        with psycopg.connect(**server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def project(venv: Path, tmp_path: Path) -> Iterator[Project]:
    """``django-admin startproject mysite``, ``startapp shop`` with a tasks module,
    ``jobs`` and ``shop`` in INSTALLED_APPS, DATABASES on this session's database."""
    site = tmp_path / "mysite"
    site.mkdir()
    _run(venv / "bin" / "django-admin", "startproject", "mysite", site, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "manage.py", "startapp", "shop", cwd=site)
    (site / "shop" / "tasks.py").write_text(TASKS_PY)
    settings = site / "mysite" / "settings.py"
    databases = _database_settings(tmp_path)
    with settings.open("a") as out:
        out.write('\nINSTALLED_APPS += ["jobs", "shop"]\n' + next(databases))
    yield Project(site, python)
    next(databases, None)


def _no_traceback(output: str) -> None:
    assert "Traceback" not in output, output


def test_run_jobs_before_migrate_says_to_migrate(project: Project) -> None:
    done = project.run("run_jobs", "--burst", timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "migrate" in output
    _no_traceback(output)
    assert len(output.strip().splitlines()) <= 5, output


def test_startproject_to_a_running_worker(project: Project) -> None:
    project.ok("migrate", "--verbosity", "0")
    checked = project.ok("check")
    assert "System check identified no issues" in checked, checked

    project.shell(SUBMIT, "first")
    burst = project.ok("run_jobs", "--burst")
    _no_traceback(burst)
    assert project.shell(STATUS, "first").split() == ["succeeded", "receipts/7.txt", "1"]

    log = project.path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [str(project.python), "manage.py", "run_jobs", "-v", "2"],
            cwd=project.path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_clean_env(),
        )
    try:
        wait_until(lambda: "started queues=all" in log.read_text(), 60, "the worker")
        project.shell(SUBMIT, "second")
        wait_until(lambda: "succeeded job second" in log.read_text(), 60, "the second job")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    output = log.read_text()
    _no_traceback(output)
    assert "SIGTERM" in output
    assert project.shell(STATUS, "second").split()[0] == "succeeded"


def test_startprojects_default_sqlite_settings_are_warned_about(venv: Path, tmp_path: Path) -> None:
    site = tmp_path / "plain"
    site.mkdir()
    _run(venv / "bin" / "django-admin", "startproject", "plain", site, cwd=tmp_path)
    settings = site / "plain" / "settings.py"
    with settings.open("a") as out:
        out.write('\nINSTALLED_APPS += ["jobs"]\n')
    output = Project(site, venv / "bin" / "python").ok("check")
    assert "ledon.W001" in output
    assert "'transaction_mode': 'IMMEDIATE'" in output


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="Django 6 has django.tasks built in")
def test_on_django_5_2_the_tasks_backend_without_the_backport_is_a_check_error(
    project: Project,
) -> None:
    """``pip install django-ledon`` on Django 5.2 brings no tasks framework: the jobs
    app works (the test above), and a TASKS setting naming the backend is refused by
    ``manage.py check`` with the command that installs the backport."""
    settings = project.path / "mysite" / "settings.py"
    with settings.open("a") as out:
        out.write('\nTASKS = {"default": {"BACKEND": "jobs.backends.JobsBackend"}}\n')
    done = project.run("check")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "(jobs.E108)" in output
    assert "pip install 'django-ledon[tasks-backport]'" in output
    _no_traceback(output)
