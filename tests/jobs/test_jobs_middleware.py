"""JOBS["MIDDLEWARE"]: the chain around every handler invocation — its order,
what exceptions do, sync and async handlers, in the worker and in jobs.testing."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from django.utils.decorators import async_only_middleware, sync_and_async_middleware

from jobs import JobScope, JobStatus, JobSubmission, submit_job
from jobs.handlers import PermanentFailure, RetryPolicy, job_handler, unregister
from jobs.testing import run_jobs_inline
from jobs.types import FinishOutcome
from jobs.worker import Worker

SCOPE = "middleware"
MW = __name__  # as pytest imported this module

#: What the middlewares and handlers did, in order (reset per test).
calls: list[str] = []


def _tracing(name):
    def factory(call_next):
        def middleware(ctx):
            calls.append(f"{name} before {ctx.job_id}")
            try:
                result = call_next(ctx)
            except Exception as exc:
                calls.append(f"{name} saw {type(exc).__name__}")
                raise
            calls.append(f"{name} after {result}")
            return result

        return middleware

    return factory


outer = _tracing("outer")
inner = _tracing("inner")


def suffixing(call_next):
    """Changes the handler's result on its way out."""

    def middleware(ctx):
        return f"{call_next(ctx)}+suffix"

    return middleware


def short_circuit(call_next):
    """Never calls the handler."""

    def middleware(ctx):
        calls.append("short-circuit")
        return "from middleware"

    return middleware


def refusing(call_next):
    """Fails every attempt before the handler runs, permanently."""

    def middleware(ctx):
        raise PermanentFailure(f"refused {ctx.handler}")

    return middleware


def swallowing(call_next):
    """Turns a handler's ValueError into a result."""

    def middleware(ctx):
        try:
            return call_next(ctx)
        except ValueError as exc:
            return f"recovered: {exc}"

    return middleware


@sync_and_async_middleware
def both(call_next):
    if inspect.iscoroutinefunction(call_next):

        async def async_middleware(ctx):
            calls.append(f"both async, on the loop: {_on_loop()}")
            return await call_next(ctx)

        return async_middleware

    def middleware(ctx):
        calls.append("both sync")
        return call_next(ctx)

    return middleware


@async_only_middleware
def async_only(call_next):
    async def middleware(ctx):
        return await call_next(ctx)

    return middleware


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture(autouse=True)
def handlers():
    calls.clear()

    @job_handler("mw.ok")
    def ok(ctx):
        calls.append("handler")
        return "result"

    @job_handler("mw.boom", retry=RetryPolicy(base_delay=60, jitter=0))
    def boom(ctx):
        calls.append("handler")
        raise ValueError("boom")

    @job_handler("mw.async")
    async def run_async(ctx):
        calls.append(f"async handler, on the loop: {_on_loop()}")
        return "async result"

    yield
    for name in ("mw.ok", "mw.boom", "mw.async"):
        unregister(name, 1)


def submit(job_id: str, handler: str, **options) -> None:
    submit_job(SCOPE, job_id, JobSubmission.create(handler, **options))


def middleware(settings, *names: str) -> None:
    settings.JOBS = {**settings.JOBS, "MIDDLEWARE": [f"{MW}.{name}" for name in names]}


pytestmark = pytest.mark.django_db


def test_the_first_middleware_is_the_outermost(settings):
    middleware(settings, "outer", "inner")
    submit("a", "mw.ok")
    [run] = run_jobs_inline()
    assert run.outcome is FinishOutcome.SUCCEEDED
    assert calls == [
        "outer before a",
        "inner before a",
        "handler",
        "inner after result",
        "outer after result",
    ]


def test_a_middleware_can_change_the_result(settings):
    middleware(settings, "suffixing")
    submit("a", "mw.ok")
    run_jobs_inline()
    assert JobScope(SCOPE).get("a").result_ref == "result+suffix"


def test_an_exception_goes_through_every_middleware_and_fails_the_attempt(settings):
    middleware(settings, "outer", "inner")
    submit("b", "mw.boom", max_attempts=2)
    [run] = run_jobs_inline()
    assert run.outcome is FinishOutcome.REQUEUED  # retried per the handler's policy
    assert calls == ["outer before b", "inner before b", "handler", "inner saw ValueError",
                     "outer saw ValueError"]  # fmt: skip
    assert "ValueError: boom" in JobScope(SCOPE).get("b").error


def test_a_middleware_may_catch_the_handlers_exception(settings):
    middleware(settings, "outer", "swallowing")
    submit("b", "mw.boom")
    [run] = run_jobs_inline()
    assert run.outcome is FinishOutcome.SUCCEEDED
    assert JobScope(SCOPE).get("b").result_ref == "recovered: boom"
    assert calls[-1] == "outer after recovered: boom"


def test_a_middleware_that_does_not_call_next_replaces_the_handler(settings):
    middleware(settings, "outer", "short_circuit")
    submit("a", "mw.ok")
    run_jobs_inline()
    assert "handler" not in calls
    assert calls == ["outer before a", "short-circuit", "outer after from middleware"]
    assert JobScope(SCOPE).get("a").result_ref == "from middleware"


def test_a_middleware_that_raises_first_fails_the_attempt_and_the_handler_never_runs(settings):
    middleware(settings, "outer", "refusing")
    submit("a", "mw.ok", max_attempts=3)
    [run] = run_jobs_inline()
    assert run.outcome is FinishOutcome.FAILED  # PermanentFailure: no retry
    assert "handler" not in calls
    assert calls == ["outer before a", "outer saw PermanentFailure"]
    snap = JobScope(SCOPE).get("a")
    assert snap.status is JobStatus.FAILED
    assert "refused mw.ok" in snap.error


def test_sync_only_and_sync_and_async_middlewares_wrap_an_async_handler(settings):
    middleware(settings, "outer", "both")
    submit("c", "mw.async")
    [run] = run_jobs_inline()
    assert run.outcome is FinishOutcome.SUCCEEDED
    assert calls == [
        "outer before c",  # a sync-only middleware: on a helper thread
        "both async, on the loop: True",  # its async form, on the event loop
        "async handler, on the loop: True",
        "outer after async result",
    ]
    assert JobScope(SCOPE).get("c").result_ref == "async result"


def test_a_sync_and_async_middleware_uses_its_sync_form_for_a_def_handler(settings):
    middleware(settings, "both")
    submit("a", "mw.ok")
    run_jobs_inline()
    assert calls == ["both sync", "handler"]


def test_an_async_only_middleware_cannot_wrap_a_def_handler(settings):
    middleware(settings, "async_only")
    submit("a", "mw.ok")
    [run] = run_jobs_inline()
    assert run.outcome is FinishOutcome.FAILED
    assert "JobsConfigurationError" in run.error
    assert "async only and cannot wrap a def handler" in run.error
    assert "handler" not in calls


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (f"{MW}.outer", "must be a list of dotted paths"),
        ([""], "must be a list of dotted paths"),
    ],
)
def test_a_bad_setting_is_a_configuration_error(settings, value, message):
    from jobs.checks import check_jobs_settings

    settings.JOBS = {"MIDDLEWARE": value}
    [error] = check_jobs_settings()
    assert error.id == "jobs.E001"
    assert message in error.msg


def test_a_path_that_does_not_import_is_named_by_the_check_and_fails_the_attempt(settings):
    from jobs.checks import check_jobs_settings

    settings.JOBS = {"MIDDLEWARE": [f"{MW}.missing"]}
    [error] = check_jobs_settings()
    assert error.id == "jobs.E003"
    assert f"cannot import '{MW}.missing'" in error.msg
    submit("a", "mw.ok")
    [run] = run_jobs_inline()
    assert run.outcome is FinishOutcome.FAILED
    assert f"cannot import '{MW}.missing'" in JobScope(SCOPE).get("a").error
    assert calls == []


@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_the_chain_on_its_threads_and_its_event_loop(settings):
    middleware(settings, "outer", "both")
    submit("a", "mw.ok")
    submit("c", "mw.async")
    Worker(burst=True, listen=False, concurrency=2).run()
    assert JobScope(SCOPE).get("a").result_ref == "result"
    assert JobScope(SCOPE).get("c").result_ref == "async result"
    assert {"outer before a", "outer before c", "both sync"} <= set(calls)
    assert "both async, on the loop: True" in calls
    assert "async handler, on the loop: True" in calls
