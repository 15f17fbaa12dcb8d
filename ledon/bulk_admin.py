"""The admins' "all N matching" actions.

Django's change list acts on the ticked rows of one page — or, once "Select all N" is
clicked, on every row its filters and search match. An action that supports the
latter calls :meth:`BulkAdminMixin.bulk_by_filter` when the user chose it (then
:func:`selected_across` is true): instead of acting at once, it shows a confirmation
page with the dry run (how many rows match, how many each outcome would take, why the
others would be skipped, and the filters they were chosen by) and, for an operation
with options, a form for them and "Count again". "Yes" runs the operation by filter in
batches (:func:`ledon.bulk.run_bulk`) on the rows counted — none with an id above the
largest counted — and says what it did.

The confirmation is the same action posted again, so it needs what the action needs:
Django offers an action, on the list and on its confirmation alike, only to users who
have its permissions (every state-changing action: the model's change permission).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template import engines
from django.template.response import TemplateResponse

from .bulk import BulkAction, BulkReport, run_bulk
from .db import DATABASE_ERRORS

#: The confirmation page's template: with the admins' base, whatever apps are installed.
TEMPLATE = Path(__file__).parent / "templates" / "admin" / "ledon" / "bulk_confirmation.html"

#: The buttons of the confirmation page (their names in the POST).
CONFIRM = "bulk_confirm"
RECOUNT = "bulk_recount"
#: The largest id counted by the dry run: what "Yes" acts on at most.
UP_TO = "bulk_up_to"


def selected_across(request: HttpRequest) -> bool:
    """Whether the action was chosen for every row the change list's filters match
    ("Select all N"), not only the ticked ones."""
    return request.POST.get("select_across") == "1"


@functools.cache
def _template() -> Any:
    return engines["django"].from_string(TEMPLATE.read_text(encoding="utf-8"))


class BulkAdminMixin:
    """For a model admin whose actions act by filter when "Select all N" was chosen."""

    #: The app's typed error for bad input (what :func:`~ledon.bulk.run_bulk` raises).
    bulk_error: ClassVar[type[Exception]]
    #: The app's errors a run may raise: reported as an error message, nothing written.
    bulk_errors: ClassVar[tuple[type[Exception], ...]]

    model: Any
    admin_site: Any
    message_user: Callable[..., None]
    get_changelist_instance: Callable[[HttpRequest], Any]

    def bulk_by_filter(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        name: str,
        make_action: Callable[..., BulkAction],
        *,
        options: type[forms.Form] | None = None,
        explain: str = "",
    ) -> HttpResponse | None:
        """The "all N matching" form of the action ``name``: its confirmation page,
        or — once confirmed — the run and a message (None: back to the list).
        ``make_action(**options)`` builds the operation from the ``options`` form's
        cleaned data (no options: ``make_action()``); ``explain`` says on the page
        what it does."""
        confirmed = CONFIRM in request.POST
        form = None
        if options is not None:
            bound = confirmed or RECOUNT in request.POST
            form = options(request.POST if bound else None)
        choices: Mapping[str, Any] = {}
        if form is not None and form.is_bound and form.is_valid():
            choices = form.cleaned_data
        elif form is not None:
            choices = {name: field.initial for name, field in form.fields.items()}
        up_to = _up_to(request)
        try:
            action = make_action(**choices)
            if confirmed and (form is None or form.is_valid()) and up_to is not None:
                report = run_bulk(queryset, action, error=self.bulk_error, up_to=up_to)
                level = messages.SUCCESS if report.total_changed else messages.WARNING
                self.message_user(request, _sentence(report.summary(self._noun())), level)
                return None
            preview = run_bulk(queryset, action, error=self.bulk_error, up_to=up_to, dry_run=True)
        except self.bulk_errors as exc:
            self.message_user(request, _sentence(str(exc)), messages.ERROR)
            return None
        except DATABASE_ERRORS as exc:
            self.message_user(
                request,
                f"Stopped by a database error ({exc}). The batches before it stay done, "
                "the failed one was rolled back: run the action again to go on.",
                messages.ERROR,
            )
            return None
        return self._confirmation(request, name, action, preview, form, explain)

    def _noun(self) -> str:
        return str(self.model._meta.verbose_name_plural)

    def _confirmation(
        self,
        request: HttpRequest,
        name: str,
        action: BulkAction,
        preview: BulkReport,
        form: forms.Form | None,
        explain: str,
    ) -> TemplateResponse:
        opts = self.model._meta
        changelist = self.get_changelist_instance(request)
        filters = [
            (str(spec.title), str(choice["display"]))
            for spec in changelist.filter_specs
            for choice in spec.choices(changelist)
            if choice["selected"]
        ]
        if changelist.query:
            filters.append(("search", changelist.query))
        context = {
            **self.admin_site.each_context(request),
            "title": f"{action.verb.capitalize()} all {preview.matched} matching {self._noun()}?",
            "subtitle": None,
            "opts": opts,
            "action_name": name,
            "action": action,
            "preview": preview,
            "changes": list(preview.changed.items()),
            "reasons": [(why, n) for why, n in preview.reasons.items() if n],
            "filters": filters,
            "form": form,
            "explain": explain,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "up_to": "" if preview.up_to is None else preview.up_to,
            "confirm": CONFIRM,
            "recount": RECOUNT,
            "up_to_name": UP_TO,
            "back": request.get_full_path(),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, _template(), context)


def _up_to(request: HttpRequest) -> int | None:
    """The largest id the dry run counted, as posted back by its page (None on the
    first page, or if missing or not a number: then nothing is run, the page is shown
    again with a fresh count)."""
    value = request.POST.get(UP_TO, "")
    return int(value) if value.isdigit() else None


def _sentence(text: str) -> str:
    """A message as the admin shows it: capitalised, ending with a full stop."""
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else text + "."
