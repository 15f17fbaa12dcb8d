from django.db import models


class Thing(models.Model):
    """The model of the transactions example in Django's tasks documentation."""

    num = models.IntegerField()

    def __str__(self) -> str:
        return f"thing {self.num}"


class TaskEvent(models.Model):
    """What happened to tasks, in order: signals received and work done, written by
    the demo tasks and signal receivers so that tests can observe other processes."""

    kind = models.CharField(max_length=40)
    result_id = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=16, blank=True, default="")
    attempt = models.PositiveIntegerField(default=0)
    detail = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.result_id} {self.status}"
