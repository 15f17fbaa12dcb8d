"""The effects of the chaos workload, each with the ids that say whose it is.

An effect that the product promises exactly once is written in the transaction that
the product commits with its record (an inline step's checkpoint, a saga step's
completion, a message's inbox record); one it promises at least once is written in a
transaction of its own (a job handler's work, an activity). Every row carries the
database's time (``at``), so that the checker compares times read on one clock.
"""

from django.db import models
from django.db.models.functions import Now


class Effect(models.Model):
    class Kind(models.TextChoices):
        #: A job handler ran (its own transaction: at least once per job).
        JOB = "job", "Job handler run"
        #: A workflow's inline step (in its checkpoint's transaction: once).
        STEP = "step", "Inline step"
        #: An activity item ran (its own transaction: at least once per item).
        ACTIVITY = "activity", "Activity run"
        #: A message handled through the inbox (with the inbox record: once).
        CONSUMED = "consumed", "Message consumed"
        #: A delivery of a message to the subscriber (at least once).
        DELIVERED = "delivered", "Message delivered"
        #: A signal the consumer sent to a run (with the inbox record: once).
        SIGNAL = "signal", "Signal sent"
        #: A saga step's action (in the step's transaction: once).
        SAGA_STEP = "saga-step", "Saga step"
        #: A saga step's compensation (in the compensation's transaction: once).
        COMPENSATION = "compensation", "Saga compensation"
        #: A schedule's period ran (its own transaction: at least once per period).
        TICK = "tick", "Schedule period"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    #: Whose effect: a job id, a run id, an order number, a saga's key.
    subject = models.CharField(max_length=200)
    #: Which one of the subject's: a token, a step, an item, a message id.
    key = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField(default=0)
    pid = models.PositiveIntegerField()
    at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [models.Index(fields=["kind", "subject"], name="history_effect_kind_subject")]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject} {self.key}"


class Order(models.Model):
    """An order of the workload: its message (and its run, when it has one) commit
    with it, so that a feeder that lost a commit's reply finds it by its number."""

    number = models.CharField(max_length=50, unique=True)
    run_id = models.CharField(max_length=50, blank=True, default="")

    def __str__(self) -> str:
        return self.number
