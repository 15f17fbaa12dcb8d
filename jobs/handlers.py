"""Handlers: the registry (`@job_handler`), the context a handler receives, and the
automatic retry policy.

Handlers are found by their registered name and version only — never by importing a
path read from stored or user data (J13). The worker imports each installed app's
``tasks`` module (``JOBS["AUTODISCOVER_MODULE"]``) so that the decorators run.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.utils.module_loading import autodiscover_modules

from ledon.backoff import RetryPace
from ledon.errors import format_error

from . import validation
from .conf import jobs_settings
from .exceptions import JobCancelled, JobsConfigurationError, UnknownHandler
from .types import Claim

HandlerResult = str | None
SyncHandler = Callable[["JobContext"], HandlerResult]
AsyncHandler = Callable[["JobContext"], Awaitable[HandlerResult]]
Handler = SyncHandler | AsyncHandler


class PermanentFailure(Exception):
    """Raise from a handler to fail the job without any automatic retry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with jitter for automatic retries (J10 through the executor).

    The delay before attempt ``n + 1`` is ``base_delay * factor ** (n - 1)``, capped at
    ``max_delay``, then spread by ``± jitter`` (a ratio). Retries never go beyond the
    job's ``max_attempts``; ``retry_on`` limits which exceptions are retried.
    """

    base_delay: float = 2.0
    factor: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.25
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.base_delay < 0 or self.factor < 1 or self.max_delay < 0:
            raise JobsConfigurationError(
                "retry policy needs base_delay >= 0, factor >= 1 and max_delay >= 0"
            )
        if not 0 <= self.jitter < 1:
            raise JobsConfigurationError("retry policy jitter must be in [0, 1)")

    @classmethod
    def from_settings(cls) -> RetryPolicy:
        pace = RetryPace.from_settings(jobs_settings())
        return cls(base_delay=pace.base, factor=pace.factor, max_delay=pace.cap, jitter=pace.jitter)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        pace = RetryPace(self.base_delay, self.factor, self.max_delay, self.jitter)
        return pace.delay(attempt, rng)

    def retry_at(self, attempt: int, now: datetime, exc: BaseException) -> datetime | None:
        """When to run again after ``exc`` ended ``attempt``, or None for no retry."""
        if isinstance(exc, PermanentFailure | JobCancelled) or not isinstance(exc, self.retry_on):
            return None
        return now + timedelta(seconds=self.delay(attempt))


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    name: str
    version: int
    func: Handler
    is_async: bool
    retry: RetryPolicy | None = field(default=None)
    #: Turns the exception that failed an attempt into the stored error text
    #: (default: :func:`format_error`).
    format_error: Callable[[BaseException], str] | None = field(default=None)

    def retry_policy(self) -> RetryPolicy:
        return self.retry or RetryPolicy.from_settings()

    def invoke(
        self,
        ctx: JobContext,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        call: Callable[[JobContext], Any] | None = None,
    ) -> HandlerResult:
        """Run the handler for one attempt and return its result reference.

        ``call`` is what runs instead of the bare handler, in the handler's form: the
        handler inside the ``JOBS["MIDDLEWARE"]`` chain, which
        :func:`jobs.attempts.run_attempt` passes (see :mod:`jobs.middleware`). An
        ``async def`` handler runs on ``loop`` (or a fresh loop); a result that is
        neither a string nor None raises ``TypeError``.
        """
        call = call or self.func
        if self.is_async:
            coro = call(ctx)
            assert inspect.iscoroutine(coro)
            if loop is None:
                result = asyncio.run(coro)
            else:
                result = asyncio.run_coroutine_threadsafe(coro, loop).result()
        else:
            result = call(ctx)
        if result is not None and not isinstance(result, str):
            raise TypeError(
                f"handler {self.name!r} returned {type(result).__name__}; "
                "a result reference must be a str or None"
            )
        return result

    def failure(
        self, ctx: JobContext, exc: BaseException, now: datetime
    ) -> tuple[str, datetime | None]:
        """The error text to store for a failed attempt, and when to retry it (None:
        no automatic retry — no attempts left, cancellation, or the policy says no)."""
        error = (self.format_error or format_error)(exc)
        retry_at = None
        if ctx.claim.attempts_left > 0 and not ctx.cancel_requested:
            policy = ctx.retry_policy or self.retry_policy()
            retry_at = policy.retry_at(ctx.attempt, now, exc)
        return error, retry_at


_registry: dict[tuple[str, int], HandlerSpec] = {}
_lock = threading.Lock()


def job_handler(
    name: str,
    *,
    version: int = 1,
    retry: RetryPolicy | None = None,
    format_error: Callable[[BaseException], str] | None = None,
) -> Callable[[Handler], Handler]:
    """Register a function as the handler of ``name`` at ``version``.

    The function takes a :class:`JobContext` and returns an optional result
    reference (a string). ``async def`` functions run on the worker's event loop.
    Registering a different function under a taken (name, version) is an error.
    ``format_error`` replaces the worker's text for a failed attempt's error; it
    must return at most 100,000 characters of valid text without NUL.
    """
    validation.name(name, "handler")
    validation.integer(version, "version", 1, 2**31 - 1)

    def decorator(func: Handler) -> Handler:
        spec = HandlerSpec(
            name, version, func, inspect.iscoroutinefunction(func), retry, format_error
        )
        key = (name, version)
        with _lock:
            existing = _registry.get(key)
            if existing is not None and _qualified(existing.func) != _qualified(func):
                raise JobsConfigurationError(
                    f"handler {name!r} version {version} is already registered "
                    f"by {_qualified(existing.func)}"
                )
            _registry[key] = spec
        return func

    return decorator


def _qualified(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def get_handler(name: str, version: int) -> HandlerSpec:
    """The registered handler, or :class:`~jobs.exceptions.UnknownHandler`."""
    spec = _registry.get((name, version))
    if spec is None:
        versions = sorted(v for (n, v) in _registry if n == name)
        known = f" (registered versions: {versions})" if versions else ""
        raise UnknownHandler(
            f"no handler registered for {name!r} version {version}{known}; "
            "is its app's tasks module imported by the worker?"
        )
    return spec


def registered_handlers() -> list[HandlerSpec]:
    return sorted(_registry.values(), key=lambda s: (s.name, s.version))


def unregister(name: str, version: int) -> None:
    """Remove a registration (for tests)."""
    with _lock:
        _registry.pop((name, version), None)


_discovery_hooks: list[Callable[[], None]] = []


def register_autodiscovery(hook: Callable[[], None]) -> None:
    """Have :func:`autodiscover` call ``hook`` after importing the apps' task modules.

    The adapters built on this registry plug in here without the registry knowing
    them: the ``django.tasks`` backend imports its ``OPTIONS["MODULES"]`` (wired in
    ``JobsConfig.ready``). Registering a hook twice keeps one.
    """
    with _lock:
        if hook not in _discovery_hooks:
            _discovery_hooks.append(hook)


def autodiscover() -> None:
    """Import ``<app>.<AUTODISCOVER_MODULE>`` for every installed app, then run the
    hooks of :func:`register_autodiscovery` (the task modules named by each
    ``jobs.backends.JobsBackend`` in the ``TASKS`` setting)."""
    autodiscover_modules(jobs_settings().AUTODISCOVER_MODULE)
    with _lock:
        hooks = list(_discovery_hooks)
    for hook in hooks:
        hook()


class JobContext:
    """What a handler gets: the parsed payload, identity, progress reporting, and a
    cancellation signal it can poll (``cancel_requested``) or wait on.

    ``cancel_requested`` becomes true when the job's cancellation is requested
    (``JobScope.cancel``) and when the worker is shutting down; the worker keeps it
    current while the handler runs.
    """

    def __init__(
        self,
        claim: Claim,
        *,
        progress: Callable[[str, float, str | None], bool] | None = None,
    ) -> None:
        self.claim = claim
        self.payload: Any = claim.payload
        self._progress = progress
        self._cancel = threading.Event()
        self._shutdown = threading.Event()
        self._stored_cancel = False
        #: A handler may set this to choose the retry policy for this attempt's
        #: failure (it overrides the handler's registered policy).
        self.retry_policy: RetryPolicy | None = None

    # identity
    @property
    def job_id(self) -> str:
        return self.claim.job_id

    @property
    def scope_hash(self) -> str:
        return self.claim.scope_hash

    @property
    def attempt(self) -> int:
        return self.claim.attempt

    @property
    def max_attempts(self) -> int:
        return self.claim.max_attempts

    @property
    def token(self) -> str:
        return self.claim.token

    @property
    def handler(self) -> str:
        return self.claim.handler

    @property
    def version(self) -> int:
        return self.claim.handler_version

    @property
    def queue(self) -> str:
        return self.claim.queue

    @property
    def worker_id(self) -> str:
        return self.claim.worker_id

    # progress
    def report_progress(self, value: float, message: str | None = None) -> bool:
        """Record progress (a percentage, never going down). False if the attempt is
        no longer current or its cancellation was requested."""
        if self._progress is None:
            # Not at the top: handlers are imported by task modules (and the tasks
            # backend) that may load before the app registry is ready, and the store
            # imports the models.
            from . import store

            return store.report_progress(self.token, value, message)
        return self._progress(self.token, value, message)

    async def areport_progress(self, value: float, message: str | None = None) -> bool:
        """The async form of :meth:`report_progress` (runs on a helper thread)."""

        def report() -> bool:
            try:
                return self.report_progress(value, message)
            finally:
                # The helper thread is pooled: never leave a connection open on it.
                connections.close_all()

        return await asyncio.to_thread(report)

    # cancellation
    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    @property
    def shutdown_requested(self) -> bool:
        """True when the worker, not the user, asked the handler to stop."""
        return self._shutdown.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~jobs.exceptions.JobCancelled` if the handler should stop."""
        if self._cancel.is_set():
            raise JobCancelled()

    def wait_for_cancel(self, timeout: float | None = None) -> bool:
        """Block until cancellation is signalled or ``timeout`` passes; True if signalled."""
        return self._cancel.wait(timeout)

    async def await_for_cancel(self, timeout: float | None = None) -> bool:
        """The async form of :meth:`wait_for_cancel` (Django's ``a`` prefix)."""
        return await asyncio.to_thread(self._cancel.wait, timeout)

    async def await_cancel(self, timeout: float | None = None) -> bool:
        """Deprecated alias of :meth:`await_for_cancel` (the name it first shipped
        under); it warns and will be removed in a later release."""
        warnings.warn(
            "JobContext.await_cancel() is deprecated; use await_for_cancel()",
            DeprecationWarning,
            stacklevel=2,
        )
        return await self.await_for_cancel(timeout)

    # the worker's side
    def signal_cancel(self, *, shutdown: bool = False) -> None:
        if shutdown:
            self._shutdown.set()
        else:
            self._stored_cancel = True
        self._cancel.set()

    @property
    def stopped_by_shutdown(self) -> bool:
        return self._shutdown.is_set() and not self._stored_cancel
