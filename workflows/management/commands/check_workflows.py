"""``manage.py check_workflows``: would the code installed now replay every run in
flight as it was recorded? Exit status 1 if any would not."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from workflows.checking import check_runs


class Command(BaseCommand):
    help = (
        "Replay every workflow run in flight (Waiting, Running or Failed) against the code "
        "installed, in a transaction that is rolled back and running no step (recorded "
        "values only, up to the first checkpoint not recorded). Prints, per (name, "
        "version), how many runs replay cleanly and, for each that would not, its scope "
        "hash, run id, first divergent key and why. Exits 1 if any run would diverge."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        verdicts = check_runs()
        diverging = 0
        for verdict in verdicts:
            self.stdout.write(
                f"{verdict.name} v{verdict.version}: {verdict.clean} of {verdict.checked} "
                "run(s) in flight replay cleanly"
            )
            for found in verdict.divergences:
                at = f" at {found.key!r}" if found.key else ""
                self.stdout.write(f"  {found.scope_hash} {found.run_id}{at}: {found.describe()}")
            diverging += len(verdict.divergences)
        if not verdicts:
            self.stdout.write("No workflow run in flight.")
        if diverging:
            raise CommandError(
                f"{diverging} run(s) in flight would not replay as recorded under this code",
                returncode=1,
            )
