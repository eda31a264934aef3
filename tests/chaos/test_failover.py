"""PostgreSQL fails over under the service (docs/reliability.md, "Failover"): a primary and a
streaming standby of this machine's server binaries, named together in one libpq multi-host
URL with `target_session_attrs=read-write`; one intake and two workers; 3,000 updates posted
over 50 chats; the primary SIGKILLed (postmaster and backends) half-way and the standby
promoted 2 s later. No process is restarted, none is told anything.

With a synchronous standby: nothing answered 200 is lost, every update is delivered in its
chat's order, no stale write, the intake answers only 503 with Retry-After meanwhile, and
the workers deliver again within 30 s of the promotion. With an asynchronous one: what is
lost is only what was answered 200 in the moment before the kill, measured. And a process
started while the database is away waits for it."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.store.migrate import upgrade
from tests.chaos.run import Plan, Report, run
from tests.conftest import POSTGRES_URL, _libpq
from tests.postgres_server import required_binaries, running_cluster
from tests.processes import Process, environment, free_port, processes

pytestmark = pytest.mark.slow

PLAN = Plan(
    updates=3_000,
    chats=50,
    intakes=1,
    workers=2,
    rate=200.0,
    kill_every=None,  # no process is restarted: each must find the new primary itself
    drain_within=180.0,
)


async def test_a_failover_to_a_synchronous_standby_loses_nothing(
    postgres_admin: Any, tmp_path: Path
) -> None:
    plan = replace(PLAN, fault="failover")
    report = await run(plan, tmp_path, _libpq(POSTGRES_URL))
    print(report.table())
    assert report.passed, "\n".join(report.problems[:30] + report.exited)
    assert report.lost == 0
    assert report.order_violations == 0
    assert report.delivered + report.exhausted == plan.updates
    _assert_the_switch(report)


async def test_a_failover_to_an_asynchronous_standby_loses_only_the_last_moment(
    postgres_admin: Any, tmp_path: Path
) -> None:
    plan = replace(PLAN, fault="failover-async", standby_lag=0.5)
    report = await run(plan, tmp_path, _libpq(POSTGRES_URL))
    print(report.table())
    assert report.passed, "\n".join(report.problems[:30] + report.exited)
    # Every update the new primary has was delivered. The ones it never had are the ones
    # answered 200 while nothing reached the standby (its sender stopped for the last 0.5 s
    # before the kill; on one machine a standby otherwise lags by a millisecond or less).
    assert report.delivered + report.exhausted == plan.updates - report.lost
    assert len(report.lost_before_fault) == report.lost > 0
    # (A commit can leave the primary a little after its 200: tens of ms on a busy machine.)
    assert max(report.lost_before_fault) < plan.standby_lag + 0.5, report.lost_before_fault
    assert report.answered_while_lagging is not None
    assert report.lost >= 0.9 * report.answered_while_lagging  # a few posted again after
    _assert_the_switch(report)


def _assert_the_switch(report: Report) -> None:
    # Meanwhile the intake said "later", and only that; the fleet lived through it.
    assert report.refusals, "the fault struck while nothing was posted"
    assert set(report.refusals) == {"503 with Retry-After"}, report.refusals
    assert not report.exited
    assert report.first_200_after_fault is not None
    assert report.first_delivery_after_promotion is not None
    assert report.first_delivery_after_promotion < 30.0
    assert report.not_ready_seconds > 0  # /readyz told the operator
    assert report.answers[500] > 0  # the downstream's own faults went on meanwhile
    assert report.answers[400] > 0


@pytest.mark.parametrize("command", ["worker", "serve"])
async def test_a_process_started_while_its_database_is_down_waits_for_it(
    tmp_path: Path, command: str
) -> None:
    # As in a failover's gap, or a database still starting: the process says it waits, and
    # runs once the database is up (INTAKE_DATABASE_WAIT_SECONDS, 60 by default).
    bindir = required_binaries()
    with running_cluster(bindir) as cluster:
        await asyncio.to_thread(upgrade, cluster.url())
        cluster.stop()
        port = free_port()
        env = environment(cluster.url(), "http://127.0.0.1:9/hook", port=port)
        with processes(tmp_path) as start:
            process = start(command, env, command)
            await _until(lambda: "trying again" in process.stderr, process, "it says it waits")
            cluster.start()
            if command == "worker":
                await _until(process.started, process, "the worker starts")
            else:
                await _until(
                    lambda: process.answers(f"http://127.0.0.1:{port}/readyz"),
                    process,
                    "the intake is ready",
                )
            assert process.poll() is None


async def _until(done: Callable[[], bool], process: Process, what: str) -> None:
    deadline = time.monotonic() + 60
    while not done():
        assert process.poll() is None, process.report()
        assert time.monotonic() < deadline, f"{what}: not within 60 s\n{process.report()}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("command", ["worker", "serve"])
async def test_a_process_told_to_stop_while_it_waits_for_its_database_stops(
    tmp_path: Path, command: str
) -> None:
    # A supervisor's SIGTERM (Kubernetes gives 30 s, then SIGKILL) ends the wait at once.
    with running_cluster(required_binaries()) as cluster:
        cluster.stop()  # nothing answers at its port
        env = environment(cluster.url(), "http://127.0.0.1:9/hook", port=free_port())
        with processes(tmp_path) as start:
            process = start(command, env, command)
            await _until(lambda: "trying again" in process.stderr, process, "it says it waits")
            told = time.monotonic()
            process.signal(signal.SIGTERM)
            await asyncio.to_thread(process.popen.wait, 20)
            assert time.monotonic() - told < 5, process.report()
