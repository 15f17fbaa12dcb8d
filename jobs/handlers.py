"""Handlers: the registry (`@job_handler`), the context a handler receives, and the
automatic retry policy.

Handlers are found by their registered name and version only — never by importing a
path read from stored or user data. The worker imports each installed app's
``tasks`` module (``JOBS["AUTODISCOVER_MODULE"]``) so that the decorators run.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.module_loading import autodiscover_modules

from ledon.errors import format_error, storable_text
from ledon.naming import did_you_mean, other_definition

from . import validation
from .conf import jobs_settings
from .context import JobContext as JobContext  # public here too: jobs.handlers.JobContext
from .exceptions import InvalidInput, JobsConfigurationError, UnknownHandler
from .flow_control import Limits, declared_handler_limits, set_halting_handlers, set_handler_limits
from .retry import PermanentFailure as PermanentFailure  # public here too
from .retry import RetryPolicy as RetryPolicy  # public here too
from .types import CancelReason

HandlerResult = str | None
SyncHandler = Callable[[JobContext], HandlerResult]
AsyncHandler = Callable[[JobContext], Awaitable[HandlerResult]]
Handler = SyncHandler | AsyncHandler


class Snooze(Exception):
    """Raise from a handler to run the job again ``seconds`` from now.

    Not a failure: the attempt is recorded as Snoozed, the job is Queued again for
    then, and the execution does not count against ``max_attempts`` (``ctx.attempt``
    stays the same on the next run; the attempt rows keep one number per execution).
    """

    def __init__(self, seconds: float) -> None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_SNOOZE_SECONDS
        ):
            raise InvalidInput(
                f"Snooze takes a number of seconds in [0, {MAX_SNOOZE_SECONDS}], got {seconds!r}"
            )
        self.seconds = float(seconds)
        super().__init__(f"snoozed for {self.seconds:g} s")


#: The longest snooze: one year.
MAX_SNOOZE_SECONDS = 366 * 86_400


class _Unset(enum.Enum):
    UNSET = "unset"


#: ``timeout`` not given: ``JOBS["JOB_TIMEOUT_SECONDS"]`` applies.
_DEFAULT_TIMEOUT = _Unset.UNSET


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
    #: Seconds before the handler is signalled to stop (None: never; unset:
    #: ``JOBS["JOB_TIMEOUT_SECONDS"]``).
    timeout: float | _Unset | None = field(default=_DEFAULT_TIMEOUT)
    #: Limits across every worker, for every version of this handler name.
    limits: Limits = field(default_factory=Limits)
    #: How many snoozes a job may take before its next one fails (None:
    #: ``JOBS["MAX_SNOOZES"]``).
    max_snoozes: int | None = field(default=None)
    #: The library's own plumbing (the workflow engine's advances): its jobs are
    #: staged by the library alone, and the jobs admin hides them unless asked.
    library: bool = field(default=False)
    #: A job of a sequence that ends Failed halts the sequence until an operator
    #: retries or cancels it.
    sequence_halts_on_failure: bool = field(default=False)

    def snooze_limit(self) -> int:
        """The snoozes a job of this handler may take (``max_snoozes`` or the setting)."""
        return jobs_settings().MAX_SNOOZES if self.max_snoozes is None else self.max_snoozes

    def retry_policy(self) -> RetryPolicy:
        return self.retry or RetryPolicy.from_settings()

    def timeout_seconds(self) -> float | None:
        """The timeout that applies to an attempt of this handler, in seconds."""
        if isinstance(self.timeout, _Unset):
            return jobs_settings().JOB_TIMEOUT_SECONDS
        return self.timeout

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
        if not self.is_async:
            return self.checked_result(call(ctx))
        coro = self.coroutine(ctx, call)
        if loop is None:
            return self.checked_result(asyncio.run(coro))
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        # A timeout cancels the coroutine on its loop.
        ctx._on_cancel(future.cancel, CancelReason.TIMEOUT)
        return self.checked_result(future.result())

    def coroutine(
        self, ctx: JobContext, call: Callable[[JobContext], Any] | None = None
    ) -> Coroutine[Any, Any, Any]:
        """This ``async def`` handler's coroutine for one attempt (``call``: the
        handler inside its middleware), not started."""
        coro = (call or self.func)(ctx)
        assert inspect.iscoroutine(coro)
        return coro

    def checked_result(self, result: Any) -> HandlerResult:
        """A handler's return value as its result reference: a ``TypeError`` unless
        it is a string or None."""
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
        # One rule for every stored error (the exception's type and message stay), in
        # this attempt's share of the job's total (max_attempts of them may fail).
        limit = validation.attempt_error_limit(ctx.claim.max_attempts)
        if self.format_error is None:
            error = format_error(exc, limit)
        else:
            error = storable_text(self.format_error(exc), limit)
        retry_at = None
        # A timeout is retried by the policy; a cancel request or the shutdown is not.
        if ctx.claim.attempts_left > 0 and not ctx.stopped_by_request:
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
    timeout: float | _Unset | None = _DEFAULT_TIMEOUT,
    max_running: int | None = None,
    max_running_per_scope: int | None = None,
    max_running_per_key: int | None = None,
    rate: tuple[int, float] | tuple[int, float, int] | None = None,
    rate_per_key: tuple[int, float] | tuple[int, float, int] | None = None,
    max_snoozes: int | None = None,
    library: bool = False,
    sequence_halts_on_failure: bool = False,
) -> Callable[[Handler], Handler]:
    """Register a function as the handler of ``name`` at ``version``.

    The function takes a :class:`JobContext` and returns an optional result
    reference (a string). ``async def`` functions run on the worker's event loop.
    Registering a different function under a taken (name, version) is an error.
    ``format_error`` replaces the worker's text for a failed attempt's error; what it
    returns is stored as every error is: NUL and lone surrogates escaped, and a text
    longer than the attempt's share of the job's error budget (100,000 characters
    for up to 10 attempts, less for more) keeps its start and end, its middle cut.

    ``timeout``: seconds an attempt may run before its handler is signalled to
    stop (``ctx.cancel_reason`` is ``CancelReason.TIMEOUT``); after
    ``JOBS["TIMEOUT_GRACE_SECONDS"]`` more the attempt fails with ``JobTimedOut``,
    retried by the retry policy. Default: ``JOBS["JOB_TIMEOUT_SECONDS"]``; None: none.

    ``max_running``, ``max_running_per_scope``, ``max_running_per_key``,
    ``rate=(count, seconds)`` and ``rate_per_key`` limit this handler name (all its
    versions) across every worker: Running attempts at once, the same per scope, the
    same per limit key (a submission's ``limit_key``), and the units of cost started
    (a job's ``cost``, 1 by default) in any window of ``seconds``, overall and per limit
    key. A rate's optional third element, ``(count, seconds, burst)``, makes it a token
    bucket that lets up to ``burst`` units start at once after a quiet spell. Jobs over
    a limit stay Queued; claims take others past them.

    ``max_snoozes``: times a job may ``raise Snooze`` over its life; the attempt
    that asks once more ends Failed naming the bound. Default:
    ``JOBS["MAX_SNOOZES"]``.

    ``library``: for the library's own apps, a handler of plumbing whose jobs only
    the library stages (the workflow engine's advances); the jobs admin lists them
    only when its "engine jobs" filter shows them.
    ``sequence_halts_on_failure``: a job of a sequence (``sequence_key``) that ends
    Failed keeps the sequence's later jobs waiting until an operator retries it or
    cancels it; by default the next one starts. Every version of a name says the same.
    """
    validation.name(name, "handler")
    validation.integer(version, "version", 1, 2**31 - 1)
    if not isinstance(timeout, _Unset) and timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise JobsConfigurationError(
                f"handler {name!r}: timeout must be a positive number of seconds or None, "
                f"got {timeout!r}"
            )
        timeout = float(timeout)
    limits = Limits(
        max_running=max_running,
        max_running_per_scope=max_running_per_scope,
        max_running_per_key=max_running_per_key,
        rate=rate,  # type: ignore[arg-type]  # checked into a Rate
        rate_per_key=rate_per_key,  # type: ignore[arg-type]
    )
    if max_snoozes is not None and (
        isinstance(max_snoozes, bool)
        or not isinstance(max_snoozes, int)
        or not 0 <= max_snoozes <= 1_000_000
    ):
        raise JobsConfigurationError(
            f"handler {name!r}: max_snoozes must be None or an int from 0 to 1000000, "
            f"got {max_snoozes!r}"
        )

    if not isinstance(sequence_halts_on_failure, bool):
        raise JobsConfigurationError(
            f"handler {name!r}: sequence_halts_on_failure must be True or False, "
            f"got {sequence_halts_on_failure!r}"
        )

    def decorator(func: Handler) -> Handler:
        spec = HandlerSpec(
            name,
            version,
            func,
            inspect.iscoroutinefunction(func),
            retry,
            format_error,
            timeout,
            limits,
            max_snoozes,
            library,
            sequence_halts_on_failure,
        )
        key = (name, version)
        with _lock:
            conflict = other_definition(_registry.get(key), func)
            if conflict is not None:
                raise JobsConfigurationError(
                    f"handler {name!r} version {version} is already registered by {conflict}"
                )
            for other in _registry.values():
                if other.name == name and other.version != version and other.limits != limits:
                    raise JobsConfigurationError(
                        f"handler {name!r} version {version} declares limits "
                        f"({limits.describe()}) that differ from version {other.version}'s "
                        f"({other.limits.describe()}): limits apply to every version of a "
                        "name, so declare the same ones"
                    )
                if (
                    other.name == name
                    and other.version != version
                    and other.sequence_halts_on_failure != sequence_halts_on_failure
                ):
                    raise JobsConfigurationError(
                        f"handler {name!r} version {version} says sequence_halts_on_failure="
                        f"{sequence_halts_on_failure}, version {other.version} says "
                        f"{other.sequence_halts_on_failure}: a sequence halts by the name"
                    )
            _registry[key] = spec
            _declare_limits()
            _note_halting()
        return func

    return decorator


def get_handler(name: str, version: int) -> HandlerSpec:
    """The registered handler, or :class:`~jobs.exceptions.UnknownHandler`."""
    spec = _registry.get((name, version))
    if spec is None:
        versions = sorted(v for (n, v) in _registry if n == name)
        known = (
            f" (registered versions: {versions})"
            if versions
            else did_you_mean(name, {n for n, _v in list(_registry)})
        )
        raise UnknownHandler(
            f"no handler registered for {name!r} version {version}{known}; "
            "is its app's tasks module imported by the worker?"
        )
    return spec


def registered_handlers() -> list[HandlerSpec]:
    return sorted(_registry.values(), key=lambda s: (s.name, s.version))


def library_handlers() -> frozenset[str]:
    """The names of the handlers registered with ``library=True``."""
    with _lock:
        return frozenset(spec.name for spec in _registry.values() if spec.library)


def handler_limits() -> Mapping[str, Limits]:
    """The limits of every registered handler name that has any."""
    return declared_handler_limits()


def _declare_limits() -> None:
    """Tell the store the registry's limits (called under the registry's lock)."""
    set_handler_limits({spec.name: spec.limits for spec in _registry.values() if spec.limits})


def _note_halting() -> None:
    """Tell the store which names halt their sequences (under ``_lock``)."""
    set_halting_handlers(
        frozenset(spec.name for spec in _registry.values() if spec.sequence_halts_on_failure)
    )


def unregister(name: str, version: int) -> None:
    """Remove a registration (for tests)."""
    with _lock:
        _registry.pop((name, version), None)
        _declare_limits()
        _note_halting()


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
    global _discovered
    autodiscover_modules(jobs_settings().AUTODISCOVER_MODULE)
    with _lock:
        hooks = list(_discovery_hooks)
    for hook in hooks:
        hook()
    _discovered = True


#: Whether this process ran :func:`autodiscover` (a worker does; a web process
#: usually not): only then does the registry know every handler the project has.
_discovered = False


def knows_every_handler() -> bool:
    """Whether the registry can tell a handler that does not exist from one whose
    module this process never imported: it ran :func:`autodiscover`."""
    return _discovered
