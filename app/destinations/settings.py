"""A bot's destinations as configured, and as each delivery goes.

`DeliveryOptions` is how one destination's deliveries go (its secret token and signing secret,
mode, attempts, lease, timeout, concurrency, retries, deadlines, breaker, exhaustion URL). A
bot's own are those of its `default` destination and the defaults of every other one:
`app.bot_settings.BotOptions` extends it. A `[[bots.destinations]]` table
(`DestinationSettings`) names a destination, its URL and filter, and may set any delivery
option by the same name; `Destination` is the result, every option resolved.

A bot with `downstream_url` has destination `default` at that URL, taking every update; a
table named `default` is the same destination with a filter or options of its own, and then
the URL is set once, in one place.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    create_model,
    field_validator,
)
from pydantic.fields import FieldInfo

from app.destinations.filters import FilterError, UpdateFilter
from app.store import validate
from app.store.types import Capability
from app.webhook_rules import check_secret_token
from telegram_intake_kit.wire import DEFAULT_DESTINATION

Mode = Literal["plain", "fenced", "durable"]
DEFAULT = DEFAULT_DESTINATION  # the one at the bot's downstream_url, kept in the update's row
# Past these ages (seconds from receipt) a delivery can no longer help: Telegram has already
# given up on the answer (inline and callback queries) or on the payment step.
DEFAULT_DEADLINES = {
    "inline_query": 30.0,
    "callback_query": 150.0,
    "shipping_query": 10.0,
    "pre_checkout_query": 10.0,
}


class DeliveryOptions(BaseModel):
    """How one destination's deliveries go. A bot's are its `default` destination's and the
    defaults of its other destinations."""

    downstream_secret_token: SecretStr | None = None
    signing_secret: SecretStr | None = None
    exhaustion_url: AnyHttpUrl | None = None
    mode: Mode = "durable"
    max_attempts: int = Field(8, ge=1, le=1000)
    lease_seconds: float = Field(60, gt=0, le=86_400)
    concurrency: int = Field(64, ge=1, le=10_000)  # requests in flight, per process
    forward_timeout_seconds: float = Field(30, gt=0, le=3600)
    retry_base_seconds: float = Field(2, gt=0, le=86_400)
    retry_cap_seconds: float = Field(600, gt=0, le=7 * 86_400)
    retry_after_cap_seconds: float = Field(600, ge=0, le=7 * 86_400)
    # Update type -> seconds from receipt; merged over DEFAULT_DEADLINES, 0 turns one off.
    deadlines: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_DEADLINES))
    breaker_failures: int = Field(5, ge=0, le=10_000)  # consecutive failures; 0: no breaker
    breaker_cooldown_seconds: float = Field(30, gt=0, le=86_400)

    @field_validator("downstream_secret_token")
    @classmethod
    def _check_downstream_secret(cls, value: SecretStr | None) -> SecretStr | None:
        return check_secret_token(value)

    @field_validator("signing_secret")
    @classmethod
    def _check_signing_secret(cls, value: SecretStr | None) -> SecretStr | None:
        return check_signing_secret(value)

    @field_validator("deadlines")
    @classmethod
    def _merge_deadlines(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:  # a destination that keeps its bot's
            return None
        for update_type, seconds in value.items():
            if seconds < 0:
                raise ValueError(f"{update_type}: {seconds} is negative (0 turns it off)")
        return {**DEFAULT_DEADLINES, **value}

    @property
    def capability(self) -> Capability:
        """The table capability this mode needs (docs/design.md decision 1)."""
        return "base" if self.mode == "plain" else self.mode

    def deadline_ms(self, update_type: str | None) -> int | None:
        """How long after receipt an update of this type is still worth delivering."""
        seconds = self.deadlines.get(update_type or "")
        return int(seconds * 1000) if seconds else None

    def delivery_options(self) -> DeliveryOptions:
        """These options alone (a bot's: its default destination's)."""
        return DeliveryOptions.model_validate(
            {name: getattr(self, name) for name in DeliveryOptions.model_fields}
        )


def _unset(field: FieldInfo) -> FieldInfo:
    """`field` with its bounds, defaulting to None: a destination's option left to its bot."""
    return FieldInfo.merge_field_infos(field, default=None, default_factory=None)


# Every delivery option, each None unless the table sets it; the options' own checks apply.
_Overrides: type[DeliveryOptions] = create_model(  # type: ignore[call-overload]
    "_Overrides",
    __base__=DeliveryOptions,
    **{
        name: (cast(Any, field.annotation) | None, _unset(field))
        for name, field in DeliveryOptions.model_fields.items()
    },
)


class DestinationSettings(_Overrides):
    """One `[[bots.destinations]]` table: a name, a URL, a filter (grammY filter queries, any
    of which matches; absent: every update) and `except` (queries that exclude), `ordered`
    (false: no update waits for another of its chat), and any delivery option by its name."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True
    )

    name: str
    url: AnyHttpUrl | None = None  # None: the bot's downstream_url (destination default only)
    filter: tuple[str, ...] | None = None
    except_: tuple[str, ...] = Field((), alias="except")
    ordered: bool = True

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return validate.destination_name(value)

    @field_validator("filter", "except_")
    @classmethod
    def _check_queries(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value:
            raise ValueError("an empty list matches nothing; leave it out for every update")
        for query in value or ():
            try:
                UpdateFilter((query,), bot_id=0)  # `me` is checked once the bot is known
            except FilterError as error:
                raise ValueError(str(error)) from None
        return value

    def overrides(self) -> dict[str, Any]:
        """The delivery options this table sets."""
        return {
            name: getattr(self, name)
            for name in DeliveryOptions.model_fields
            if name in self.model_fields_set
        }


@dataclass(frozen=True)
class Destination:
    """One destination of a bot, every option resolved: where its deliveries go and how."""

    name: str
    url: AnyHttpUrl
    filter: UpdateFilter
    ordered: bool
    options: DeliveryOptions
    configured: bool = True  # False: `default` made from downstream_url, not from a table

    @property
    def default(self) -> bool:
        """Whether its deliveries are the update rows' own (docs/design.md decision 7)."""
        return self.name == DEFAULT


def resolve(
    bot: str,
    downstream_url: AnyHttpUrl | None,
    options: DeliveryOptions,
    tables: tuple[DestinationSettings, ...],
    bot_id: int | None,
) -> tuple[Destination, ...]:
    """A bot's destinations from its `downstream_url`, its own delivery `options` and its
    `[[bots.destinations]]` tables; ValueError naming the table at fault. `bot_id`: the bot's
    own id (its token's prefix), for filter queries that name it (`me`)."""
    names = [table.name for table in tables]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"bot {bot!r}: destinations {twice} are named more than once")
    found = []
    if downstream_url is not None and DEFAULT not in names:
        found.append(Destination(DEFAULT, downstream_url, UpdateFilter(), True, options, False))
    for index, table in enumerate(tables):
        where = f"bot {bot!r}, destinations.{index} ({table.name!r})"
        url = table.url
        if table.name == DEFAULT and downstream_url is not None:
            if url is not None:
                raise ValueError(f"{where}: set its url here or as downstream_url, not both")
            url = downstream_url
        if url is None:
            raise ValueError(f"{where}: url is required")
        given = table.overrides()
        if "deadlines" in given:  # merged over the bot's, as the bot's over the defaults
            given["deadlines"] = {**options.deadlines, **given["deadlines"]}
        try:
            merged = DeliveryOptions.model_validate(
                {**options.delivery_options().model_dump(), **given}
            )
            chosen = UpdateFilter(table.filter or (), table.except_, bot_id)
        except (ValidationError, FilterError) as error:
            raise ValueError(f"{where}: {error}") from None
        if merged.mode == "plain" and table.name != DEFAULT:
            raise ValueError(
                f"{where}: mode plain is for a table below revision 0002, and a destination "
                "beside default needs revision 0010: use fenced or durable"
            )
        found.append(Destination(table.name, url, chosen, table.ordered, merged))
    return tuple(found)


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
