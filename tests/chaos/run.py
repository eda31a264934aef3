"""The chaos run: real processes under faults, and a check that nothing was lost or written stale.

On one machine: `intakes` `telegram-intake serve` processes and `workers` `telegram-intake worker`
processes on one PostgreSQL (`cluster.chaos_database`), the downstream of `downstream.py`, and a
load generator that posts `updates` distinct updates over `chats` chats to the intakes, each
chat's updates in order, as Telegram does, retrying anything but a 200, and posting a few
updates a second time. Meanwhile a random worker is killed with SIGKILL every few seconds and
started again, and PostgreSQL is crashed and restarted once, when half the updates are in.
With `Plan.destinations` beyond `default` (`--destinations 3`), the bot has more destinations
(`[[bots.destinations]]` of a config file the run writes), each taking every update: each
delivery is claimed, forwarded, fenced and judged on its own, and the report counts each
destination apart.

Audit triggers record every change of every delivery's row (the update's own for `default`,
`_deliveries` for the others), and every effect in the same sequence with the fence checked
again at the write. At the end, with the queue drained, for each destination:
- lost: an update answered 200 that is not completed or exhausted, or completed without its
  effect;
- stale writes accepted: a row change that moved the identity other than as a claim (of a row
  still to deliver, the next attempt, a claim_id never seen before), that changed a row not
  held by a live claim, a completion the downstream did not answer 2xx to that very identity,
  an exhaustion it did not refuse with a 4xx (nor expiry nor spent attempts), an effect
  written by anyone but the live claim of the moment, an acknowledged exhaustion never
  delivered;
- per-chat order: the downstream saw each chat's updates in update_id order (a stale
  attempt's request that it handled after its successor's, its client gone, is counted apart:
  owns refuses anything it tries);
- secrets: no configured secret appears in any process's log.

With `Plan.pgbouncer` (`python -m tests.chaos --pgbouncer`) the service's processes and the
downstream reach PostgreSQL through PgBouncer in transaction pooling mode (tests/pgbouncer.py),
started in front of the run's database, and the workers LISTEN over a direct URL
(INTAKE_DATABASE_PGBOUNCER, INTAKE_LISTEN_DATABASE_URL); the database crash happens behind it.

With `Plan.fault = "failover"` (`--failover`) the database is a primary and a synchronous
standby (`cluster.failover_database`) named together in one libpq multi-host URL; instead of the
crash, the primary is SIGKILLed and the standby promoted, and no worker is killed (`kill_every`
None): every process must find the new primary by itself. The run measures the gap (kill to
the first 200, promotion to the first delivery) and what the intake answered meanwhile.
`"failover-async"` does the same with an asynchronous standby, where an update answered 200
just before the kill can be lost: the run counts those and how long before the kill each was
answered, rather than failing on them.

`python -m tests.chaos` runs the full size and prints the table; `tests/chaos/test_chaos.py`
runs a short one, direct and through PgBouncer, in the default test command, and
`tests/chaos/test_failover.py` both failovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import psycopg
from sqlalchemy.engine import make_url

from app.bot_settings import BotOptions
from app.dispatch.runner import EXPIRED
from app.store.migrate import upgrade
from app.store.predicates import SPENT_ERROR
from tests.chaos.cluster import Database, chaos_database, failover_database, wait_until_up
from tests.chaos.downstream import EFFECTS, fate
from tests.downstream import message
from tests.pgbouncer import running_pgbouncer
from tests.processes import ROOT, Process, environment, free_port

BOT = "default"
SECRET = "chaos-secret-token-7f3a"
DOWNSTREAM_SECRET = "chaos-downstream-secret-91c2"
SIGNING_SECRET = "whsec_Y2hhb3Mtc2lnbmluZy1zZWNyZXQtZm9yLXRlc3Rz"
API_KEY = "chaos-api-key-5d0e"
BOT_TOKEN = "123456:chaos-bot-token-AAEx9"
AUDIT = """
CREATE TABLE chaos_audit (
    id bigserial PRIMARY KEY,
    kind text NOT NULL DEFAULT 'row',
    bot text, destination text, update_id bigint,
    old_state text, new_state text,
    old_attempts integer, new_attempts integer,
    old_claim_id text, new_claim_id text,
    error text, acknowledged boolean,
    fenced boolean,
    old_due_at bigint  -- a processing row's: its lease's end
);
-- The update's row is `default`'s delivery; a `_deliveries` row names its destination.
CREATE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_audit (bot, destination, update_id, old_state, new_state, old_attempts,
                             new_attempts, old_claim_id, new_claim_id, error, acknowledged,
                             old_due_at)
    VALUES (NEW.bot, coalesce(to_jsonb(NEW) ->> 'destination', 'default'), NEW.update_id,
            OLD.state, NEW.state, OLD.attempts, NEW.attempts, OLD.claim_id, NEW.claim_id,
            NEW.error, NEW.acknowledged_at IS NOT NULL, OLD.due_at);
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_audit AFTER UPDATE ON telegram_updates
    FOR EACH ROW EXECUTE FUNCTION chaos_audit();
CREATE TRIGGER chaos_audit AFTER UPDATE ON telegram_updates_deliveries
    FOR EACH ROW EXECUTE FUNCTION chaos_audit();
-- Each effect, in the same sequence as the row's changes, with the fence checked again at the
-- moment of the write, independently of telegram_intake_owns: the writer's identity is the
-- row's live claim, whose lease had not run out when the writing transaction began (now():
-- before the owns check in it, so a lease that ran out in between is no false alarm).
CREATE FUNCTION chaos_effect_audit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF NEW.destination = 'default' THEN
        SELECT state, attempts, claim_id, due_at INTO r FROM telegram_updates
            WHERE bot = NEW.bot AND update_id = NEW.update_id;
    ELSE
        SELECT state, attempts, claim_id, due_at INTO r FROM telegram_updates_deliveries
            WHERE bot = NEW.bot AND destination = NEW.destination AND update_id = NEW.update_id;
    END IF;
    INSERT INTO chaos_audit (kind, bot, destination, update_id, old_state, new_state,
                             old_attempts, new_attempts, old_claim_id, new_claim_id, fenced)
    VALUES ('effect', NEW.bot, NEW.destination, NEW.update_id, r.state, r.state, NEW.attempt,
            r.attempts,
            NEW.claim_id, r.claim_id,
            r.state = 'processing' AND r.attempts = NEW.attempt AND r.claim_id = NEW.claim_id
            AND r.due_at >= floor(extract(epoch FROM now()) * 1000));
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_effect_audit AFTER INSERT ON chaos_effects
    FOR EACH ROW EXECUTE FUNCTION chaos_effect_audit();
"""


@dataclass(frozen=True)
class Plan:
    updates: int = 20_000
    chats: int = 500
    intakes: int = 2
    workers: int = 3
    repost_share: float = 0.03  # updates posted a second time after their 200
    kill_every: tuple[float, float] | None = (2.0, 5.0)  # seconds between worker kills
    restart_at: float = 0.5  # share of updates accepted when the database fault strikes
    fault: Literal["crash", "failover", "failover-async"] = "crash"
    standby_lag: float = 0.0  # failover-async: nothing reaches the standby this long before
    lease_seconds: float = 4.0
    forward_timeout_seconds: float = 1.0
    hang_seconds: float = 1.5  # a hanging handler outlives the forward timeout
    drain_within: float = 600.0
    rate: float | None = None  # updates posted per second in all; None: as fast as they go
    seed: int = 7
    pgbouncer: bool = False  # the service and the downstream through PgBouncer
    # The bot's destinations, each taking every update; beyond `default`, [[bots.destinations]]
    # of a config file the run writes.
    destinations: tuple[str, ...] = ("default",)


@dataclass
class Tally:
    """One destination's share of the report."""

    delivered: int = 0
    exhausted: int = 0
    lost: int = 0
    stale_writes_accepted: int = 0
    order_violations: int = 0


@dataclass
class Report:
    plan: Plan
    database_fault: str = ""
    database_path: str = "direct"
    accepted: int = 0
    reposted: int = 0
    refusals: Counter[str] = field(default_factory=Counter)  # posts not answered 200, retried
    delivered: int = 0
    duplicates_delivered: int = 0
    exhausted: int = 0
    exhaustions_delivered: int = 0
    exhaustions_listed: int = 0
    lost: int = 0
    stale_writes_accepted: int = 0
    stale_attempts_refused: int = 0  # owns said no to a late attempt: its write did not happen
    late_arrivals: int = 0  # a stale attempt's request handled after its successor's
    order_violations: int = 0
    sent_200: list[tuple[float, float]] = field(default_factory=list)  # (sent, answered)
    lost_ids: list[int] = field(default_factory=list)  # lost where loss is measured
    answered_while_lagging: int | None = None  # answered 200 with nothing reaching the standby
    lost_before_fault: list[float] = field(default_factory=list)  # s from their 200 to the kill
    # Completed on the new primary, their effect not there: the downstream wrote it on the old
    # one while nothing reached the standby (its 2xx in that window), and the worker's settle
    # of the same identity, whose claim had reached it, landed on the new primary after.
    effects_lost: list[int] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)  # processes that ended by themselves
    first_200_after_fault: float | None = None  # s from the kill to a post's 200, sent after
    lag_before_fault: str = ""  # the standby's, as the primary saw it just before the kill
    first_delivery_after_promotion: float | None = None  # s, failover only
    promotion_seconds: float | None = None  # from the promote command to writes taken
    not_ready_seconds: float = 0.0  # how long an intake's /readyz answered other than 200
    secrets_in_logs: int = 0
    workers_killed: int = 0
    database_restarted: bool = False
    answers: Counter[int] = field(default_factory=Counter)
    load_seconds: float = 0.0
    drain_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    by_destination: dict[str, Tally] = field(default_factory=dict)

    def tally(self, destination: str) -> Tally:
        return self.by_destination.setdefault(destination, Tally())

    @property
    def loss_is_measured(self) -> bool:
        """An asynchronous standby may miss the last commits before the kill: updates lost
        then, and chats whose updates came again after later ones (their settles lost), are
        measured, not failures of the run; any other disorder still is one."""
        return self.plan.fault == "failover-async"

    @property
    def passed(self) -> bool:
        return (
            (self.lost == 0 or self.loss_is_measured)
            and self.stale_writes_accepted == 0
            and (self.order_violations == 0 or self.loss_is_measured)
            and self.secrets_in_logs == 0
            and not self.exited
            and not self.problems
        )

    @property
    def refused_posts(self) -> int:
        return sum(self.refusals.values())

    def table(self) -> str:
        plan = self.plan
        answers = ", ".join(f"{status}: {n:,}" for status, n in sorted(self.answers.items()))
        refusals = ", ".join(f"{what}: {n:,}" for what, n in sorted(self.refusals.items()))
        rows = [
            ("processes", f"{plan.intakes} intake, {plan.workers} worker, 1 downstream"),
            ("destinations (each takes every update)", ", ".join(plan.destinations)),
            ("updates posted (distinct)", f"{plan.updates:,} over {plan.chats:,} chats"),
            ("updates accepted (200)", f"{self.accepted:,}"),
            ("posted twice (duplicates, 200)", f"{self.reposted:,}"),
            ("posts refused and retried", f"{self.refused_posts:,} ({refusals or 'none'})"),
            ("delivered (completed, effect written)", f"{self.delivered:,}"),
            ("duplicates delivered (2xx again)", f"{self.duplicates_delivered:,}"),
            ("exhausted", f"{self.exhausted:,}"),
            (
                "exhaustions delivered / listed",
                f"{self.exhaustions_delivered:,} / {self.exhaustions_listed:,}",
            ),
            (
                "**lost**" + (" (measured)" if self.loss_is_measured else " (must be 0)"),
                f"**{self.lost:,}**",
            ),
            ("**stale writes accepted** (must be 0)", f"**{self.stale_writes_accepted:,}**"),
            ("stale attempts refused by owns", f"{self.stale_attempts_refused:,}"),
            ("stale requests handled after their successor's", f"{self.late_arrivals:,}"),
            (
                "per-chat order violations (must be 0)"
                + (": lost settles, redelivered" if self.loss_is_measured else ""),
                f"{self.order_violations:,}",
            ),
            *self._destination_rows(),
            ("secrets found in logs (must be 0)", f"{self.secrets_in_logs:,}"),
            ("downstream answers", answers),
            ("workers killed (SIGKILL) and restarted", f"{self.workers_killed:,}"),
            ("processes that exited by themselves (must be none)", ", ".join(self.exited) or "-"),
            ("database fault", self.database_fault),
            ("the service's connections", self.database_path),
            ("an intake's /readyz not 200", f"{self.not_ready_seconds:.1f} s"),
            ("kill to the first 200 (a post sent after it)", _seconds(self.first_200_after_fault)),
            ("the standby's lag just before the kill", self.lag_before_fault or "-"),
            ("promote command to writes taken", _seconds(self.promotion_seconds)),
            ("promotion to the next delivery", _seconds(self.first_delivery_after_promotion)),
            ("time to post", f"{self.load_seconds:.1f} s"),
            ("time to drain after the last post", f"{self.drain_seconds:.1f} s"),
        ]
        if self.loss_is_measured:
            before = sorted(self.lost_before_fault)
            span = f"{before[0] * 1000:.0f} to {before[-1] * 1000:.0f} ms" if before else "-"
            rows.append(("lost updates: answered 200 this long before the kill", span))
            rows.append(("effects lost with the old primary (2xx while lagging)",
                         f"{len(self.effects_lost):,}"))  # fmt: skip
            if self.answered_while_lagging is not None:
                lagging = f"{self.answered_while_lagging:,}"
                rows.append(("answered 200 while nothing reached the standby", lagging))
        lines = ["| measure | value |", "| --- | --- |"]
        lines += [f"| {name} | {value} |" for name, value in rows]
        return "\n".join(lines)

    def _destination_rows(self) -> list[tuple[str, str]]:
        """With several destinations, each one's row: delivered, exhausted, and what must be 0."""
        if len(self.plan.destinations) < 2:
            return []
        rows = []
        for destination in self.plan.destinations:
            t = self.tally(destination)
            rows.append((
                f"destination {destination}: delivered / exhausted / **lost / stale writes / "
                "order violations** (each must be 0)",
                f"{t.delivered:,} / {t.exhausted:,} / **{t.lost:,} / {t.stale_writes_accepted:,}"
                f" / {t.order_violations:,}**",
            ))  # fmt: skip
        return rows


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


class Fleet:
    """The service's processes, started and killed as the run goes."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self._directory = directory
        self._env = env
        self.all: list[Process] = []
        self.workers: list[Process] = []
        self.intake_urls: list[str] = []
        self.intakes: list[Process] = []
        self.killed: set[int] = set()  # pids the run killed on purpose

    def _start(
        self,
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        program: list[str] | None = None,
    ) -> Process:
        process = Process(
            f"{name}-{len(self.all)}", self._directory, env or self._env, *args, program=program
        )
        self.all.append(process)
        return process

    def intake(self) -> None:
        port = free_port()
        self.intakes.append(
            self._start("intake", "serve", env={**self._env, "INTAKE_PORT": str(port)})
        )
        self.intake_urls.append(f"http://127.0.0.1:{port}")

    def worker(self, env: dict[str, str] | None = None, program: list[str] | None = None) -> None:
        """A worker; `program` runs it otherwise than as `python -m app.cli` (in a network
        namespace, say), `env` gives it settings of its own."""
        self.workers.append(self._start("worker", "worker", env=env, program=program))

    def kill_one_worker(self, rng: random.Random) -> None:
        victim = self.workers.pop(rng.randrange(len(self.workers)))
        self.killed.add(victim.pid)
        victim.signal(signal.SIGKILL)
        victim.popen.wait(timeout=15)
        self.worker()

    def downstream(
        self, port: int, database_url: str, journal: Path, hang: float, host: str = "127.0.0.1"
    ) -> None:
        env = {**self._env, "PYTHONPATH": str(ROOT)}
        self.all.append(
            Process(
                "downstream",
                self._directory,
                env,
                str(port),
                database_url,
                str(journal),
                str(hang),
                host,
                module="tests.chaos.downstream",
            )
        )

    def exited(self) -> list[str]:
        """The processes that ended though the run did not kill them."""
        return [
            f"{p.name} (exit {p.poll()})"
            for p in self.all
            if p.poll() is not None and p.pid not in self.killed
        ]

    def logs(self) -> str:
        return "".join(process.stdout + process.stderr for process in self.all)

    def stop(self) -> None:
        for process in self.all:
            process.kill()


async def run(plan: Plan, directory: Path, admin_url: str) -> Report:
    """One chaos run; its processes write their logs under `directory`."""
    report = Report(plan)
    with contextlib.ExitStack() as stack:
        database: Database = stack.enter_context(
            chaos_database(admin_url)
            if plan.fault == "crash"
            else failover_database(synchronous=plan.fault == "failover", lag=plan.standby_lag)
        )
        report.database_fault = database.fault
        await asyncio.to_thread(_prepare, database.url, pgbouncer=plan.pgbouncer)
        service_url = database.url  # the service's and the downstream's; the judge's is direct
        journal = directory / "downstream.jsonl"
        downstream_port = free_port()
        env = _environment(plan, database.url, f"http://127.0.0.1:{downstream_port}", directory)
        if plan.pgbouncer:
            server = make_url(database.url)
            bouncer = stack.enter_context(
                running_pgbouncer(server.host or "127.0.0.1", server.port or 5432, pool_size=40)
            )
            service_url = bouncer.url(database.url)
            report.database_path = f"through {bouncer.version} (transaction pooling), LISTEN direct"
            env |= {
                "INTAKE_DATABASE_URL": service_url,
                "INTAKE_DATABASE_PGBOUNCER": "true",
                "INTAKE_LISTEN_DATABASE_URL": database.url,
            }
        fleet = Fleet(directory, env)
        try:
            fleet.downstream(downstream_port, service_url, journal, plan.hang_seconds)
            for _ in range(plan.intakes):
                fleet.intake()
            for _ in range(plan.workers):
                fleet.worker()
            await _ready(fleet)
            faults = Faults(plan, fleet, database, report)
            readiness = asyncio.create_task(_watch_readiness(fleet.intake_urls[0], report))
            try:
                accepted = await _load(plan, fleet, faults, report)
                await faults.crashed  # half the updates were in: it has happened
                started = time.monotonic()
                await _drained(database.url, plan.drain_within, report)
                report.drain_seconds = time.monotonic() - started
            finally:
                readiness.cancel()
                await faults.stop()
            report.exited = fleet.exited()
        finally:
            fleet.stop()
        await asyncio.to_thread(_judge, report, database.url, journal, accepted, database.moments)
        _gaps(report, database, accepted, journal)
        secrets = [SECRET, DOWNSTREAM_SECRET, SIGNING_SECRET, API_KEY, BOT_TOKEN]
        secrets += [database.password] if database.password else []
        logs = fleet.logs()
        for secret in secrets:
            if secret in logs:
                report.secrets_in_logs += logs.count(secret)
                report.problems.append(f"a secret ({secret[:4]}...) appears in the logs")
    return report


async def _watch_readiness(intake_url: str, report: Report) -> None:
    """Add up how long the intake's /readyz answered anything but 200 (or nothing)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        while True:
            started = time.monotonic()
            try:
                async with session.get(f"{intake_url}/readyz") as answer:
                    ready = answer.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ready = False
            await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - started)))
            if not ready:
                report.not_ready_seconds += time.monotonic() - started


def _gaps(report: Report, database: Database, accepted: dict[int, float], journal: Path) -> None:
    """The fault's gaps, from the moments it struck (time.time()): to the next update
    answered 200, and from the promotion to the next delivery the downstream answered 2xx;
    and, where loss is measured, how long before the kill each lost update was answered."""
    moments = database.moments
    killed = moments.get("killed")
    if killed is None:
        return
    after = [answered for sent, answered in report.sent_200 if sent > killed]
    report.first_200_after_fault = min(after) - killed if after else None
    report.lost_before_fault = [killed - accepted[update_id] for update_id in report.lost_ids]
    if (lagging := moments.get("lagging")) is not None:
        report.answered_while_lagging = sum(lagging < at < killed for at in accepted.values())
    promoted = moments.get("promoted")
    if promoted is None:
        return
    report.promotion_seconds = promoted - moments["promoting"]
    report.lag_before_fault = database.lag
    deliveries = [
        event["at"]
        for event in map(json.loads, journal.read_text().splitlines())
        if event["event"] == "answered" and 200 <= event["status"] < 300
        and event["at"] > promoted
    ]  # fmt: skip
    report.first_delivery_after_promotion = min(deliveries) - promoted if deliveries else None


def _environment(plan: Plan, database_url: str, downstream: str, directory: Path) -> dict[str, str]:
    """Every process's settings: the tests' process environment, with the run's secrets (which
    the logs must never show) and its leases, timeouts and pauses. With destinations beyond
    `default`, the bot's own settings move to a config file in `directory` (a `[[bots]]` table
    and its `[[bots.destinations]]`, each to the same downstream, which tells them apart by
    `X-Intake-Destination`)."""
    env = environment(
        database_url,
        f"{downstream}/hook",
        secret_token=SECRET,
        exhaustion_url=f"{downstream}/exhausted",
        downstream_secret_token=DOWNSTREAM_SECRET,
        signing_secret=SIGNING_SECRET,
        api_keys=API_KEY,
        bot_token=BOT_TOKEN,
        # The token makes the workers watch the webhook: at a port of this machine where
        # nothing listens, never at Telegram's (the run's traffic stays on this machine).
        bot_api_url=f"http://127.0.0.1:{free_port()}",
        lease_seconds=plan.lease_seconds,
        forward_timeout_seconds=plan.forward_timeout_seconds,
        retry_cap_seconds=0.5,
        breaker_cooldown_seconds=1,
        poll_interval_seconds=0.5,
        exhaustion_retry_seconds=1,
        log_format="json",
    )
    if plan.destinations == ("default",):
        return env
    bot = [
        f"name = {json.dumps(BOT)}",
        f"secret_token = {json.dumps(env.pop('INTAKE_SECRET_TOKEN'))}",
    ]
    for option in BotOptions.model_fields:
        if (value := env.pop(f"INTAKE_{option.upper()}", None)) is not None:
            bot.append(f"{option} = {json.dumps(value)}")
    tables = ["[[bots]]", *bot]
    for destination in plan.destinations:
        if destination != "default":
            tables += ["", "[[bots.destinations]]", f"name = {json.dumps(destination)}"]
            tables.append(f"url = {json.dumps(f'{downstream}/hook')}")
    config = directory / "intake.toml"
    config.write_text("\n".join(tables) + "\n")
    return env | {"INTAKE_CONFIG": str(config)}


def _prepare(database_url: str, *, pgbouncer: bool = False) -> None:
    upgrade(database_url)
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(EFFECTS)
        connection.execute(AUDIT)
        if pgbouncer:
            # Behind PgBouncer the timeouts are the server's (docs/operations.md): the
            # service's defaults, for the run's database.
            name = make_url(database_url).database
            for setting, value in (("statement_timeout", 30_000), ("lock_timeout", 5_000)):
                connection.execute(f"ALTER DATABASE {name} SET {setting} = {value}")


async def _ready(fleet: Fleet, within: float = 60.0) -> None:
    def up() -> bool:
        healthy = zip(fleet.intakes, fleet.intake_urls, strict=True)
        return all(intake.answers(f"{url}/healthz") for intake, url in healthy) and all(
            worker.started() for worker in fleet.workers
        )

    deadline = time.monotonic() + within
    while not await asyncio.to_thread(up):
        _before(deadline, fleet, "the intakes and workers did not start")
        await asyncio.sleep(0.2)


def _before(deadline: float, fleet: Fleet, what: str) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(f"{what}\n" + "\n".join(p.report() for p in fleet.all))


class Faults:
    """Kills a random worker every few seconds until stopped, and crashes the database once,
    when half the updates are in."""

    def __init__(self, plan: Plan, fleet: Fleet, database: Database, report: Report) -> None:
        self._plan = plan
        self._fleet = fleet
        self._database = database
        self._report = report
        self._rng = random.Random(plan.seed + 1)
        self.crash_due = asyncio.Event()
        self._stopping = asyncio.Event()
        self._killer = asyncio.create_task(self._kill_workers())
        self.crashed = asyncio.create_task(self._crash_database())

    async def _kill_workers(self) -> None:
        if self._plan.kill_every is None:
            return
        while True:
            with contextlib.suppress(TimeoutError):
                pause = self._rng.uniform(*self._plan.kill_every)
                await asyncio.wait_for(self._stopping.wait(), pause)
                return
            await asyncio.to_thread(self._fleet.kill_one_worker, self._rng)
            self._report.workers_killed += 1

    async def _crash_database(self) -> None:
        await self.crash_due.wait()
        await asyncio.to_thread(self._database.restart)
        await asyncio.to_thread(wait_until_up, self._database.url)
        self._report.database_restarted = True

    async def stop(self) -> None:
        """Stop killing; a crash under way finishes first (its thread cannot be stopped, and
        the cluster must not be removed under it). A fault that failed is a problem."""
        self._stopping.set()
        if not self.crash_due.is_set():
            self.crashed.cancel()
        for task, fault in ((self._killer, "killing workers"), (self.crashed, "the crash")):
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await task
                except Exception as error:
                    self._report.problems.append(f"{fault} failed: {error!r}")


async def _load(plan: Plan, fleet: Fleet, faults: Faults, report: Report) -> dict[int, float]:
    """Post every update until it is answered 200, each chat's in order, at `plan.rate` in
    all; the update_ids answered 200, each with when it first was (time.time())."""
    rng = random.Random(plan.seed)
    accepted: dict[int, float] = {}
    started = time.monotonic()
    headers = {"x-telegram-bot-api-secret-token": SECRET, "content-type": "application/json"}

    async def post(session: aiohttp.ClientSession, update_id: int, body: str) -> None:
        while True:
            url = rng.choice(fleet.intake_urls)
            sent = time.time()
            try:
                async with session.post(f"{url}/telegram/{BOT}", data=body, headers=headers) as r:
                    if r.status == 200:
                        accepted.setdefault(update_id, time.time())
                        report.sent_200.append((sent, time.time()))
                        return
                    later = " with Retry-After" if "Retry-After" in r.headers else ""
                    report.refusals[f"{r.status}{later}"] += 1
            except (aiohttp.ClientError, TimeoutError):
                report.refusals["no answer"] += 1
            await asyncio.sleep(0.2)

    async def chat(session: aiohttp.ClientSession, index: int, gate: asyncio.Semaphore) -> None:
        chat_id = 5_000_000 + index
        for update_id in range(index + 1, plan.updates + 1, plan.chats):
            if plan.rate:  # update n is due n / rate seconds after the start
                await asyncio.sleep(max(0.0, started + update_id / plan.rate - time.monotonic()))
            body = message(update_id, chat=chat_id, text=f"update {update_id}")
            async with gate:
                await post(session, update_id, body)
            if len(accepted) >= plan.updates * plan.restart_at:
                faults.crash_due.set()
            if rng.random() < plan.repost_share:
                async with gate:
                    await post(session, update_id, body)
                report.reposted += 1

    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        gate = asyncio.Semaphore(64)
        await asyncio.gather(*(chat(session, i, gate) for i in range(plan.chats)))
    report.load_seconds = time.monotonic() - started
    report.accepted = len(accepted)
    return accepted


async def _drained(database_url: str, within: float, report: Report) -> None:
    """Wait until no delivery is waiting and every exhaustion is acknowledged, in every
    destination."""
    deadline = time.monotonic() + within
    waiting = (
        "state IN ('pending', 'processing', 'failed') "
        "OR (state = 'abandoned' AND acknowledged_at IS NULL)"
    )
    query = (
        f"SELECT (SELECT count(*) FROM telegram_updates WHERE {waiting}) "
        f"+ (SELECT count(*) FROM telegram_updates_deliveries WHERE {waiting})"
    )
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(database_url) as connection:
                row = await (await connection.execute(query)).fetchone()
                if row is not None and row[0] == 0:
                    return
        except psycopg.OperationalError:
            pass
        if time.monotonic() > deadline:
            report.problems.append(f"not drained within {within:.0f} s")
            return
        await asyncio.sleep(0.5)


# A delivery: (destination, update_id).
Key = tuple[str, int]
DELIVERIES = """
SELECT 'default', update_id, state, attempts, claim_id, acknowledged_at IS NOT NULL
  FROM telegram_updates WHERE bot = %(bot)s AND state <> 'unrouted'
UNION ALL
SELECT destination, update_id, state, attempts, claim_id, acknowledged_at IS NOT NULL
  FROM telegram_updates_deliveries WHERE bot = %(bot)s
"""


def _judge(
    report: Report,
    database_url: str,
    journal: Path,
    accepted: dict[int, float],
    moments: dict[str, float] | None = None,  # the database fault's (cluster.py), if any
) -> None:
    with psycopg.connect(database_url) as connection:
        rows: dict[Key, tuple[str, int, str, bool]] = {
            (destination, update_id): (state, attempts, claim_id, acknowledged)
            for destination, update_id, state, attempts, claim_id, acknowledged in (
                connection.execute(DELIVERIES, {"bot": BOT})
            )
        }
        audit = [
            ((destination, update_id), *rest)
            for destination, update_id, *rest in connection.execute(
                "SELECT destination, update_id, old_state, new_state, old_attempts, "
                "new_attempts, old_claim_id, new_claim_id, error, acknowledged, kind, fenced "
                "FROM chaos_audit ORDER BY id"
            )
        ]
        effects: dict[Key, tuple[int, str]] = {
            (destination, update_id): (attempt, claim_id)
            for destination, update_id, attempt, claim_id in connection.execute(
                "SELECT destination, update_id, attempt, claim_id FROM chaos_effects"
            )
        }
    events = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    answers: dict[tuple[Key, int, str], list[int]] = defaultdict(list)
    exhaustions: set[tuple[Key, int, str]] = set()
    successes: Counter[Key] = Counter()
    succeeded_at: dict[Key, list[float]] = defaultdict(list)  # when the downstream said 2xx
    for event in events:
        key = (event["destination"], event["update_id"])
        attempt = (key, event["attempt"], event["claim_id"])
        if event["event"] == "answered":
            answers[attempt].append(event["status"])
            report.answers[event["status"]] += 1
            if 200 <= event["status"] < 300:
                successes[key] += 1
                succeeded_at[key].append(event["at"])
            if event["status"] == 409:
                report.stale_attempts_refused += 1
        elif event["event"] == "exhaustion":
            exhaustions.add(attempt)

    # Lost: answered 200, and in some destination neither completed (with its effect) nor
    # exhausted.
    for update_id in sorted(accepted):
        for destination in report.plan.destinations:
            key = (destination, update_id)
            row = rows.get(key)
            if row is None and report.loss_is_measured:
                _lost(report, key)  # never reached the standby: measured in `_gaps`
                if update_id not in report.lost_ids:
                    report.lost_ids.append(update_id)
            elif row is None or row[0] not in ("completed", "abandoned"):
                _lost(report, key, f"{_named(key)} lost: row {row}")
            elif row[0] == "completed" and key not in effects:
                lagging, killed = (moments or {}).get("lagging"), (moments or {}).get("killed")
                if (
                    report.loss_is_measured
                    and lagging is not None
                    and killed is not None
                    and any(lagging <= at <= killed for at in succeeded_at[key])
                ):
                    report.effects_lost.append(update_id)
                    continue
                _lost(report, key, f"{_named(key)} completed without its effect")
    for (destination, update_id), (state, attempts, claim_id, acknowledged) in rows.items():
        tally = report.tally(destination)
        if state == "completed":
            report.delivered += 1
            tally.delivered += 1
        elif state == "abandoned":
            report.exhausted += 1
            tally.exhausted += 1
            if acknowledged:
                report.exhaustions_delivered += 1
            else:
                report.exhaustions_listed += 1
            key = (destination, update_id)
            if acknowledged and (key, attempts, claim_id) not in exhaustions:
                _stale(report, key, f"{_named(key)}: acknowledged, never delivered")
    report.duplicates_delivered = sum(n - 1 for n in successes.values() if n > 1)

    _judge_history(report, audit, answers, effects)
    _judge_order(report, events)


def _judge_order(report: Report, events: list[dict[str, Any]]) -> None:
    """Each destination's chats in update order, as the downstream saw their arrivals."""
    chats: dict[tuple[str, int], list[int]] = defaultdict(list)  # (destination, chat)
    newest: dict[Key, int] = {}  # each delivery's newest attempt to arrive so far
    for event in events:
        if event["event"] != "arrived":
            continue
        key = (event["destination"], event["update_id"])
        if event["attempt"] < newest.get(key, 0):
            # A stale attempt's request handled after its successor's: its client had given
            # up (the forward timed out) before the downstream got to it, and owns refuses
            # any write it tries. Not an arrival in the chat's order; counted apart.
            report.late_arrivals += 1
            continue
        newest[key] = event["attempt"]
        chats[(event["destination"], event["chat"])].append(event["update_id"])
    for (destination, chat), arrivals in chats.items():
        if any(later < earlier for earlier, later in itertools.pairwise(arrivals)):
            report.order_violations += 1
            report.tally(destination).order_violations += 1
            # Where loss is measured, a chat may see an update again whose settle the standby
            # never had, after the ones that followed it; any other disorder is a fault.
            delivered_again = len(set(arrivals)) < len(arrivals)
            if not (report.loss_is_measured and delivered_again):
                report.problems.append(f"{destination}: chat {chat} out of order: {arrivals}")


def _judge_history(
    report: Report,
    audit: list[tuple[Any, ...]],
    answers: dict[tuple[Key, int, str], list[int]],
    effects: dict[Key, tuple[int, str]],
) -> None:
    """Each audit entry (the delivery's key first) against the claims before it and what the
    downstream answered each identity."""
    claims: set[str] = set()
    claimed: dict[Key, set[tuple[int, str]]] = defaultdict(set)
    for entry in audit:
        key, old_state, new_state, old_n, new_n, old_claim, new_claim, error = entry[:8]
        named = _named(key)
        kind, fenced = (entry[9], entry[10]) if len(entry) > 9 else ("row", None)
        if kind == "effect":
            # The writer's identity against the row's state at the moment of the write.
            if not fenced:
                _stale(report, key, f"{named}: effect by {old_n}/{old_claim}, not the live "
                       f"claim then ({new_state}, {new_n}/{new_claim})")  # fmt: skip
            continue
        if (old_n, old_claim) != (new_n, new_claim):
            # A claim: of a delivery still to make, the next attempt, a claim_id never used
            # (in any destination: claim ids are unique across them all).
            if (
                old_state not in ("pending", "processing", "failed")
                or new_state != "processing"
                or new_n != old_n + 1
                or new_claim is None
                or new_claim in claims
            ):
                _stale(report, key, f"{named}: identity moved outside a claim: {entry}")
            claims.add(new_claim)
            claimed[key].add((new_n, new_claim))
            continue
        identity = (key, new_n, new_claim)
        if old_state == "abandoned" and new_state == "abandoned":
            continue  # the exhaustion's acknowledgement
        if new_state == "abandoned" and error == SPENT_ERROR:
            continue  # a claim found its attempts spent: exhausted as the last attempt left it
        if old_state != "processing":
            _stale(report, key, f"{named}: a row not held was changed: {entry}")
        elif new_state == "completed" and not any(200 <= s < 300 for s in answers[identity]):
            _stale(report, key, f"{named}: completed without a 2xx to {identity}")
        elif new_state == "abandoned" and not (
            any(400 <= s < 500 and s != 409 for s in answers[identity])
            or error == EXPIRED
            or (error or "").startswith(SPENT_ERROR)  # the last attempt failed retryably
        ):
            _stale(report, key, f"{named}: exhausted without a 4xx to {identity}: {error}")
    for key, (attempt, claim_id) in effects.items():
        if (attempt, claim_id) not in claimed[key]:
            _stale(report, key, f"{_named(key)}: effect by {attempt}/{claim_id}, never a claim")
        if fate(*key, attempt) == "reject":
            _stale(report, key, f"{_named(key)}: effect of a rejected update")


def _named(key: Key) -> str:
    destination, update_id = key
    return f"update {update_id}" + ("" if destination == "default" else f" ({destination})")


def _lost(report: Report, key: Key, problem: str | None = None) -> None:
    report.lost += 1
    report.tally(key[0]).lost += 1
    if problem is not None:
        report.problems.append(problem)


def _stale(report: Report, key: Key, problem: str) -> None:
    report.stale_writes_accepted += 1
    report.tally(key[0]).stale_writes_accepted += 1
    report.problems.append(problem)
