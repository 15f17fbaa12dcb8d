"""What the read-only admins of jobs, outbox and sagas share: nothing is edited by
hand, and state changes are actions that go through each app's store, offered only
to staff with the model's change permission.

Every action is guarded by one permission, ``steer`` (Django asks the model admin's
``has_steer_permission``): the model's change permission.

:class:`ModelAdmin` and :class:`TabularInline` are Django's, subscriptable at run time
as they are in the type stubs (``ModelAdmin[Job]``), so that no admin module needs a
``TYPE_CHECKING`` switch of its own for its bases; :class:`ReadOnlyModelAdmin` is the
base of every read-only admin.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.db.models import Model
from django.http import HttpRequest

_Action = TypeVar("_Action", bound=Callable[..., Any])

#: Outcomes listed one by one after an action; the rest are counted.
MAX_LISTED = 10


def indented_json(value: Any, *, sort_keys: bool = True) -> str:
    """``value`` (JSON text, or a value already parsed) indented for reading on an admin
    page; text that is not JSON is shown as it is stored rather than hidden."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
        return json.dumps(parsed, indent=2, ensure_ascii=False, sort_keys=sort_keys)
    except ValueError:
        return str(value)


def fieldset_fields(fieldsets: Sequence[tuple[Any, Mapping[str, Any]]]) -> tuple[str, ...]:
    """The names of the fields ``fieldsets`` show, in order: the ``readonly_fields`` of
    an inspection page, where every field shown is read-only."""
    return tuple(
        name for _, options in fieldsets for name in options["fields"] if isinstance(name, str)
    )


#: The permission of every state-changing action (see ``has_steer_permission``).
STEER = "steer"


def state_action(description: str) -> Callable[[_Action], _Action]:
    """An admin action on the list and, from Django 6.1, on each object's own page,
    offered to users who may steer (:meth:`ReadOnlyAdminMixin.has_steer_permission`)."""
    location = getattr(admin, "ActionLocation", None)
    if location is None:  # pragma: no cover - Django 6.0 runs actions from the list only
        return admin.action(description=description, permissions=[STEER])
    return admin.action(
        description=description,
        permissions=[STEER],
        location=[location.CHANGE_LIST, location.CHANGE_FORM],
    )


class GrowingTableMixin:
    """The change list of a table that grows without bound: no count of every row on
    each page view, and 50 rows a page."""

    show_full_result_count = False
    list_per_page = 50


class ReadOnlyAdminMixin:
    """No adding, editing or deleting by hand; ``has_steer_permission`` guards the
    actions."""

    opts: Any

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The view page still works: Django shows it read-only to users with the
        # view (or change) permission.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_steer_permission(self, request: HttpRequest) -> bool:
        """Whether the user may change state through the actions: the model's change
        permission (staff who may only view see no actions)."""
        codename = get_permission_codename("change", self.opts)
        return bool(request.user.has_perm(f"{self.opts.app_label}.{codename}"))


if TYPE_CHECKING:
    ModelAdmin = admin.ModelAdmin
    TabularInline = admin.TabularInline
else:

    class _Subscriptable:
        def __class_getitem__(cls, params):
            return cls

    class ModelAdmin(_Subscriptable, admin.ModelAdmin):
        pass

    class TabularInline(_Subscriptable, admin.TabularInline):
        pass


class ReadOnlyModelAdmin[M: Model](ReadOnlyAdminMixin, ModelAdmin[M]):
    """The admin of a model that is only inspected (:class:`ReadOnlyAdminMixin`)."""


def report_refusals(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, refusals: Sequence[str], verb: str
) -> None:
    """One warning per refusal (at most ``MAX_LISTED``), then how many more there were."""
    for reason in refusals[:MAX_LISTED]:
        model_admin.message_user(request, reason[:1].upper() + reason[1:] + ".", messages.WARNING)
    hidden = len(refusals) - MAX_LISTED
    if hidden > 0:
        model_admin.message_user(request, f"... and {hidden} more {verb}.", messages.WARNING)


def report_changes(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    changed: int,
    verb: str,
    refusals: Sequence[str],
) -> None:
    """The end of a guarded action: ``"<changed> <verb>, <n> refused."`` (a success if
    anything changed, else a warning), then the refusals (:func:`report_refusals`)."""
    summary = f"{changed} {verb}"
    if refusals:
        summary += f", {len(refusals)} refused"
    model_admin.message_user(
        request, summary + ".", messages.SUCCESS if changed else messages.WARNING
    )
    report_refusals(model_admin, request, refusals, "refused")
