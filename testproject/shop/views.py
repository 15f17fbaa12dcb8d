"""The shop's pages: the catalogue with an order form, an order's page with its
fulfilment and a live view of its invoice job's progress."""

from __future__ import annotations

from django import forms
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET

from jobs import JobScope
from sagas.models import SagaInstance

from .models import Order, Product
from .services import OrderRejected, place_order


class OrderForm(forms.Form):
    email = forms.EmailField()
    sku = forms.CharField(max_length=50)
    quantity = forms.IntegerField(min_value=1, max_value=100, initial=1)
    card = forms.CharField(
        max_length=30, initial="4242 4242 4242 4242", help_text="…0002 is declined"
    )


def catalogue(request: HttpRequest) -> HttpResponse:
    form = OrderForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            order = place_order(**form.cleaned_data)
        except OrderRejected as exc:
            form.add_error(None, str(exc))
        else:
            return redirect("shop:order", number=order.number)
    return render(
        request,
        "shop/catalogue.html",
        {"products": Product.objects.all(), "orders": Order.objects.all()[:20], "form": form},
    )


def order_page(request: HttpRequest, number: str) -> HttpResponse:
    order = get_object_or_404(Order, number=number)
    fulfilment = SagaInstance.objects.filter(name="shop.fulfil", idempotency_key=number).first()
    return render(request, "shop/order.html", {"order": order, "fulfilment": fulfilment})


@require_GET
def invoice_progress(request: HttpRequest, number: str) -> JsonResponse:
    """The invoice job's state, polled by the order page to show progress live."""
    order = get_object_or_404(Order, number=number)
    job = JobScope(order.scope).get(order.invoice_job_id)
    if job is None:
        raise Http404("no invoice job")
    return JsonResponse(
        {
            "status": job.status.value,
            "progress": job.progress or 0,
            "message": job.progress_message,
            "attempt": job.attempt_count,
            "result": job.result_ref,
        }
    )
