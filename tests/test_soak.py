"""The soak (`bench/soak.py`), short: one minute through real `serve`, `worker` and downstream
processes on PostgreSQL, sampled every 10 s. The long one is `python -m bench.soak` (20
minutes; docs/performance.md); this one proves the harness and what must hold at any length:
nothing refused or lost, prune keeping the table to about its retention's worth of rows, every
process sampled, the plots drawn. No figure here is a speed target."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import Sample, Soak, soak
from tests.conftest import Storage

pytestmark = pytest.mark.slow

RATE = 200  # updates/s: well inside what the machine holds beside the rest of the suite


@pytest.mark.timeout(600)
async def test_a_short_soak_loses_nothing_and_prune_keeps_the_table_small(
    postgres_storage: Storage, tmp_path: Path
) -> None:
    result = await soak(postgres_storage.url(), minutes=1, rate=RATE, quiet=True)
    assert result.posted >= RATE * 50  # the poster kept its pace, near enough
    assert result.refused == 0
    assert result.delivered >= result.posted  # lost 0 (a redelivery may count twice)
    assert len(result.samples) == 6
    processes = {"serve", "worker 1", "worker 2", "downstream"}
    assert all(set(sample.rss_mib) == processes for sample in result.samples)
    assert all(mib > 10 for sample in result.samples for mib in sample.rss_mib.values())
    last = result.samples[-1]
    # Rows older than the retention (30 s) are pruned every 5 s: about 35 s of a minute's
    # updates stay, never all of them.
    assert 0 < last.rows < last.posted * 0.8, (last.rows, last.posted)
    assert last.table_mib > 0
    assert last.index_mib > 0
    assert any(sample.arrival_p99_ms is not None for sample in result.samples)
    report = result.report("python -m bench.soak --minutes 1")
    assert "lost 0" in report
    assert "| RSS serve, MiB |" in report
    for path in result.plot(tmp_path):
        assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), path


def _sample(seconds: float, rss: float) -> Sample:
    return Sample(seconds, 0, 0, 0, 1.0, 1.0, None, None, {"serve": rss})


def test_growth_compares_the_last_fifth_after_the_warm_up_with_the_first() -> None:
    # 20 minutes sampled every minute: the warm-up is the first 3; after it, 17 samples, a
    # fifth of which is 3.
    climbing = Soak(20, 100, [_sample(60 * m, 100 + m) for m in range(1, 21)])
    growth = climbing.growth(lambda s: s.rss_mib["serve"])
    assert growth == pytest.approx((119 / 104) - 1)  # means of 118..120 over 103..105
    flat = Soak(20, 100, [_sample(60 * m, 500 if m < 3 else 100) for m in range(1, 21)])
    assert flat.growth(lambda s: s.rss_mib["serve"]) == 0  # the warm-up's 500s do not count
    short = Soak(1, 100, [_sample(10, 1), _sample(20, 2)])
    assert short.growth(lambda s: s.rss_mib["serve"]) is None  # too few to judge
