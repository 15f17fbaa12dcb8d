"""``JOBS["MIDDLEWARE"]``: callables that wrap every handler invocation, the way
Django's middleware wraps views.

A middleware is a factory: it is called once with ``call_next`` — the next middleware,
or the handler itself — and returns the callable that runs for each attempt::

    def timing(call_next):
        def middleware(ctx):                # ctx: jobs.JobContext
            started = time.monotonic()
            try:
                return call_next(ctx)       # the handler's result reference
            finally:
                log.info("%s took %.3f s", ctx.handler, time.monotonic() - started)
        return middleware

**Order.** The first entry of ``JOBS["MIDDLEWARE"]`` is the outermost: it runs first
before the handler and last after it. With ``JOBS["TRACING"]`` and ``JOBS["METRICS"]``
the built-in middlewares come before the listed ones, tracing outermost, so that the
span and the run time include what the project's middleware does.

**Sync and async.** A chain has the form of its handler. For a ``def`` handler every
middleware is called with a plain ``call_next`` and must return a plain callable. For an
``async def`` handler, a middleware marked ``async_capable`` (Django's
:func:`~django.utils.decorators.sync_and_async_middleware` or
:func:`~django.utils.decorators.async_only_middleware`) is called with a coroutine
function and must return one (``inspect.iscoroutinefunction(call_next)`` tells which
form it got); a sync-only middleware still wraps async handlers: it runs on a helper
thread and its ``call_next`` waits for the coroutine on the worker's event loop
(:mod:`asgiref.sync`, as Django does). A middleware marked ``async_only_middleware``
cannot wrap a ``def`` handler: that is a configuration error.

**Exceptions.** What the handler raises goes through every middleware on its way out:
a middleware may catch it, add to it or replace it. Whatever leaves the outermost
middleware is what the worker sees: an exception fails the attempt (and is retried per
the handler's policy — raise :class:`~jobs.handlers.PermanentFailure` to stop that); a
value is the attempt's result reference (a ``str`` or None, else ``TypeError``). A
middleware that raises, or returns, without calling ``call_next`` has the same effect,
and the handler does not run.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from asgiref.sync import async_to_sync, sync_to_async
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from ledon.observability import metrics_enabled

from .conf import jobs_settings
from .exceptions import JobsConfigurationError

if TYPE_CHECKING:
    from .handlers import HandlerResult, HandlerSpec, JobContext

    SyncCall = Callable[[JobContext], HandlerResult]
    AsyncCall = Callable[[JobContext], Awaitable[HandlerResult]]

#: A middleware: ``factory(call_next) -> call``.
Middleware = Callable[[Callable[..., Any]], Callable[..., Any]]

#: The built-in middlewares ``JOBS["TRACING"]`` and ``JOBS["METRICS"]`` put first.
TRACING_MIDDLEWARE = "jobs.observability.tracing.tracing_middleware"
METRICS_MIDDLEWARE = "jobs.observability.metrics.metrics_middleware"

#: Built chains by handler (name, version, function) and whether the metrics were on.
_chains: dict[tuple[str, int, Callable[..., Any], bool], Callable[..., Any]] = {}
_lock = threading.Lock()


def configured_paths() -> list[str]:
    """The dotted paths of the chain, outermost first: the built-ins the settings turn
    on (the metrics' also when ``--metrics-port`` turned the jobs' metrics on), then
    ``JOBS["MIDDLEWARE"]``."""
    settings = jobs_settings()
    paths = []
    if settings.TRACING:
        paths.append(TRACING_MIDDLEWARE)
    if settings.METRICS or metrics_enabled("jobs"):
        paths.append(METRICS_MIDDLEWARE)
    paths.extend(path for path in settings.MIDDLEWARE if path not in paths)
    return paths


def load(paths: Sequence[str]) -> list[Middleware]:
    """Import each middleware; a path that does not import, or names something that is
    not callable, is a :class:`~jobs.exceptions.JobsConfigurationError`."""
    loaded = []
    for path in paths:
        try:
            factory = import_string(path)
        except ImportError as exc:
            raise JobsConfigurationError(
                f"JOBS['MIDDLEWARE']: cannot import {path!r}: {exc}"
            ) from None
        if not callable(factory):
            raise JobsConfigurationError(f"JOBS['MIDDLEWARE']: {path!r} is not callable")
        loaded.append(factory)
    return loaded


def build(
    handler: Callable[..., Any], *, is_async: bool, middlewares: Sequence[Middleware]
) -> Callable[..., Any]:
    """``handler`` wrapped by ``middlewares`` (outermost first), in the handler's form."""
    call: Callable[..., Any] = handler
    for factory in reversed(middlewares):
        call = _async_layer(factory, call) if is_async else _sync_layer(factory, call)
    return call


def _sync_layer(factory: Middleware, call_next: SyncCall) -> SyncCall:
    if not getattr(factory, "sync_capable", True):
        raise JobsConfigurationError(
            f"JOBS['MIDDLEWARE']: {_name(factory)} is async only and cannot wrap a "
            "def handler (mark it sync_and_async_middleware and accept a plain call_next)"
        )
    call = factory(call_next)
    if inspect.iscoroutinefunction(call):
        raise JobsConfigurationError(
            f"JOBS['MIDDLEWARE']: {_name(factory)} returned a coroutine function for a def handler"
        )
    return cast("SyncCall", call)


def _async_layer(factory: Middleware, call_next: AsyncCall) -> AsyncCall:
    if getattr(factory, "async_capable", False):
        call = factory(call_next)
        if not inspect.iscoroutinefunction(call):
            raise JobsConfigurationError(
                f"JOBS['MIDDLEWARE']: {_name(factory)} is async capable but returned a "
                "plain function for an async handler"
            )
        return cast("AsyncCall", call)
    # A sync-only middleware: its code runs on a helper thread, and its call_next
    # runs the rest of the chain on the event loop and waits for it.
    sync_call = factory(async_to_sync(call_next))
    return cast("AsyncCall", sync_to_async(sync_call, thread_sensitive=False))


def _name(factory: Middleware) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', factory)!s}"


def chain_for(spec: HandlerSpec) -> Callable[..., Any]:
    """The callable an attempt of ``spec`` runs: its handler inside the configured
    middleware chain (built once per handler and settings)."""
    # The metrics can be turned on after a chain was built (``--metrics-port`` starts
    # its server once the worker exists): a chain built without them is not reused.
    key = (spec.name, spec.version, spec.func, metrics_enabled("jobs"))
    chain = _chains.get(key)
    if chain is None:
        chain = build(spec.func, is_async=spec.is_async, middlewares=load(configured_paths()))
        with _lock:
            _chains[key] = chain
    return chain


def reset() -> None:
    """Forget the built chains (the settings changed)."""
    with _lock:
        _chains.clear()


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "JOBS":
        reset()
