"""Run the benchmarks: `python -m bench` (all) or `python -m bench store`."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from bench import api, claims, client, dispatch, intake, plans, reader, store

BENCHMARKS = {
    "store": store.main,
    "claims": claims.main,
    "plans": plans.main,
    "intake": intake.main,
    "client": client.main,
    "dispatch": dispatch.main,
    "api": api.main,
    "reader": reader.main,
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", choices=[[], *BENCHMARKS], default=[])
    parser.add_argument("--quick", action="store_true", help="small sizes, to check it runs")
    args = parser.parse_args()
    results = Path("bench/results")
    results.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(BENCHMARKS):
        report = asyncio.run(BENCHMARKS[name](quick=args.quick))
        header = f"# bench {name} ({os.cpu_count()} cores)\n\n"
        (results / f"{name}.md").write_text(header + report + "\n")
        print(header + report)


if __name__ == "__main__":
    main()
