"""The hostile-input campaign (tests/hostile/campaign.py) at a smaller size, against `serve`
on each backend, with short timeouts so that it runs in seconds: every family is refused as
issue 20 asks, memory grows by less than 64 MiB in any family, every legitimate webhook
posted meanwhile gets its 200, and the table then holds those webhooks and nothing else."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.conftest import BACKENDS, module_storage, table_rows
from tests.hostile.campaign import (
    LEGIT_IDS,
    SHORT,
    Row,
    Target,
    api_bodies,
    half_sent,
    header_floods,
    json_rules,
    protocol,
    silent,
    start_target,
    table,
)

pytestmark = pytest.mark.slow

HEADER_TIMEOUT, BODY_TIMEOUT = 2.0, 3.0
GROWTH_LIMIT_KIB = 64 * 1024


@pytest.fixture(scope="module", params=BACKENDS)
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    with module_storage(request, tmp_path_factory, "campaign") as (directory, storage):
        served = start_target(
            directory,
            storage.url(),
            header_timeout_seconds=HEADER_TIMEOUT,
            body_timeout_seconds=BODY_TIMEOUT,
        )
        try:
            yield served
            assert served.process.poll() is None, served.process.report()
            stored = [update_id for (update_id,) in table_rows(served.url, "update_id")]
            assert stored
            assert all(update_id >= LEGIT_IDS for update_id in stored), stored[:20]
        finally:
            served.process.kill()


def _held(row: Row, *, inputs: int) -> dict[str, int]:
    print(table("campaign", [row]))
    assert row.inputs == inputs
    assert row.growth_kib < GROWTH_LIMIT_KIB, f"{row.family}: grew {row.growth_kib} KiB"
    assert row.legit_sent >= 2
    assert row.legit_ok == row.legit_sent, row
    return dict(row.answers)


def test_api_bodies_without_a_key_are_401_and_cost_no_memory(target: Target) -> None:
    answers = _held(api_bodies(target, SHORT), inputs=SHORT.api_bodies)
    assert answers == {"401": SHORT.api_bodies}
    # 8 x 50 MB went in: a server that read them would have grown by hundreds of MiB.


def test_silent_connections_are_closed_past_the_header_timeout(target: Target) -> None:
    answers = _held(silent(target, SHORT, HEADER_TIMEOUT), inputs=SHORT.silent)
    seconds = f"{HEADER_TIMEOUT + 3:.0f} s"
    assert answers == {
        f"closed by the server within {seconds}": SHORT.silent,
        f"still open after {seconds}": 0,
        "not accepted": 0,
    }


def test_silent_connections_past_the_connection_limit_evict_the_oldest(target: Target) -> None:
    row = silent(target, SHORT, HEADER_TIMEOUT)
    _held(row, inputs=SHORT.silent)
    # 6,000 held against the default connection_limit of 4,096: the descriptors stay under it
    # (plus the process's own), and the webhooks posted meanwhile were all answered.
    assert row.fds_peak < 4096 + 200, row.fds_peak


def test_half_sent_and_trickled_requests_are_closed_in_bounded_time(target: Target) -> None:
    answers = _held(
        half_sent(target, SHORT, HEADER_TIMEOUT, BODY_TIMEOUT), inputs=3 * SHORT.half_sent
    )
    assert answers.pop("half a head: 408, closed") == SHORT.half_sent
    for answer, _count in answers.items():
        fate = re.fullmatch(r"(.+): closed by (\d+) s", answer)
        assert fate is not None, answers
        limit = BODY_TIMEOUT if fate[1] == "half a body" else HEADER_TIMEOUT
        assert int(fate[2]) <= limit + 2, answers  # the bucket is the next whole second
    assert sum(answers.values()) == 2 * SHORT.half_sent


def test_header_floods_are_431_at_a_small_cap(target: Target) -> None:
    answers = _held(header_floods(target, SHORT), inputs=2 * SHORT.header_floods)
    assert answers.pop("1,000 headers: 431, closed") == SHORT.header_floods
    for answer in answers:  # the endless lines: refused within a few MiB of their start
        fate = re.fullmatch(r"an endless header line: 431, closed after (\d+) MiB sent", answer)
        assert fate is not None, answers
        assert int(fate[1]) <= 8, answers
    assert sum(answers.values()) == SHORT.header_floods


def test_json_that_strict_parsers_refuse_is_400_for_the_webhook_and_the_api(
    target: Target,
) -> None:
    answers = _held(json_rules(target), inputs=18)
    for answer in answers:
        name, said = answer.split(": ", 1)
        expected = "webhook 400, API 422" if name == "update_id 1708.0" else "webhook 400, API 400"
        assert said == expected, answer


def test_encodings_redirects_and_doubled_headers_are_refused(target: Target) -> None:
    answers = _held(protocol(target), inputs=5)
    assert answers == {
        "Content-Encoding: gzip on a plain body: 415": 1,
        "a real gzip body: 415": 1,
        "POST /telegram/default/ with Host: evil.example: 404": 1,
        "two Authorization headers: 400": 1,
        "two secret-token headers: 400": 1,
    }
