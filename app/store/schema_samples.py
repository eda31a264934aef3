"""The console's minute samples as metadata (revision 0011, docs/design.md decision 8): the
table, the counts each row holds, the receipt-to-delivery buckets."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, MetaData, PrimaryKeyConstraint, Table, Text, text


def samples_table_name(table: str) -> str:
    return f"{table}_samples"


# The receipt-to-delivery buckets of a sample (upper bounds, ms), as the metric's
# (`app.metrics.DELIVERY_BUCKETS`): a delivery counts in the first bucket it is within, and past
# the last in `over`.
SAMPLE_BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
                     300_000, 900_000, 3_600_000)  # fmt: skip
SAMPLE_COUNTS = (
    "received", "delivered", "retried", "exhausted",
    "answered_2xx", "answered_3xx", "answered_4xx", "answered_5xx",
    "timeouts", "connection_errors", "answered_other",
    *(f"within_{ms}" for ms in SAMPLE_BUCKETS_MS), "over",
)  # fmt: skip


def add_sample_table(metadata: MetaData, table: str) -> None:
    """Revision 0011 (docs/design.md decision 8): per bot, destination and minute (epoch ms of
    its start), what the processes counted (`SAMPLE_COUNTS`, each added by every process that
    saw it) and the backlog as one process sampled it (NULL: not sampled that minute). A row
    of empty bot and destination marks a minute whose backlog a process took to sample."""
    name = samples_table_name(table)
    Table(
        name,
        metadata,
        Column("bot", Text, nullable=False),
        Column("destination", Text, nullable=False),
        Column("minute", BigInteger, nullable=False),
        *(
            Column(count, BigInteger, nullable=False, server_default=text("0"))
            for count in SAMPLE_COUNTS
        ),
        Column("backlog", BigInteger, nullable=True),
        Column("oldest_age_ms", BigInteger, nullable=True),
        PrimaryKeyConstraint("bot", "destination", "minute", name=f"pk_{name}"),
    )
