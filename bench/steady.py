"""Cost at a steady rate, alone: `bench pipeline`'s steady case beside its burst with the same
worker and downstream (one worker process, the plain one), without the pipeline's other cases.

N updates (20,000) posted through `serve` in a burst, 64 at a time, then N / 2 at a paced 500
updates/s, each delivered by the `worker` process to the downstream process, on PostgreSQL.
For each: POST-to-arrival p50 and p99 (the paced one from each update's due time), and the CPU
seconds per 1,000 updates of each process and of the whole PostgreSQL cluster over the same
window; then issue 33's verdict: paced CPU per update at most 1.5x the burst's, p50 <= 4 ms.
How each is measured is `bench pipeline`'s (its module docstring).
"""

from __future__ import annotations

import sys

from bench.pipeline import PACE, Case, comparison, run_case


async def main(*, quick: bool = False) -> str:
    count = 2_000 if quick else 20_000
    burst, paced = Case(1, "plain"), Case(1, "plain", pace=PACE)
    print(f"bench steady: a burst of {count:,}", file=sys.stderr)
    await run_case(burst, count)
    print(f"bench steady: {count // 2:,} at {PACE:.0f} updates/s", file=sys.stderr)
    await run_case(paced, count // 2)
    return "\n".join(comparison(burst, paced))
