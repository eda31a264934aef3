"""`python -m tests.chaos`: the full chaos run (minutes); prints its table, exits 1 on failure.

Options size the run (`--updates`, `--chats`, `--workers`, `--intakes`); `--runs 3` repeats it;
`--pgbouncer` puts PgBouncer in transaction pooling mode between the service and PostgreSQL;
`--failover sync` (or `async`) kills a primary and promotes its standby instead of the crash;
`--destinations 3` gives the bot three destinations, each taking every update.
The logs of every process and the downstream's journal stay in `--keep DIR` when given.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from tests.chaos.run import Plan, run
from tests.conftest import POSTGRES_URL, _libpq

DESTINATIONS = ("default", "payments", "analytics", "moderation")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    plan = Plan()
    parser.add_argument("--updates", type=int, default=plan.updates)
    parser.add_argument("--chats", type=int, default=plan.chats)
    parser.add_argument("--intakes", type=int, default=plan.intakes)
    parser.add_argument("--workers", type=int, default=plan.workers)
    parser.add_argument("--rate", type=float, help="updates posted per second (default: flat out)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--destinations",
        type=int,
        choices=range(1, len(DESTINATIONS) + 1),
        default=1,
        help="the bot's destinations, each taking every update (default: 1, `default` alone)",
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="the service through PgBouncer (transaction pooling)",
    )
    parser.add_argument(
        "--failover",
        choices=["sync", "async"],
        help="a primary and a standby; the primary killed and the standby promoted",
    )
    parser.add_argument("--keep", type=Path, help="keep logs and the journal here")
    args = parser.parse_args()
    plan = replace(
        plan,
        updates=args.updates,
        chats=args.chats,
        intakes=args.intakes,
        workers=args.workers,
        rate=args.rate,
        pgbouncer=args.pgbouncer,
        destinations=DESTINATIONS[: args.destinations],
    )
    if args.failover:  # no process is restarted: each must find the new primary itself
        plan = replace(
            plan,
            fault="failover" if args.failover == "sync" else "failover-async",
            kill_every=None,
        )
    failed = False
    for number in range(1, args.runs + 1):
        if args.keep:
            directory = args.keep / f"run-{number}"
            directory.mkdir(parents=True, exist_ok=True)
        else:
            directory = Path(tempfile.mkdtemp(prefix="intake-chaos-"))
        report = asyncio.run(run(plan, directory, _libpq(POSTGRES_URL)))
        print(f"\n## chaos run {number} of {args.runs}: {'passed' if report.passed else 'FAILED'}")
        print(f"(logs in {directory})\n")
        print(report.table())
        for problem in report.problems[:50]:
            print(f"- {problem}")
        failed |= not report.passed
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
