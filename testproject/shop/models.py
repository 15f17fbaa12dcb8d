"""The demo shop: products with stock, orders, and what fulfilling an order writes."""

from __future__ import annotations

from django.db import models


class Product(models.Model):
    sku = models.CharField(max_length=50, unique=True)
    name = models.CharField(max_length=200)
    price = models.DecimalField(max_digits=10, decimal_places=2)
    stock = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["sku"]

    def __str__(self) -> str:
        return f"{self.name} ({self.sku})"


class Order(models.Model):
    class Status(models.TextChoices):
        PLACED = "placed", "Placed"
        FULFILLED = "fulfilled", "Fulfilled"
        CANCELLED = "cancelled", "Cancelled"

    number = models.CharField(max_length=50, unique=True)
    email = models.EmailField()
    product = models.ForeignKey(Product, on_delete=models.PROTECT)
    quantity = models.PositiveIntegerField()
    total = models.DecimalField(max_digits=10, decimal_places=2)
    card = models.CharField(max_length=30)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PLACED)
    invoice = models.CharField(max_length=200, blank=True, default="")
    placed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-placed_at", "-id"]

    def __str__(self) -> str:
        return self.number

    @property
    def scope(self) -> str:
        """The job scope of this order's customer."""
        return f"customer:{self.email}"

    @property
    def invoice_job_id(self) -> str:
        return f"invoice-{self.number}"


class Payment(models.Model):
    order = models.OneToOneField(Order, on_delete=models.PROTECT)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    refunded = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.amount} for {self.order}"


class Shipment(models.Model):
    order = models.OneToOneField(Order, on_delete=models.PROTECT)
    tracking = models.CharField(max_length=50)

    def __str__(self) -> str:
        return f"{self.tracking} for {self.order}"


class Notification(models.Model):
    """An e-mail to a customer, written once per message by the mailer consumer."""

    order_number = models.CharField(max_length=50)
    email = models.EmailField()
    text = models.CharField(max_length=200)
    message_id = models.UUIDField(unique=True)

    def __str__(self) -> str:
        return f"to {self.email}: {self.text}"


class WorkLog(models.Model):
    """A side effect written by demo and test handlers in its own transaction, so that
    tests can count how often each attempt really ran."""

    job_id = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    token = models.CharField(max_length=64)
    note = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job_id} attempt {self.attempt}"


class Basket(models.Model):
    """An order of several lines, fulfilled by the ``shop.basket`` workflow: stock
    reserved, lines priced in parallel, payment awaited as a signal, shipped by a
    child workflow."""

    class Status(models.TextChoices):
        PLACED = "placed", "Placed"
        PAID = "paid", "Paid"
        SHIPPED = "shipped", "Shipped"

    number = models.CharField(max_length=50, unique=True)
    email = models.EmailField()
    #: ``[{"sku": ..., "quantity": ...}, ...]``
    lines = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PLACED)
    total = models.DecimalField(max_digits=10, decimal_places=2, null=True, blank=True)
    paid_by = models.CharField(max_length=30, blank=True, default="")
    tracking = models.CharField(max_length=50, blank=True, default="")
    placed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-placed_at", "-id"]

    def __str__(self) -> str:
        return self.number

    @property
    def scope(self) -> str:
        """The scope of this basket's customer (its workflow run lives there)."""
        return f"customer:{self.email}"
