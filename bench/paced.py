"""A paced load generator: distinct updates at a fixed rate, latency from the intended send time.

    python -m bench.paced PORT SECRET TEMPLATE --rate R --seconds S --connections C --first N

Request i is due at start + i / R. A scheduler hands due requests to a queue; CONNECTIONS
keep-alive HTTP/1.1 connections take them from it. Latency is measured from when a request was
due, not from when it went out, so a server that stalls cannot hide the requests that queued
behind the stall (no coordinated omission). The scheduler wakes every millisecond, which can add
up to 1 ms to a request's latency. Prints one JSON line, like bench/intake.lua's done().
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import Counter

import uvloop

from bench.intake_servers import BOT, HOST


def encode(template: str, secret: str, update_id: int, n: int) -> bytes:
    """The same request bench/intake.lua sends for this update_id."""
    chat = 1_000_000 + update_id % 1000
    return post(BOT, secret, (template % (update_id, n, chat, chat, n)).encode())


def post(bot: str, secret: str, body: bytes) -> bytes:
    """A webhook POST of `body` to bot `bot`, with its secret, as Telegram sends it."""
    head = (
        f"POST /telegram/{bot} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        f"X-Telegram-Bot-Api-Secret-Token: {secret}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """One answer, its body read and dropped: its status and its headers (names in lower case,
    the last of a repeated one)."""
    head = await reader.readuntil(b"\r\n\r\n")
    headers: dict[bytes, bytes] = {}
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    await reader.readexactly(int(headers.get(b"content-length", 0)))
    return int(head[9:12]), headers


async def run(args: argparse.Namespace) -> dict[str, float]:
    due: asyncio.Queue[int] = asyncio.Queue()
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    total = int(args.rate * args.seconds)
    start = time.perf_counter() + 0.1  # not loop.time(): uvloop's ticks in whole ms

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(HOST, args.port)
        while True:
            n = await due.get()
            try:
                writer.write(encode(args.template, args.secret, args.first + n, n))
                status, _ = await read_head(reader)
                statuses[status] += 1
                latencies.append(time.perf_counter() - (start + n / args.rate))
            except (OSError, asyncio.IncompleteReadError):
                statuses[0] += 1  # a socket error: count it, reconnect, go on
                reader, writer = await asyncio.open_connection(HOST, args.port)
            finally:
                due.task_done()

    workers = [asyncio.create_task(connection()) for _ in range(args.connections)]
    scheduled = 0
    while scheduled < total:
        ready = min(total, int((time.perf_counter() - start) * args.rate) + 1)
        for n in range(scheduled, ready):
            due.put_nowait(n)
        scheduled = max(scheduled, ready)
        await asyncio.sleep(0.001)
    await due.join()
    finished = time.perf_counter()
    for worker in workers:
        worker.cancel()
    percentiles = statistics.quantiles(latencies, n=100)
    return {
        "requests": len(latencies),
        "seconds": finished - start,
        "non2xx": sum(n for status, n in statuses.items() if status and not 200 <= status < 300),
        "socket_errors": statuses[0],
        "p50_ms": percentiles[49] * 1000,
        "p99_ms": percentiles[98] * 1000,
        "sent": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.paced", description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("secret")
    parser.add_argument("template")
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--first", type=int, default=0, help="the first update_id")
    print(json.dumps(uvloop.run(run(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
