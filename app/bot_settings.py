"""One bot's settings: `BotOptions`, what a bot may set beyond its name and secret (the
environment sets them for the `default` bot, a `[[bots]]` table for each named bot), and
`BotSettings`, a whole bot with its destinations. `app.config.Settings` holds them. The
delivery options a bot sets (`app.destinations.settings.DeliveryOptions`) are its `default`
destination's and its other destinations' defaults.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AnyHttpUrl,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from app.destinations.routing import unreachable
from app.destinations.settings import (
    DEFAULT_DEADLINES,
    DeliveryOptions,
    Destination,
    DestinationSettings,
    Mode,
    check_signing_secret,
    resolve,
)
from app.store import validate
from app.store.types import Ordering
from app.webhook_rules import MAX_CONNECTIONS_LOCAL, check_secret_token, update_types_problem

__all__ = [
    "DEFAULT_DEADLINES",
    "BotOptions",
    "BotSettings",
    "Mode",
    "check_signing_secret",
]


class BotOptions(DeliveryOptions):
    """What a bot may set beyond its name and secret; the environment sets them for the
    `default` bot, a `[[bots]]` table for each named bot."""

    bot_token: SecretStr | None = None
    downstream_url: AnyHttpUrl | None = None
    ordering: Ordering = "chat"
    # What `set-webhook` registers with Telegram (None: none sent). allowed_updates: names
    # of app.queues.QUEUES; max_connections: 1-100, up to 100000 with a local Bot API server
    # (Settings checks it against bot_api_url).
    allowed_updates: tuple[str, ...] | None = None
    max_connections: int | None = Field(None, ge=1, le=MAX_CONNECTIONS_LOCAL)
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

    @field_validator("allowed_updates")
    @classmethod
    def _check_allowed_updates(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        problem = None if value is None else update_types_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

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


class BotSettings(BotOptions):
    """One bot: how Telegram reaches it here, and where its updates go."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    name: str
    secret_token: SecretStr
    # Its [[bots.destinations]] tables; `targets` resolves them with downstream_url's default.
    destinations: tuple[DestinationSettings, ...] = ()
    _targets: tuple[Destination, ...] = PrivateAttr(())

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

    @model_validator(mode="after")
    def _resolve_destinations(self) -> BotSettings:
        token = None if self.bot_token is None else self.bot_token.get_secret_value()
        prefix = (token or "").partition(":")[0]
        bot_id = int(prefix) if prefix.isdigit() else None
        options = self.delivery_options()
        self._targets = resolve(self.name, self.downstream_url, options, self.destinations, bot_id)
        if self.allowed_updates is not None:
            problems = unreachable(self._targets, self.allowed_updates)
            if problems:
                raise ValueError(f"bot {self.name!r}: {'; '.join(problems)}")
        return self

    @property
    def targets(self) -> tuple[Destination, ...]:
        """Every destination of this bot, resolved: `default` first when it has one."""
        return self._targets

    def target(self, name: str) -> Destination | None:
        """This bot's destination `name`, resolved; None when it has none of that name."""
        return next((target for target in self._targets if target.name == name), None)
