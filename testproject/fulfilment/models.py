"""Business rows of the fulfilment demo: what the saga's steps and compensations
write, each in the step's own transaction."""

from django.db import models


class Reservation(models.Model):
    order_id = models.PositiveIntegerField()
    sku = models.CharField(max_length=50)
    quantity = models.PositiveIntegerField()
    released = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.quantity} x {self.sku} for order {self.order_id}"


class Payment(models.Model):
    order_id = models.PositiveIntegerField()
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    reservation = models.ForeignKey(Reservation, on_delete=models.PROTECT)
    refunded = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.amount} for order {self.order_id}"


class Shipment(models.Model):
    order_id = models.PositiveIntegerField()
    payment = models.ForeignKey(Payment, on_delete=models.PROTECT)
    dispatched = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"shipment of order {self.order_id}"


class Notice(models.Model):
    """A message sent to the customer: nothing can take it back."""

    order_id = models.PositiveIntegerField()
    text = models.CharField(max_length=200)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"order {self.order_id}: {self.text}"


class StepRun(models.Model):
    """The side-effect counter: one row per committed run of a step's action or
    compensation, written in that step's transaction (so it exists exactly when the
    step's work committed). ``runner`` is the lease holder that ran it."""

    instance_id = models.UUIDField()
    step = models.CharField(max_length=100)
    kind = models.CharField(max_length=20)  # "action" or "compensation"
    pid = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.instance_id} {self.kind} {self.step}"
