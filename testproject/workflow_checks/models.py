from django.db import models


class Effect(models.Model):
    """One execution of a step or an activity: an inline step writes its row in the
    transaction of its checkpoint, an activity after its work."""

    run_id = models.CharField(max_length=1000)
    key = models.CharField(max_length=200)
    kind = models.CharField(max_length=20)
    pid = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.kind} {self.run_id} {self.key}"
