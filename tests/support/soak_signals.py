"""Run one management command again and again in this process, for the signal tests.

``python tests/support/soak_signals.py COUNT COMMAND [ARG …]`` runs ``manage.py COMMAND ARG …``
COUNT times through ``call_command`` and prints ``soak N start`` / ``soak N end`` around
each run; the test sends a SIGTERM while each run works and waits for its end. A run
that raises ends the loop with status 1. Restarting in one process instead of
starting COUNT processes makes a few hundred signals take seconds, not minutes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    count, command, *args = argv
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command

    for n in range(int(count)):
        print(f"soak {n} start", flush=True)
        try:
            call_command(command, *args)
        except BaseException as exc:
            print(f"soak {n} raised {type(exc).__name__}: {exc}", flush=True)
            return 1
        print(f"soak {n} end", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
