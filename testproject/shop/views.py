"""The shop's pages: the catalogue with an order form, an order's page with its
fulfilment and a live view of its invoice job's progress."""

from __future__ import annotations

from django import forms
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from jobs import JobScope
from sagas.models import SagaInstance
from workflows import WorkflowScope

from .models import Basket, Order, Product
from .services import OrderRejected, pay_basket, place_basket, place_order


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


class BasketForm(forms.Form):
    email = forms.EmailField()
    lines = forms.CharField(
        max_length=500, initial="MUG-1:2,TEE-1:1", help_text="SKU:quantity, comma-separated"
    )

    def clean_lines(self) -> list[dict[str, object]]:
        lines = []
        for part in self.cleaned_data["lines"].split(","):
            sku, _, quantity = part.strip().partition(":")
            if not sku or not quantity.isdigit():
                raise forms.ValidationError(f"{part.strip()!r} is not SKU:quantity")
            lines.append({"sku": sku, "quantity": int(quantity)})
        return lines


def baskets(request: HttpRequest) -> HttpResponse:
    """Place a basket: the basket row and its workflow run commit together."""
    form = BasketForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            basket = place_basket(**form.cleaned_data)
        except OrderRejected as exc:
            form.add_error(None, str(exc))
        else:
            return redirect("shop:basket", number=basket.number)
    return render(request, "shop/basket.html", {"form": form, "basket": None, "run": None})


def basket_page(request: HttpRequest, number: str) -> HttpResponse:
    basket = get_object_or_404(Basket, number=number)
    run = WorkflowScope(basket.scope).get(basket.number)
    return render(request, "shop/basket.html", {"basket": basket, "run": run, "form": None})


@require_POST
def pay(request: HttpRequest, number: str) -> HttpResponse:
    """The payment provider's callback: the payment and the run's signal commit together."""
    get_object_or_404(Basket, number=number)
    pay_basket(number, card=request.POST.get("card", "4242"))
    return redirect("shop:basket", number=number)
