"""One bot's settings: `BotOptions`, what a bot may set beyond its name and secret (the
environment sets them for the `default` bot, a `[[bots]]` table for each named bot), and
`BotSettings`, a whole bot. `app.config.Settings` holds them.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from app.store import validate
from app.store.types import Capability, Ordering
from app.webhook_rules import MAX_CONNECTIONS_LOCAL, check_secret_token, update_types_problem

Mode = Literal["plain", "fenced", "durable"]
# Past these ages (seconds from receipt) a delivery can no longer help: Telegram has already
# given up on the answer (inline and callback queries) or on the payment step.
DEFAULT_DEADLINES = {
    "inline_query": 30.0,
    "callback_query": 150.0,
    "shipping_query": 10.0,
    "pre_checkout_query": 10.0,
}


class BotOptions(BaseModel):
    """What a bot may set beyond its name and secret; the environment sets them for the
    `default` bot, a `[[bots]]` table for each named bot."""

    bot_token: SecretStr | None = None
    downstream_url: AnyHttpUrl | None = None
    downstream_secret_token: SecretStr | None = None
    signing_secret: SecretStr | None = None
    exhaustion_url: AnyHttpUrl | None = None
    mode: Mode = "durable"
    max_attempts: int = Field(8, ge=1, le=1000)
    lease_seconds: float = Field(60, gt=0, le=86_400)
    ordering: Ordering = "chat"
    concurrency: int = Field(64, ge=1, le=10_000)  # this bot's requests in flight, per process
    forward_timeout_seconds: float = Field(30, gt=0, le=3600)
    retry_base_seconds: float = Field(2, gt=0, le=86_400)
    retry_cap_seconds: float = Field(600, gt=0, le=7 * 86_400)
    retry_after_cap_seconds: float = Field(600, ge=0, le=7 * 86_400)
    # Update type -> seconds from receipt; merged over DEFAULT_DEADLINES, 0 turns one off.
    deadlines: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_DEADLINES))
    breaker_failures: int = Field(5, ge=0, le=10_000)  # consecutive failures; 0: no breaker
    # What `set-webhook` registers with Telegram (None: none sent). allowed_updates: names
    # of app.queues.QUEUES; max_connections: 1-100, up to 100000 with a local Bot API server
    # (Settings checks it against bot_api_url).
    allowed_updates: tuple[str, ...] | None = None
    max_connections: int | None = Field(None, ge=1, le=MAX_CONNECTIONS_LOCAL)
    breaker_cooldown_seconds: float = Field(30, gt=0, le=86_400)
    # Where updates come from (docs/contract.md section 11): Telegram's webhook, or getUpdates long
    # polling by one process of the cluster (needs bot_token), each batch recorded before it is
    # confirmed; the long poll's timeout and batch size are getUpdates' own.
    source: Literal["webhook", "polling"] = "webhook"
    poll_timeout_seconds: int = Field(25, ge=0, le=50)
    poll_limit: int = Field(100, ge=1, le=100)
    # How long an update's body (and its attempts' errors) outlive its delivery (docs/privacy.md):
    # "until_delivered" erases them once it completes, a number of days that many days after;
    # None, as the row itself (retention_seconds). An exhaustion keeps its body until acknowledged.
    body_retention: Literal["until_delivered"] | Annotated[int, Field(ge=1, le=36_500)] | None = (
        None
    )

    @field_validator("downstream_secret_token")
    @classmethod
    def _check_downstream_secret(cls, value: SecretStr | None) -> SecretStr | None:
        return check_secret_token(value)

    @field_validator("signing_secret")
    @classmethod
    def _check_signing_secret(cls, value: SecretStr | None) -> SecretStr | None:
        return check_signing_secret(value)

    @field_validator("allowed_updates")
    @classmethod
    def _check_allowed_updates(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        problem = None if value is None else update_types_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("deadlines")
    @classmethod
    def _merge_deadlines(cls, value: dict[str, float]) -> dict[str, float]:
        for update_type, seconds in value.items():
            if seconds < 0:
                raise ValueError(f"{update_type}: {seconds} is negative (0 turns it off)")
        return {**DEFAULT_DEADLINES, **value}

    @model_validator(mode="after")
    def _polling_has_a_token(self) -> BotOptions:
        if self.source == "polling" and self.bot_token is None:
            raise ValueError("source: polling calls getUpdates with the bot's bot_token; set it")
        return self

    @model_validator(mode="after")
    def _plain_has_no_chat_order(self) -> BotOptions:
        # The base store methods of a plain bot know no chats: only fenced and durable bots
        # keep per-chat order (the claim's NOT EXISTS over the ordering index).
        if self.mode == "plain" and self.ordering == "chat":
            if "ordering" in self.model_fields_set:
                raise ValueError(
                    'ordering "chat" needs mode fenced or durable; a plain bot delivers '
                    'with ordering "none"'
                )
            object.__setattr__(self, "ordering", "none")
        return self

    @property
    def capability(self) -> Capability:
        """The table capability this bot's mode needs (docs/design.md decision 1)."""
        return "base" if self.mode == "plain" else self.mode

    def deadline_ms(self, update_type: str | None) -> int | None:
        """How long after receipt an update of this type is still worth delivering."""
        seconds = self.deadlines.get(update_type or "")
        return int(seconds * 1000) if seconds else None


class BotSettings(BotOptions):
    """One bot: how Telegram reaches it here, and where its updates go."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    name: str
    secret_token: SecretStr

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return validate.bot_name(value)

    @field_validator("secret_token")
    @classmethod
    def _check_secret(cls, value: SecretStr) -> SecretStr | None:
        return check_secret_token(value)

    @property
    def needs(self) -> str:
        """What needs the table's capability, for `store.require`'s refusal."""
        return f"bot {self.name!r} in {self.mode} mode"


def check_signing_secret(value: SecretStr | None) -> SecretStr | None:
    """A Standard Webhooks signing secret: whsec_ and base64 of at least 16 bytes."""
    if value is not None:
        secret = value.get_secret_value().removeprefix("whsec_")
        try:
            key = base64.b64decode(secret, validate=True)
        except binascii.Error:
            key = b""
        if len(key) < 16:
            raise ValueError("must be whsec_ and base64 of at least 16 random bytes")
    return value
