"""A worker cut off from its database by the network (docs/reliability.md, "Partitions").

The worker runs in a network namespace of the test's own (tests/network.py), joined to this
machine by two veth pairs: one to PostgreSQL (a throwaway cluster listening on its host end
too), one to the downstream, the chaos run's (tests/chaos/downstream.py), which checks
`telegram_intake_owns` in its own transaction before it writes. The intake and a second
worker stay on this machine's loopback.

The cut worker takes updates the downstream holds past the lease. Then its database link is
cut: packets dropped without a word, as in a partition. It cannot renew; it must stop each
attempt (its request to the downstream ends) before the lease it last proved runs out.
Another worker, started after the cut, takes the updates over when those leases lapse; the
held attempts, let go at last, find that they no longer own their updates and write nothing.
The link heals; the other worker stops; the cut worker, never restarted, delivers what
comes next. The chaos run's judge then finds nothing lost and no stale write.

Under CI (`CI=true`) a machine without namespaces fails the test rather than skipping it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from tests.chaos.downstream import fate
from tests.chaos.run import BOT, SECRET, Fleet, Plan, Report, _environment, _judge, _prepare
from tests.downstream import message
from tests.network import NetworkUnavailable, namespace
from tests.postgres_server import required_binaries, running_cluster
from tests.processes import free_port, unavailable

pytestmark = pytest.mark.slow

LEASE = 6.0  # seconds; renewed every third of it, an attempt stopped with over 1 s left
HOLD = 11.0  # the downstream holds a first attempt this long: past its lease
# Longer than the time a silent connection takes to fail (TCP_LIVENESS in
# app/store/backends/postgres_engine.py): the cut worker rejoins on new connections.
PARTITION = 25.0
PLAN = Plan(lease_seconds=LEASE, forward_timeout_seconds=20.0, hang_seconds=HOLD)
HELD = [
    u
    for u in range(1, 2_000)
    if fate("default", u, 1) == "hang" and fate("default", u, 2) == "write"
][:12]
LATER = [u for u in range(2_000, 4_000) if fate("default", u, 1) == "write"][:10]


async def test_a_worker_cut_from_its_database_stops_in_time_and_rejoins(
    postgres_admin: Any, tmp_path: Path
) -> None:
    bindir = required_binaries()
    with ExitStack() as stack:
        try:
            space = stack.enter_context(namespace())
            database_link, downstream_link = space.link(), space.link()
        except NetworkUnavailable as error:
            unavailable(str(error))
        cluster = stack.enter_context(
            running_cluster(bindir, listen=("127.0.0.1", database_link.host_address))
        )
        cluster.trust(database_link.namespace_address)
        url = cluster.url()
        await asyncio.to_thread(_prepare, url)
        journal = tmp_path / "downstream.jsonl"
        port = free_port()
        downstream = f"http://{downstream_link.host_address}:{port}"
        env = _environment(PLAN, url, downstream, tmp_path)
        cut_env = env | {
            "INTAKE_DATABASE_URL": url.replace("127.0.0.1", database_link.host_address),
        }
        fleet = Fleet(tmp_path, env)
        stack.callback(fleet.stop)
        fleet.downstream(port, url, journal, HOLD, host=downstream_link.host_address)
        fleet.intake()
        fleet.worker(env=cut_env, program=space.command(sys.executable, "-m", "app.cli"))
        cut_worker = fleet.workers[0]
        await _until(lambda: _serving(fleet), 60, "the intake and the cut worker start")

        accepted: dict[int, float] = {}
        async with aiohttp.ClientSession() as session:
            for update_id in HELD:
                accepted[update_id] = await _post(session, fleet.intake_urls[0], update_id)
            await _until(lambda: _seen(journal, HELD, "arrived", 1), 30, "the held attempts")
            cut = time.time()
            database_link.cut()
            fleet.worker()  # on loopback: it takes over what the cut one held
            other = fleet.workers[1]
            await _until(lambda: _completed(url, HELD), 60, "the other worker takes over")
            taken_over = time.time()
            await asyncio.sleep(max(0.0, cut + PARTITION - time.time()))
            # The statements sent into the partition failed by themselves (tcp_user_timeout):
            # without it they would wait for the kernel's give-up, a quarter of an hour, and
            # resume by retransmission after the heal.
            assert "Connection timed out" in cut_worker.stderr, cut_worker.report()
            database_link.heal()
            healed = time.time()
            fleet.killed.add(other.pid)
            other.signal(signal.SIGTERM)  # from now on only the cut worker can deliver
            await asyncio.to_thread(other.popen.wait, 30)
            for update_id in LATER:
                accepted[update_id] = await _post(session, fleet.intake_urls[0], update_id)
            await _until(lambda: _completed(url, LATER), 90, "the cut worker delivers again")
            # The held attempts, let go at last, try their write.
            await _until(lambda: _seen(journal, HELD, "answered", 1), 30, "the held answers")
        assert cut_worker.poll() is None, cut_worker.report()  # never restarted
        exited = fleet.exited()
        fleet.stop()
        report = Report(PLAN)
        await asyncio.to_thread(_judge, report, url, journal, accepted)
        lease_ends = await asyncio.to_thread(_lease_ends, url)

    assert report.passed, "\n".join(report.problems[:30])
    assert not exited
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    stopped = {e["update_id"]: e["at"] for e in events if e["event"] == "disconnected"}
    refused = {
        e["update_id"]
        for e in events
        if e["event"] == "answered" and e["attempt"] == 1 and e["status"] == 409
    }
    delivered_later = [
        e["at"]
        for e in events
        if e["event"] == "answered" and e["update_id"] in LATER and e["status"] == 200
    ]
    margins = {u: lease_ends[u] / 1000 - stopped[u] for u in HELD if u in stopped}
    print(
        f"cut to each held attempt stopped: {max(stopped[u] for u in margins) - cut:.2f} s at "
        f"most; before its lease's end by {min(margins.values()):.2f} s at least; cut to "
        f"all taken over: {taken_over - cut:.2f} s; heal to the cut worker's first delivery: "
        f"{min(delivered_later) - healed:.2f} s"
    )
    # The cut worker stopped every held attempt after the cut, before its lease ran out.
    assert set(margins) == set(HELD), (stopped, lease_ends)
    assert all(cut < stopped[u] for u in HELD)
    assert all(margin > 0 for margin in margins.values()), margins
    # Each held attempt, let go at last, found its update taken and wrote nothing.
    assert refused == set(HELD)
    # The later updates were delivered after the heal, by the cut worker alone.
    assert len(delivered_later) == len(LATER)
    assert min(delivered_later) > healed


def _lease_ends(url: str) -> dict[int, int]:
    """Each update's first attempt's lease end, as it stood when another attempt took the
    update over (ms, the service's clock)."""
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT update_id, old_due_at FROM chaos_audit WHERE kind = 'row' "
            "AND old_attempts = 1 AND new_attempts = 2"
        ).fetchall()
    return {update_id: due_at for update_id, due_at in rows}


async def _post(session: aiohttp.ClientSession, intake: str, update_id: int) -> float:
    """Post one update, one chat each, until answered 200; when it was."""
    body = message(update_id, chat=5_000_000 + update_id, text=f"update {update_id}")
    headers = {"x-telegram-bot-api-secret-token": SECRET, "content-type": "application/json"}
    while True:
        async with session.post(f"{intake}/telegram/{BOT}", data=body, headers=headers) as r:
            if r.status == 200:
                return time.time()
        await asyncio.sleep(0.1)


def _serving(fleet: Fleet) -> bool:
    return fleet.intakes[0].answers(f"{fleet.intake_urls[0]}/healthz") and all(
        worker.started() for worker in fleet.workers
    )


def _seen(journal: Path, update_ids: list[int], what: str, attempt: int) -> bool:
    """Whether the downstream's journal has `what` of `attempt` of every one of them."""
    if not journal.exists():
        return False
    seen = {
        event["update_id"]
        for event in map(json.loads, journal.read_text().splitlines())
        if event["event"] == what and event["attempt"] == attempt
    }
    return seen >= set(update_ids)


def _completed(url: str, update_ids: list[int]) -> bool:
    with psycopg.connect(url) as connection:
        row = connection.execute(
            "SELECT count(*) FROM telegram_updates WHERE state = 'completed' "
            "AND update_id = ANY(%s)",
            (update_ids,),
        ).fetchone()
    return row is not None and row[0] == len(update_ids)


async def _until(done: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(done):
        assert time.monotonic() < deadline, f"not within {within:.0f} s: {what}"
        await asyncio.sleep(0.1)
