"""The hostile-input campaign of issue 20, against one running `telegram-intake serve`: what a
client with no key (or with one, for the API's bodies) can send, family by family, while a
legitimate webhook is posted every 100 ms throughout. Each family records what was tried, what
the service answered, the process's memory before, at its peak and after, its open file
descriptors at their peak, and whether every legitimate webhook got its 200.

Families (the issue's items):
- `api-bodies`: 8 concurrent 50 MB `POST /v1/claims/owns` with no key;
- `silent`: connections that send nothing, held by helper processes (`hold`), past the
  header timeout;
- `half-sent`: half a request head, a head trickled a byte at a time, half a body;
- `header-floods`: unterminated 64 MB header lines, and heads of 1,000 headers;
- `json`: bodies that strict parsers refuse, to the webhook and to the API (with a key);
- `protocol`: Content-Encoding, a trailing slash with a foreign Host, doubled headers.

`python -m tests.hostile` runs the full size on both backends and prints the table;
`tests/hostile/test_campaign.py` runs a smaller one in the default test command.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.http.raw import closed, connect, head, is_open, read_answer
from tests.processes import ROOT, SECRET, Process, environment, free_port

API_KEY = "hostile-campaign-key-0123456789"
WEBHOOK = [("x-telegram-bot-api-secret-token", SECRET), ("content-type", "application/json")]
MIB = 1024 * 1024
LEGIT_IDS = 10**9  # the legitimate webhooks' update_ids start here; the hostile ones are below


@dataclass(frozen=True)
class Size:
    api_bodies: int = 8  # concurrent connections
    api_body_bytes: int = 50_000_000
    silent: int = 20_200  # connections, across `holders` helper processes
    holders: int = 2
    half_sent: int = 200  # of each kind
    header_floods: int = 4
    header_flood_bytes: int = 64 * MIB


FULL = Size()
SHORT = Size(silent=6_000, half_sent=50, header_flood_bytes=16 * MIB)


@dataclass
class Row:
    family: str
    inputs: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    rss_before_kib: int = 0
    rss_peak_kib: int = 0
    rss_after_kib: int = 0
    fds_peak: int = 0
    legit_sent: int = 0
    legit_ok: int = 0

    @property
    def growth_kib(self) -> int:
        """Memory kept or reached over the start, whichever is more."""
        return max(self.rss_peak_kib, self.rss_after_kib) - self.rss_before_kib


class Target:
    """One `serve` process, its pid for memory and descriptors, its port for requests."""

    def __init__(self, process: Process, port: int, url: str) -> None:
        self.process = process
        self.port = port
        self.url = url
        self.base = f"http://127.0.0.1:{port}"

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1])

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))


def start_target(directory: Path, url: str, **options: object) -> Target:
    """`telegram-intake serve` over `url`, migrated, with the campaign's key; answers /healthz."""
    port = free_port()
    env = environment(url, None, port=port, api_keys=API_KEY, log_level="warning", **options)
    process = Process("serve", directory, env, "serve")
    target = Target(process, port, url)
    deadline = time.monotonic() + 30
    while not process.answers(f"{target.base}/healthz"):
        assert time.monotonic() < deadline, process.report()
        time.sleep(0.1)
    return target


@contextmanager
def watched(target: Target, family: str) -> Iterator[Row]:
    """A row for `family`: memory and descriptors sampled every 20 ms, and a legitimate
    webhook posted every 100 ms on a fresh connection, for as long as the block runs."""
    row = Row(family, rss_before_kib=target.rss_kib())
    row.rss_peak_kib = row.rss_before_kib
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            try:
                row.rss_peak_kib = max(row.rss_peak_kib, target.rss_kib())
                row.fds_peak = max(row.fds_peak, target.fds())
            except (FileNotFoundError, ProcessLookupError):
                return

    update_ids = iter(range(LEGIT_IDS + 1_000_000 * len(family), LEGIT_IDS + 10**12))

    def post_legit() -> None:
        body = json.dumps({"update_id": next(update_ids), "message": {"text": "legit"}})
        row.legit_sent += 1
        try:
            with httpx.Client(timeout=10) as client:
                answer = client.post(
                    f"{target.base}/telegram/default", content=body, headers=dict(WEBHOOK)
                )
            row.legit_ok += answer.status_code == 200
        except httpx.HTTPError:
            pass

    def legit() -> None:
        post_legit()
        while not stop.wait(0.1):
            post_legit()

    threads = [threading.Thread(target=sample), threading.Thread(target=legit)]
    for thread in threads:
        thread.start()
    try:
        yield row
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        post_legit()  # and once more when the family is done
        time.sleep(0.5)
        row.rss_after_kib = target.rss_kib()


def _parallel(count: int, work: Callable[[int], str]) -> Counter[str]:
    answers: Counter[str] = Counter()
    lock = threading.Lock()

    def run(index: int) -> None:
        answer = work(index)
        with lock:
            answers[answer] += 1

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return answers


def _status(sock: socket.socket, timeout: float = 15) -> str:
    try:
        answer = read_answer(sock, timeout)
    except AssertionError as problem:
        return f"no answer ({problem})"
    except OSError as problem:
        return f"no answer ({type(problem).__name__})"
    return f"{answer.status}" + (", closed" if answer.closed else "")


# -- the families ---------------------------------------------------------------------


def api_bodies(target: Target, size: Size) -> Row:
    def send(_index: int) -> str:
        with connect(target.port, timeout=30) as sock:
            sock.sendall(
                head(
                    "POST",
                    "/v1/claims/owns",
                    [("content-type", "application/json"),
                     ("content-length", str(size.api_body_bytes))],
                )
            )  # fmt: skip
            chunk = b"x" * MIB
            try:
                for _ in range(size.api_body_bytes // MIB):
                    sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return _status(sock)

    with watched(target, "api-bodies: 50 MB POST /v1 without a key") as row:
        row.answers = _parallel(size.api_bodies, send)
        row.inputs = size.api_bodies
    return row


def silent(target: Target, size: Size, header_timeout: float) -> Row:
    """Connections that never send a byte, opened by helper processes (a process may hold
    only so many descriptors), checked again past the header timeout."""
    per_holder = size.silent // size.holders
    with watched(target, "silent: connections that send nothing") as row:
        holders = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.hostile.campaign", "hold", str(target.port),
                 str(per_holder), str(header_timeout + 3)],
                cwd=ROOT, stdout=subprocess.PIPE, text=True,
            )
            for _ in range(size.holders)
        ]  # fmt: skip
        for holder in holders:
            out, _ = holder.communicate(timeout=header_timeout + 120)
            for line in out.splitlines():
                outcome, count = line.rsplit(" ", 1)
                row.answers[outcome] += int(count)
        row.inputs = per_holder * size.holders
    return row


def hold(port: int, count: int, seconds: float) -> None:
    """The helper: open `count` silent connections, wait `seconds`, print what became of them."""
    sockets, refused = [], 0
    for _ in range(count):
        try:
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        except OSError:
            refused += 1
    time.sleep(seconds)
    still = sum(is_open(sock) for sock in sockets)
    print(f"closed by the server within {seconds:.0f} s {len(sockets) - still}")
    print(f"still open after {seconds:.0f} s {still}")
    print(f"not accepted {refused}", flush=True)
    for sock in sockets:
        sock.close()


def half_sent(target: Target, size: Size, header_timeout: float, body_timeout: float) -> Row:
    webhook_head = head("POST", "/telegram/default", [*WEBHOOK, ("content-length", "100")])

    def half_head(_index: int) -> str:
        with connect(target.port, timeout=30) as sock:
            sock.sendall(webhook_head[: len(webhook_head) // 2])
            return "half a head: " + _status(sock, header_timeout + 10)

    def trickled_head(_index: int) -> str:
        with connect(target.port, timeout=30) as sock:
            started = time.monotonic()
            try:
                for byte in webhook_head[:-4]:
                    sock.sendall(bytes([byte]))
                    if not closed(sock, 0.5):
                        continue
                    break
            except (BrokenPipeError, ConnectionResetError):
                pass
            waited = time.monotonic() - started
            fate = "closed" if closed(sock, header_timeout + 10) else "open"
            return f"a head trickled a byte every 0.5 s: {fate} by {_bucket(waited)}"

    def half_body(_index: int) -> str:
        with connect(target.port, timeout=30) as sock:
            sock.sendall(webhook_head + b'{"update_id": 1, "pad": "')
            started = time.monotonic()
            fate = "closed" if closed(sock, body_timeout + 10) else "open"
            return f"half a body: {fate} by {_bucket(time.monotonic() - started)}"

    with watched(target, "half-sent: heads and bodies that stop or trickle") as row:
        for kind in (half_head, trickled_head, half_body):
            row.answers += _parallel(size.half_sent, kind)
        row.inputs = 3 * size.half_sent
    return row


def _bucket(seconds: float) -> str:
    return f"{int(seconds) + 1} s"


def header_floods(target: Target, size: Size) -> Row:
    def endless_line(_index: int) -> str:
        with connect(target.port, timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-flood: ")
            chunk, sent = b"a" * MIB, 0
            try:
                while sent < size.header_flood_bytes:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return f"an endless header line: {_status(sock)} after {sent // MIB} MiB sent"

    def many_headers(index: int) -> str:
        with connect(target.port, timeout=30) as sock:
            headers = [(f"x-h{n}", "v") for n in range(1_000)]
            with suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(head("GET", "/healthz", headers))
            return f"1,000 headers: {_status(sock)}"

    with watched(target, "header-floods: endless and numerous headers") as row:
        row.answers += _parallel(size.header_floods, endless_line)
        row.answers += _parallel(size.header_floods, many_headers)
        row.inputs = 2 * size.header_floods
    return row


JSON_BODIES = {
    "duplicate names": b'{"update_id": 1701, "update_id": 1702}',
    "a lone surrogate": b'{"update_id": 1703, "x": "\\ud800"}',
    "a number beyond a double": b'{"update_id": 1704, "x": 1e999999999}',
    "a byte-order mark": b'\xef\xbb\xbf{"update_id": 1705}',
    "invalid UTF-8": b'{"update_id": 1706, "x": "\xff"}',
    "5,000 digits": b'{"update_id": ' + b"9" * 5_000 + b"}",
    "nesting 30,000 deep": b'{"update_id": 1707, "x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
    "update_id 1708.0": b'{"update_id": 1708.0}',
    "NaN": b'{"update_id": 1709, "x": NaN}',
}


def json_rules(target: Target) -> Row:
    with (
        watched(target, "json: bodies strict parsers refuse") as row,
        httpx.Client(base_url=target.base, timeout=10) as client,
    ):
        for name, body in JSON_BODIES.items():
            webhook = client.post("/telegram/default", content=body, headers=dict(WEBHOOK))
            api = client.post(
                "/v1/claims/owns",
                content=body,
                headers={"content-type": "application/json",
                         "authorization": f"Bearer {API_KEY}"},
            )  # fmt: skip
            row.answers[f"{name}: webhook {webhook.status_code}, API {api.status_code}"] += 1
            row.inputs += 2
    return row


def protocol(target: Target) -> Row:
    plain = b'{"update_id": 1801}'
    cases: list[tuple[str, bytes]] = [
        ("Content-Encoding: gzip on a plain body",
         head("POST", "/telegram/default", [*WEBHOOK, ("content-encoding", "gzip"),
                                            ("content-length", str(len(plain)))]) + plain),
        ("a real gzip body",
         head("POST", "/telegram/default", [*WEBHOOK, ("content-encoding", "gzip"),
                                            ("content-length", str(len(gzip.compress(plain))))])
         + gzip.compress(plain)),
        ("POST /telegram/default/ with Host: evil.example",
         head("POST", "/telegram/default/", [*WEBHOOK, ("content-length", str(len(plain)))],
              host="evil.example") + plain),
        ("two Authorization headers",
         head("GET", "/v1/stats", [("authorization", f"Bearer {API_KEY}")] * 2)),
        ("two secret-token headers",
         head("POST", "/telegram/default", [*WEBHOOK, WEBHOOK[0],
                                            ("content-length", str(len(plain)))]) + plain),
    ]  # fmt: skip
    with watched(target, "protocol: encodings, redirects, doubled headers") as row:
        for name, request in cases:
            with connect(target.port) as sock:
                sock.sendall(request)
                try:
                    answer = read_answer(sock)
                    location = answer.headers.get("location")
                    said = f"{answer.status}" + (f" location {location}" if location else "")
                except AssertionError as problem:
                    said = f"no answer ({problem})"
            row.answers[f"{name}: {said}"] += 1
            row.inputs += 1
    return row


def run(target: Target, size: Size, header_timeout: float, body_timeout: float) -> list[Row]:
    return [
        api_bodies(target, size),
        silent(target, size, header_timeout),
        half_sent(target, size, header_timeout, body_timeout),
        header_floods(target, size),
        json_rules(target),
        protocol(target),
    ]


def table(backend: str, rows: list[Row]) -> str:
    lines = [
        f"| {backend}: family | inputs | answers | RSS before / peak / after (MiB) "
        "| descriptors at peak | legit webhooks 200 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        answers = "; ".join(f"{answer} x{count:,}" for answer, count in sorted(row.answers.items()))
        lines.append(
            f"| {row.family} | {row.inputs:,} | {answers} | {row.rss_before_kib / 1024:.0f} / "
            f"{row.rss_peak_kib / 1024:.0f} / {row.rss_after_kib / 1024:.0f} | {row.fds_peak:,} "
            f"| {row.legit_ok} / {row.legit_sent} |"
        )
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["hold"]:
    hold(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
