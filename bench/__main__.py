"""Run the benchmarks: `python -m bench` (all) or `python -m bench store`.

Each benchmark's module is imported when it runs: `store`, `claims`, `plans`, `search`,
`console` and `destinations` need only the project's own dependencies, the others the `bench` extra
(`pip install -e ./kit/python -e '.[bench]'`).
Under each report: the peak RSS of the benchmark's own process and of every child it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
from pathlib import Path

from bench import child

BENCHMARKS = (
    "store",
    "claims",
    "plans",
    "intake",
    "budget",
    "client",
    "dispatch",
    "api",
    "pipeline",
    "steady",
    "reader",
    "search",
    "console",
    "polling",
    "rekey",
    "adapters",
    "destinations",
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", choices=[[], *BENCHMARKS], default=[])
    parser.add_argument("--quick", action="store_true", help="small sizes, to check it runs")
    args = parser.parse_args()
    results = Path("bench/results")
    results.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(BENCHMARKS):
        benchmark = importlib.import_module(f"bench.{name}")
        report = asyncio.run(benchmark.main(quick=args.quick))
        report += "\n\n" + child.peaks_line()
        header = f"# bench {name} ({os.cpu_count()} cores)\n\n"
        (results / f"{name}.md").write_text(header + report + "\n")
        print(header + report)


if __name__ == "__main__":
    main()
