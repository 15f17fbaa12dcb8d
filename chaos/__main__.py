"""``python -m chaos [--profile full|short] [--seed N]``: one chaos run (see
:mod:`chaos`); prints the conditions and the verdict table, writes them to
``chaos/results/<profile>-latest.md`` (and ``.json``), and exits 1 on any violation.

RabbitMQ: ``RABBITMQ_URL`` from the environment, else started by
``scripts/brokers.sh`` when it is installed, else the outbox's in-process transport
(no ``consume_events``; said in the conditions)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from .profiles import PROFILES

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def rabbitmq(stack: ExitStack) -> str | None:
    """A RabbitMQ URL for the run, or None."""
    if os.environ.get("RABBITMQ_URL"):
        return os.environ["RABBITMQ_URL"]
    if not os.path.exists("/usr/lib/rabbitmq/bin/rabbitmq-server"):
        return None
    directory = tempfile.mkdtemp(prefix="chaos-rabbitmq-")
    script = str(ROOT / "scripts" / "brokers.sh")
    started = subprocess.run(
        [script, "start", directory, "rabbitmq"], capture_output=True, text=True, check=False
    )
    if started.returncode != 0:
        print(f"chaos: RabbitMQ did not start:\n{started.stderr[-2000:]}", file=sys.stderr)
        return None
    stack.callback(subprocess.run, [script, "stop", directory], capture_output=True, check=False)
    line = started.stdout.strip().splitlines()[-1]
    return line.partition("=")[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    from .run import Run

    profile = PROFILES[args.profile]
    with ExitStack() as stack:
        url = rabbitmq(stack)
        work_dir = Path(tempfile.mkdtemp(prefix=f"chaos-{profile.name}-"))
        outcome = Run(profile, seed=args.seed, work_dir=work_dir, rabbitmq_url=url).run()
    text = outcome.render()
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{profile.name}-latest.md").write_text(text + "\n")
    (RESULTS / f"{profile.name}-latest.json").write_text(outcome.as_json() + "\n")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
