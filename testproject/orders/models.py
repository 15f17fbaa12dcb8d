from django.db import models

from outbox import CollectsEvents


class Order(CollectsEvents, models.Model):
    """An order; records its own events, handed to the unit of work on save."""

    number = models.CharField(max_length=50, unique=True)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    placed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.number


class Invoice(models.Model):
    """Written by the billing consumer, at most once per order."""

    order_number = models.CharField(max_length=50, unique=True)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    message_id = models.CharField(max_length=200)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"invoice for {self.order_number}"


class Delivery(models.Model):
    """One delivery of a message to the billing consumer, written after its unit of
    work, so that tests can count deliveries and see which were redeliveries."""

    message_id = models.CharField(max_length=200)
    event_type = models.CharField(max_length=200)
    fresh = models.BooleanField()
    pid = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.event_type} {self.message_id}"
