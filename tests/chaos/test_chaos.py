"""The short chaos run in the default test command, direct (with three destinations, each
judged on its own) and through PgBouncer, and the run's judge on made-up histories (a judge that
cannot fail proves nothing). The full run: `python -m tests.chaos` (`--destinations 3`,
`--pgbouncer`)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from app.store.predicates import SPENT_ERROR
from tests.chaos.run import Plan, Report, _judge_history, _judge_order, run
from tests.conftest import POSTGRES_URL, _libpq
from tests.pgbouncer import require_binary

pytestmark = pytest.mark.slow


THREE = ("default", "payments", "analytics")


async def test_a_short_chaos_run_with_three_destinations_loses_nothing_in_any(
    postgres_admin: Any, tmp_path: Path
) -> None:
    # postgres_admin: fails (never skips) when the test server is unreachable. Each update goes
    # to three destinations, each delivery fenced by its own claim; `default` keeps the path
    # of a bot with one destination (its row, the four-argument owns function).
    plan = Plan(updates=1_500, chats=60, rate=100.0, drain_within=180.0, destinations=THREE)
    report = await run(plan, tmp_path, _libpq(POSTGRES_URL))
    print(report.table())
    _assert_it_proved_something(plan, report)
    assert set(report.by_destination) == set(THREE)
    for destination, tally in report.by_destination.items():
        assert (tally.lost, tally.stale_writes_accepted, tally.order_violations) == (0, 0, 0)
        assert tally.delivered + tally.exhausted == plan.updates, destination
        assert tally.exhausted > 0, destination


async def test_a_short_chaos_run_through_pgbouncer_loses_nothing_and_accepts_no_stale_write(
    postgres_admin: Any, tmp_path: Path
) -> None:
    # The service and the downstream behind PgBouncer in transaction pooling mode, started
    # in front of the run's own database (which crashes behind it); LISTEN over a direct URL.
    require_binary()
    plan = Plan(updates=1_500, chats=60, rate=100.0, drain_within=180.0, pgbouncer=True)
    report = await run(plan, tmp_path, _libpq(POSTGRES_URL))
    print(report.table())
    assert report.database_path.startswith("through PgBouncer")
    _assert_it_proved_something(plan, report)
    # Nothing of the service's asked for what PgBouncer cannot give.
    logs = _logs(tmp_path)
    for symptom in ("prepared statement", "unsupported startup parameter", "wake-ups from other"):
        assert symptom not in logs


def _logs(directory: Path) -> str:
    """Every process's output of a run."""
    return "\n".join(path.read_text(errors="replace") for path in directory.glob("*.std*"))


def _assert_it_proved_something(plan: Plan, report: Report) -> None:
    assert report.passed, "\n".join(report.problems[:30])
    assert report.accepted == plan.updates
    assert report.delivered + report.exhausted == plan.updates * len(plan.destinations)
    assert report.exhaustions_delivered == report.exhausted > 0
    # The faults happened: the run proved something.
    assert report.workers_killed >= 2
    assert report.database_restarted
    assert report.answers[500] > 0
    assert report.answers[400] > 0
    assert report.stale_attempts_refused > 0  # late handlers were refused by owns
    assert report.reposted > 0


def _judged(audit: list[tuple[Any, ...]], answers: dict[Any, list[int]]) -> Report:
    report = Report(Plan())
    _judge_history(report, audit, defaultdict(list, answers), {})
    return report


KEY = ("default", 1)  # the delivery: (destination, update_id)
CLAIM = (KEY, "pending", "processing", 0, 1, None, "c1", None, False)


def test_the_judge_passes_a_clean_history() -> None:
    audit = [CLAIM, (KEY, "processing", "completed", 1, 1, "c1", "c1", None, False)]
    assert _judged(audit, {(KEY, 1, "c1"): [200]}).stale_writes_accepted == 0


@pytest.mark.parametrize(
    ("history", "answers"),
    [
        # completed, but the downstream never answered this identity 2xx (a stale settle)
        ([CLAIM, (KEY, "processing", "completed", 1, 1, "c1", "c1", None, False)], {}),
        # the identity moved without a claim (attempt skipped)
        ([CLAIM, (KEY, "processing", "processing", 1, 3, "c1", "c2", None, False)], {}),
        # a claim_id used twice
        (
            [
                CLAIM,
                (KEY, "processing", "processing", 1, 2, "c1", "c1x", None, False),
                (KEY, "processing", "processing", 2, 3, "c1x", "c1", None, False),
            ],
            {},
        ),
        # a change of a row that no live claim held
        (
            [CLAIM, (KEY, "failed", "completed", 1, 1, "c1", "c1", None, False)],
            {(KEY, 1, "c1"): [200]},
        ),
        # a completed update claimed again
        (
            [
                CLAIM,
                (KEY, "processing", "completed", 1, 1, "c1", "c1", None, False),
                (KEY, "completed", "processing", 1, 2, "c1", "c2", None, False),
            ],
            {(KEY, 1, "c1"): [200]},
        ),
        # an effect written by attempt 1 after attempt 2 had taken the update
        (
            [
                CLAIM,
                (KEY, "processing", "processing", 1, 2, "c1", "c2", None, False),
                (KEY, "processing", "processing", 1, 2, "c1", "c2", None, False, "effect", False),
            ],
            {},
        ),
        # exhausted after a 409 (the attempt had lost the update), not a 4xx refusal
        (
            [CLAIM, (KEY, "processing", "abandoned", 1, 1, "c1", "c1", "HTTP 409", False)],
            {(KEY, 1, "c1"): [409]},
        ),
    ],
)
def test_the_judge_counts_each_kind_of_stale_write(
    history: list[tuple[Any, ...]], answers: dict[Any, list[int]]
) -> None:
    assert _judged(history, answers).stale_writes_accepted >= 1


def test_the_judge_counts_a_stale_write_against_its_destination() -> None:
    payments = ("payments", 1)
    audit = [
        CLAIM,
        (KEY, "processing", "completed", 1, 1, "c1", "c1", None, False),
        (payments, "pending", "processing", 0, 1, None, "c2", None, False),
        # completed without a 2xx to payments' own identity (default's 2xx does not count)
        (payments, "processing", "completed", 1, 1, "c2", "c2", None, False),
    ]
    report = _judged(audit, {(KEY, 1, "c1"): [200], (payments, 1, "c1"): [200]})
    assert report.stale_writes_accepted == 1
    assert report.tally("payments").stale_writes_accepted == 1
    assert report.tally("default").stale_writes_accepted == 0


def test_the_judge_refuses_a_claim_id_reused_across_destinations() -> None:
    audit = [CLAIM, (("payments", 1), "pending", "processing", 0, 1, None, "c1", None, False)]
    assert _judged(audit, {}).tally("payments").stale_writes_accepted == 1


def test_spent_attempts_and_acknowledgements_are_not_stale() -> None:
    audit = [
        CLAIM,
        (KEY, "processing", "processing", 1, 1, "c1", "c1", None, False, "effect", True),
        (KEY, "processing", "failed", 1, 1, "c1", "c1", "HTTP 500", False),
        (KEY, "failed", "abandoned", 1, 1, "c1", "c1", SPENT_ERROR, False),
        (KEY, "abandoned", "abandoned", 1, 1, "c1", "c1", SPENT_ERROR, True),
    ]
    assert _judged(audit, {(KEY, 1, "c1"): [500]}).stale_writes_accepted == 0
    # The last attempt failed retryably: the dispatcher exhausts it with the spent error.
    last = [
        CLAIM,
        (KEY, "processing", "abandoned", 1, 1, "c1", "c1", f"{SPENT_ERROR}; last: HTTP 500", False),
    ]
    assert _judged(last, {(KEY, 1, "c1"): [500]}).stale_writes_accepted == 0


def _arrived(*attempts: tuple[int, int]) -> list[dict[str, Any]]:
    """Arrivals at the downstream of (update_id, attempt), all of one chat of `payments`."""
    return [
        {"event": "arrived", "destination": "payments", "update_id": u, "attempt": n, "chat": 5}
        for u, n in attempts
    ]


def test_the_judge_leaves_a_stale_request_handled_after_its_successor_out_of_the_order() -> None:
    # Seen in a run under load: attempt 2 of update 11 timed out before the downstream got to
    # it, attempt 3 completed, 71 went, and then the downstream handled attempt 2 (owns: 409).
    report = Report(Plan())
    _judge_order(report, _arrived((11, 1), (11, 3), (71, 1), (11, 2)))
    assert (report.order_violations, report.late_arrivals) == (0, 1)


def test_the_judge_counts_an_update_arriving_after_a_later_one() -> None:
    report = Report(Plan())
    _judge_order(report, _arrived((11, 1), (71, 1), (11, 2)))
    assert (report.order_violations, report.tally("payments").order_violations) == (1, 1)
