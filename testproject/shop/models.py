from django.db import models


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
