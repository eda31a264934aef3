"""The callback API's messages (docs/contract.md section 5), shared by the service and the
downstream kit.

One definition of each request and answer: the service validates with these models and its
OpenAPI document is generated from them; the kit's client sends and parses the same models.
Pydantic only: importable by a downstream that has none of the server's dependencies.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator
from pydantic.config import JsonDict

# The store's rules for these fields (app.store.validate), as constraints a client can read.
BOT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
MAX_BIGINT = 2**63 - 1
MAX_INTEGER = 2**31 - 1
MAX_ERROR_LENGTH = 2_000
NO_NUL = r"^[^\x00]*$"  # PostgreSQL text cannot hold a NUL character


# An integer field takes an integer literal only (467, never 467.0, true or "467"), as the
# webhook's update_id does. JSON Schema calls 467.0 an integer; this API does not, on purpose
# (docs/api.md): past 2**53 a float no longer holds every whole number, and one rule for both
# readers (`app.http.strict_json` reads every body first) is simpler to keep.
BotName = Annotated[str, Field(pattern=BOT_PATTERN, examples=["default"])]
UpdateId = Annotated[StrictInt, Field(ge=0, le=MAX_BIGINT, examples=[123456789])]
EpochMillis = Annotated[StrictInt, Field(description="epoch milliseconds")]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Problem(Message):
    """What every refusal answers; a failure (the database's, or one nothing expected) also
    names the request id under which the server's log holds its detail."""

    error: str
    request_id: str | None = None


Attempt = Annotated[StrictInt, Field(ge=1, le=MAX_INTEGER, examples=[1])]
ClaimId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=NO_NUL,
        examples=["0f9c3e9e-8a53-4c39-9d5e-2d6f3c1b7a10"],
        description="opaque; compared exactly",
    ),
]


# The destination of a bot's own downstream (docs/destinations.md): what an identity without
# one means, so that a kit or a service from before destinations keeps working.
DEFAULT_DESTINATION = "default"
DestinationName = Annotated[
    str,
    Field(
        pattern=BOT_PATTERN,
        examples=[DEFAULT_DESTINATION],
        description="the destination the attempt delivers to; absent: default",
    ),
]


class Identity(Message):
    """One attempt: what `X-Intake-Bot`, `-Update-Id`, `-Attempt`, `-Claim-Id` and
    `-Destination` carried."""

    bot: BotName
    update_id: UpdateId
    attempt: Attempt
    claim_id: ClaimId
    destination: DestinationName = DEFAULT_DESTINATION

    def key(self) -> str:
        """The idempotency key of the update's effects for its destination: `bot:update_id`
        for `default`, `bot:destination:update_id` for any other (the signed `webhook-id`)."""
        if self.destination == DEFAULT_DESTINATION:
            return f"{self.bot}:{self.update_id}"
        return f"{self.bot}:{self.destination}:{self.update_id}"


class Owned(Message):
    owned: bool
    lease_expires_at: EpochMillis | None = Field(
        description="when the answer stops holding, by the database clock; null if not owned"
    )


class RenewRequest(Identity):
    lease_ms: Annotated[StrictInt, Field(ge=1, le=86_400_000)] | None = Field(
        None, description="the new lease, from now; default the bot's lease_seconds"
    )


class Renewed(Message):
    renewed: bool
    lease_expires_at: EpochMillis | None


Outcome = Literal["completed", "failed", "exhausted"]


_NULL: JsonDict = {"type": "null"}


class SettleRequest(Identity):
    # The validator's rules below, published in the schema too (JSON Schema conditionals), so
    # that a client generated from the document knows them.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"outcome": {"const": "completed"}}},
                    "then": {"properties": {"error": _NULL, "retry_after_ms": _NULL}},
                },
                {
                    "if": {"properties": {"outcome": {"const": "exhausted"}}},
                    "then": {"properties": {"retry_after_ms": _NULL}},
                },
            ]
        }
    )

    outcome: Outcome
    error: (
        Annotated[str, Field(min_length=1, max_length=MAX_ERROR_LENGTH, pattern=NO_NUL)] | None
    ) = None
    retry_after_ms: Annotated[StrictInt, Field(ge=0, le=7 * 86_400_000)] | None = Field(
        None, description="failed only: when to retry (capped by the bot's retry_after_cap)"
    )

    @model_validator(mode="after")
    def _retry_only_when_failed(self) -> SettleRequest:
        if self.retry_after_ms is not None and self.outcome != "failed":
            raise ValueError("retry_after_ms is for outcome 'failed' only")
        if self.error is not None and self.outcome == "completed":
            raise ValueError("error is for outcomes 'failed' and 'exhausted' only")
        return self


class Settled(Message):
    settled: bool


class Acknowledged(Message):
    acknowledged: bool


class ExhaustionItem(Identity):
    error: str | None
    exhausted_at: EpochMillis
    update: str = Field(description="the raw update, as Telegram sent it")


class ExhaustionPage(Message):
    items: list[ExhaustionItem]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class DeliveryView(Message):
    """A delivery beside the update's row, to one destination other than `default`."""

    destination: DestinationName
    state: Literal["pending", "processing", "completed", "failed", "abandoned"]
    attempts: int
    due_at: EpochMillis
    settled_at: EpochMillis | None
    error: str | None
    claim_id: str | None
    exhausted_at: EpochMillis | None
    acknowledged_at: EpochMillis | None


class UpdateView(Message):
    bot: BotName
    update_id: UpdateId
    state: Literal["pending", "processing", "completed", "failed", "abandoned", "unrouted"]
    attempts: int
    update_type: str | None
    queue_key: str | None
    received_at: EpochMillis
    due_at: EpochMillis
    settled_at: EpochMillis | None
    error: str | None
    claim_id: str | None
    exhausted_at: EpochMillis | None
    acknowledged_at: EpochMillis | None
    # When retention erased its body (the row stays); None before, or below revision 0009.
    erased_at: EpochMillis | None = None
    # Its deliveries to the bot's other destinations (null in a search's summaries, which do
    # not read them); the row's own fields are `default`'s (its state `unrouted` when the
    # update does not go to `default`).
    deliveries: list[DeliveryView] | None = None
    # Whose delivery the row's fields describe: `default`'s, or, asked with `destination=`
    # (and always for a key limited to destinations), that destination's.
    destination: DestinationName = DEFAULT_DESTINATION


class BotCounts(Message):
    bot: BotName
    states: dict[str, int]
    oldest_undelivered_age_ms: int | None = Field(
        description="age of the oldest pending, processing or failed row"
    )
    unacknowledged_exhaustions: int | None


class DestinationCounts(BotCounts):
    """One destination's deliveries beside the rows (docs/destinations.md)."""

    destination: DestinationName


class Stats(Message):
    at: EpochMillis
    bots: list[BotCounts]
    # The bots' destinations beside `default` with deliveries, by bot and destination.
    destinations: list[DestinationCounts] = []
