"""The database fails under the intake: 503 with Retry-After, then 200 again, no restart."""

from __future__ import annotations

import asyncio
import sqlite3

import httpx
import psycopg
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from app.api_keys import ApiKey
from tests.api.conftest import KEY
from tests.conftest import Storage, table_locked, table_rows
from tests.intake.conftest import SECRET, commit_waits_within, intake_on, post


async def test_killed_postgres_connections_give_503_then_recover(
    postgres_storage: Storage, postgres_admin: psycopg.Connection
) -> None:
    url = make_url(postgres_storage.url()).update_query_dict({"application_name": "intake-victim"})
    intake = intake_on(postgres_storage)
    answered: dict[int, httpx.Response] = {}
    async with intake(database_url=url.render_as_string(hide_password=False)) as (base, db):
        async with httpx.AsyncClient(timeout=30) as client:
            # 30 rounds of 10 concurrent posts, so that batches of several rows meet the kills.
            for round_ in range(30):
                if round_ % 6 == 3:  # five times in the run, every connection dies
                    postgres_admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = 'intake-victim'"
                    )
                ids = range(round_ * 10 + 1, round_ * 10 + 11)
                responses = await asyncio.gather(
                    *(post(client, base, f'{{"update_id": {n}}}') for n in ids)
                )
                answered.update(zip(ids, responses, strict=True))
        stored = {update_id for (update_id,) in table_rows(db, "update_id")}
    unavailable = [n for n, r in answered.items() if r.status_code == 503]
    accepted = {n for n, r in answered.items() if r.status_code == 200}
    assert unavailable, "no request met a dead connection"
    assert len(accepted) + len(unavailable) == 300
    assert all(answered[n].headers["retry-after"] == "5" for n in unavailable)
    # Recovered by itself: two rounds after each kill, and until the next, all answer 200.
    recovered = [n for n in answered if (n - 1) // 10 % 6 in (5, 0, 1, 2)]
    assert all(answered[n].status_code == 200 for n in recovered)
    assert accepted <= stored  # every 200 is in the table


async def test_a_commit_over_its_budget_is_503_and_the_next_one_succeeds(
    sqlite_storage: Storage,
) -> None:
    intake = intake_on(sqlite_storage)
    url = sqlite_storage.url()
    path = url.removeprefix("sqlite+aiosqlite:///")
    async with intake(database_url=url, commit_timeout_ms=300) as (base, db):
        async with httpx.AsyncClient(timeout=30) as client:
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")  # another process's long write transaction
            slow = await post(client, base, '{"update_id": 1}')
            blocker.execute("COMMIT")
            blocker.close()
            await asyncio.sleep(0.1)
            fine = await post(client, base, '{"update_id": 2}')
            again = await post(client, base, '{"update_id": 1}')  # Telegram's redelivery
        rows = table_rows(db, "update_id")
    assert slow.status_code == 503
    assert slow.headers["retry-after"] == "5"
    assert (fine.status_code, again.status_code) == (200, 200)
    assert rows == [(1,), (2,)]


async def test_each_request_is_answered_within_its_budget_while_the_table_is_locked(
    postgres_storage: Storage, postgres_admin: psycopg.Connection
) -> None:
    intake = intake_on(postgres_storage)
    keys = (ApiKey(key=SecretStr(KEY)),)
    async with intake(commit_timeout_ms=2000, api_keys=keys) as (base, db):
        async with table_locked(postgres_admin, db):
            every = httpx.Limits(max_connections=None)  # no request queues in the client
            async with httpx.AsyncClient(timeout=30, limits=every) as client:

                async def spread(update_id: int) -> httpx.Response:
                    await asyncio.sleep(update_id % 20 * 0.05)  # arrivals spread over 1 s
                    return await post(client, base, f'{{"update_id": {update_id}}}')

                answers = await asyncio.gather(*(spread(n) for n in range(1, 61)))
        async with httpx.AsyncClient(timeout=30) as client:
            after = await post(client, base, '{"update_id": 1000}')
            exposition = await client.get(
                f"{base}/metrics", headers={"authorization": f"Bearer {KEY}"}
            )
    assert {answer.status_code for answer in answers} == {503}
    within = commit_waits_within(exposition.text, "shop")
    # The 2 s budget, each from its own arrival (a budget per flush took 4 s and more).
    assert within[2.5] == within[float("inf")] == 61, within
    assert after.status_code == 200


async def test_a_body_streamed_slower_than_the_budget_is_503_and_stores_nothing(
    storage: Storage,
) -> None:
    # The budget runs from the head's arrival (docs/contract.md), so a body that takes longer
    # than the budget to come spends it all: the answer is 503 the moment the body is in,
    # and the update is not recorded. The same update sent at once is then recorded.
    intake = intake_on(storage)
    body = b'{"update_id": 77, "message": {"text": "' + b"x" * 2000 + b'"}}'
    async with intake(commit_timeout_ms=400) as (base, db):
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /telegram/shop HTTP/1.1\r\nHost: intake\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nX-Telegram-Bot-Api-Secret-Token: " + SECRET.encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:1000]
        )
        await writer.drain()
        await asyncio.sleep(0.7)  # past the 0.4 s budget, the body still coming
        writer.write(body[1000:])
        await writer.drain()
        answer = await reader.read()
        writer.close()
        slow_rows = table_rows(db, "update_id")
        async with httpx.AsyncClient(timeout=30) as client:
            again = await post(client, base, body)
        rows = table_rows(db, "update_id")
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 503"), head
    assert b"\r\nretry-after: " in head
    assert slow_rows == []
    assert again.status_code == 200
    assert rows == [(77,)]
